package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// explainCommand is the subcommand that tells where a connection goes.
const explainCommand = "explain"

// explainFlags are the flags of `kproxy explain` on top of kproxy's own.
type explainFlags struct {
	to, from, node, output string
	fromNode, fromOutside  bool
	live                   bool
}

const explainUsage = `Usage: kproxy explain --to ADDRESS:PORT[/tcp|udp|sctp] [--from ADDRESS] [--from-node|--from-outside]
       [--node NAME] [--live] [-o text|json] [--manifests DIR | --kubeconfig FILE] [--proxy-mode MODE] [kproxy flags]

Tells where a new connection to a Service address goes on one node, and why:
the frontend matched, the verdict (DNAT to endpoints with their chances,
REJECT, DROP, not handled), masquerade and the policies that decided, and the
path through the rules (iptables), chains, maps and elements (nftables) or
HNS load balancers (kernelspace).
Planned (default): from kproxy's own plan, on any OS for any mode.
--live: from the node's iptables or kproxy's nftables table (Linux) or HNS
(Windows), with every drift from the plan.

The client: a pod on the node (default; its address from the node's pod
CIDR, else --cluster-cidr, else a placeholder), the node itself
(--from-node), or a host elsewhere (--from-outside; default client
203.0.113.10 or 2001:db8::10, documentation addresses). --from sets the
address.

Examples (the first needs no root and no cluster):
  kproxy explain --manifests docs/examples --hostname-override node1 --to 10.96.0.30:53/udp
  kproxy explain --manifests docs/examples --hostname-override node1 --from-outside --proxy-mode nftables --to 10.96.0.30:53/udp
  kproxy explain --kubeconfig ~/.kube/config --node NODE --from 10.244.1.7 --to 10.96.0.10:53/udp -o json
  kproxy explain --config /var/lib/kproxy/config.conf --live --to 10.96.0.10:443     (on the node, as root)

Explain's own flags:
`

// runExplain is `kproxy explain`: it returns the exit code.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kproxy explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	own := pflag.NewFlagSet("kproxy explain", pflag.ContinueOnError)
	fs.Usage = func() {
		_, _ = io.WriteString(stdout, explainUsage)
		_, _ = io.WriteString(stdout, own.FlagUsages())
		_, _ = io.WriteString(stdout, "\nkproxy's flags (the node's configuration: --config, --kubeconfig, --manifests, --proxy-mode, --cluster-cidr...):\n")
		_, _ = io.WriteString(stdout, "  see 'kproxy --help'; every one is accepted here.\n")
	}
	o := config.NewOptions()
	o.AddFlags(fs)
	var f explainFlags
	own.StringVar(&f.to, "to", "", "destination ADDRESS:PORT[/tcp|udp|sctp] (TCP by default)")
	own.StringVar(&f.from, "from", "", "the client's address (default: see above)")
	own.BoolVar(&f.fromNode, "from-node", false, "the client is the node itself (a host process)")
	own.BoolVar(&f.fromOutside, "from-outside", false, "the client is routed in from elsewhere (another node, outside the cluster)")
	own.StringVar(&f.node, "node", "", "the node to explain for (default: --hostname-override, else this host's name)")
	own.BoolVar(&f.live, "live", false, "trace what is programmed on this node (iptables-save, nft -j list table, HNS) and report drift from the plan")
	own.StringVarP(&f.output, "output", "o", "text", "output format: text or json")
	fs.AddFlagSet(own)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		flagError(stderr, "kproxy explain", fs, err)
		return 1 // as kproxy's own flag errors (and upstream's)
	}
	if err := explainMain(ctx, fs, o, f, stdout); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy explain: %v\n", err)
		return 1
	}
	return 0
}

func explainMain(ctx context.Context, fs *pflag.FlagSet, o *config.Options, f explainFlags, stdout io.Writer) error {
	if f.output != "text" && f.output != "json" {
		return fmt.Errorf("-o %q: want text or json", f.output)
	}
	if f.fromNode && f.fromOutside {
		return errors.New("--from-node and --from-outside exclude each other")
	}
	to, proto, err := parseTo(f.to)
	if err != nil {
		return err
	}
	if err := o.Complete(fs); err != nil {
		return err
	}
	if f.node != "" {
		o.NodeName = strings.ToLower(f.node)
	}
	// A planned explanation changes nothing, like a dry run: every mode is
	// valid on every OS.
	o.DryRun = !f.live
	if err := o.Validate(); err != nil {
		return err
	}
	mode := string(o.ProxyMode())
	newTracer := explainModes()[mode]
	if newTracer == nil {
		return fmt.Errorf("proxy mode %q cannot be explained (iptables, nftables and kernelspace can)", mode)
	}
	snap, err := app.Snapshot(ctx, o)
	if err != nil {
		return fmt.Errorf("reading Services and EndpointSlices: %w", err)
	}
	q := explain.Query{To: to, Protocol: proto, Origin: explain.FromPod}
	switch {
	case f.fromNode:
		q.Origin = explain.FromNode
	case f.fromOutside:
		q.Origin = explain.FromOutside
	}
	fam := q.Family()
	tracer, nodeAddrs, err := newTracer(ctx, o, snap, fam, f.live)
	if err != nil {
		return err
	}
	q.NodeAddrs = nodeAddrs
	var notes []string
	if !snap.Node.Known {
		if f.node != "" {
			return fmt.Errorf("--node %q: no Node of that name in the cluster (or in --manifests)", f.node)
		}
		notes = append(notes, fmt.Sprintf("no Node named %q was found: its addresses, pod CIDR and zone are unknown (--node names another)", o.NodeName))
	}
	from, note, err := explainSource(f.from, q, snap, o.ClusterCIDRs())
	if err != nil {
		return err
	}
	q.From = from
	if note != "" {
		notes = append(notes, note)
	}
	res, err := explain.Explain(mode, f.live, snap, q, tracer)
	if err != nil {
		return err
	}
	res.Notes = append(res.Notes, notes...)
	if f.output == "json" {
		return explain.WriteJSON(stdout, res)
	}
	return explain.WriteText(stdout, res)
}

// parseTo reads ADDRESS:PORT[/proto].
func parseTo(s string) (netip.AddrPort, v1.Protocol, error) {
	if s == "" {
		return netip.AddrPort{}, "", errors.New("--to ADDRESS:PORT is required")
	}
	proto := v1.ProtocolTCP
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		switch strings.ToLower(s[i+1:]) {
		case "tcp":
		case "udp":
			proto = v1.ProtocolUDP
		case "sctp":
			proto = v1.ProtocolSCTP
		default:
			return netip.AddrPort{}, "", fmt.Errorf("--to %q: protocol %q, want tcp, udp or sctp", s, s[i+1:])
		}
		s = s[:i]
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, "", fmt.Errorf("--to: %w", err)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), proto, nil
}

// Default client addresses: documentation addresses (RFC 5737, RFC 3849)
// for a client outside the cluster, and placeholders for a pod when the
// pod CIDR is not known.
var (
	outsideClient4  = netip.MustParseAddr("203.0.113.10")
	outsideClient6  = netip.MustParseAddr("2001:db8::10")
	podPlaceholder4 = netip.MustParseAddr("10.244.0.2")
	podPlaceholder6 = netip.MustParseAddr("fd00:10:244::2")
)

// explainSource returns the client address: --from, else the node's own
// address (from the node; loopback for a loopback destination), else an
// address of the node's pod CIDR or of the cluster CIDR (from a pod), else
// a documented default; the note says what was assumed.
func explainSource(from string, q explain.Query, snap *proxy.Snapshot, clusterCIDRs []netip.Prefix) (netip.Addr, string, error) {
	if from != "" {
		a, err := netip.ParseAddr(from)
		if err != nil {
			return netip.Addr{}, "", fmt.Errorf("--from: %w", err)
		}
		if a.Unmap().Is4() != q.To.Addr().Is4() {
			return netip.Addr{}, "", fmt.Errorf("--from %s and --to %s are of different families", a, q.To)
		}
		return a.Unmap(), "", nil
	}
	v6 := q.To.Addr().Is6()
	switch q.Origin {
	case explain.FromNode:
		if q.To.Addr().IsLoopback() {
			return q.To.Addr(), "", nil
		}
		for _, a := range append(append([]netip.Addr(nil), snap.Node.Addresses...), q.NodeAddrs...) {
			if a.Is6() == v6 && !a.IsLoopback() {
				return a, "", nil
			}
		}
		return netip.Addr{}, "", errors.New("the node has no address of this family: give --from")
	case explain.FromPod:
		for _, p := range snap.Node.PodCIDRs {
			if p.Addr().Is6() == v6 {
				return p.Masked().Addr().Next().Next(), "", nil
			}
		}
		for _, p := range clusterCIDRs {
			if p.Addr().Is6() == v6 {
				return p.Masked().Addr().Next().Next(), "the node's pod CIDR is not known: the client is an address of --cluster-cidr", nil
			}
		}
		a := podPlaceholder4
		if v6 {
			a = podPlaceholder6
		}
		return a, fmt.Sprintf("neither the node's pod CIDR nor --cluster-cidr is known: the client %s is a placeholder, and kproxy "+
			"cannot tell this node's pods from other clients (detect-local has nothing to match), so the plan treats a pod "+
			"like any other client; give --cluster-cidr or --from", a), nil
	}
	if v6 {
		return outsideClient6, "", nil
	}
	return outsideClient4, "", nil
}
