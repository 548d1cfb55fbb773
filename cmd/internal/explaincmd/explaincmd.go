// Package explaincmd is the explain command of kproxy (`kproxy explain`,
// on a node or with its configuration) and of the kubectl plugin (`kubectl
// kproxy explain NODE`, from the API server): both parse the same flags,
// complete a node's configuration their own way, then call Run, so a
// question asked either way gets the same answer.
package explaincmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Flags are explain's own flags.
type Flags struct {
	To, From, Node, Output string
	FromNode, FromOutside  bool
	Live                   bool
}

// AddFlags adds explain's flags to fs. withNodeFlags adds --node and --live,
// which only kproxy's own explain has (the plugin takes the node as its
// argument and plans from the API server).
func (f *Flags) AddFlags(fs *pflag.FlagSet, withNodeFlags bool) {
	fs.StringVar(&f.To, "to", "", "destination ADDRESS:PORT[/tcp|udp|sctp] (TCP by default)")
	fs.StringVar(&f.From, "from", "", "the client's address (default: a pod of the node, see above)")
	fs.BoolVar(&f.FromNode, "from-node", false, "the client is the node itself (a host process)")
	fs.BoolVar(&f.FromOutside, "from-outside", false, "the client is routed in from elsewhere (another node, outside the cluster)")
	if withNodeFlags {
		fs.StringVar(&f.Node, "node", "", "the node to explain for (default: --hostname-override, else this host's name)")
		fs.BoolVar(&f.Live, "live", false, "trace what is programmed on this node (iptables-save, nft -j list table, HNS) and report drift from the plan")
	}
	fs.StringVarP(&f.Output, "output", "o", "text", "output format: text or json")
}

// Check validates the flags before any work is done; it returns the
// destination.
func (f Flags) Check() (netip.AddrPort, v1.Protocol, error) {
	if f.Output != "text" && f.Output != "json" {
		return netip.AddrPort{}, "", fmt.Errorf("-o %q: want text or json", f.Output)
	}
	if f.FromNode && f.FromOutside {
		return netip.AddrPort{}, "", errors.New("--from-node and --from-outside exclude each other")
	}
	return ParseTo(f.To)
}

// Reader reads the Services, EndpointSlices and Node of o's node (from the
// API server or from --manifests).
type Reader func(ctx context.Context, o *config.Options) (*proxy.Snapshot, error)

// Run explains f's connection on the node of o, a completed and validated
// configuration whose NodeName is the node asked about; named is how the
// user named that node (`--node "x"`), "" when they did not: an unknown
// node is then a note, not an error. It writes the explanation to stdout.
func Run(ctx context.Context, o *config.Options, f Flags, named string, read Reader, stdout io.Writer) error {
	to, proto, err := f.Check()
	if err != nil {
		return err
	}
	mode := string(o.ProxyMode())
	newTracer := modes()[mode]
	if newTracer == nil {
		return fmt.Errorf("proxy mode %q cannot be explained (iptables, nftables and kernelspace can)", mode)
	}
	snap, err := read(ctx, o)
	if err != nil {
		return fmt.Errorf("reading Services and EndpointSlices: %w", err)
	}
	q := explain.Query{To: to, Protocol: proto, Origin: explain.FromPod}
	switch {
	case f.FromNode:
		q.Origin = explain.FromNode
	case f.FromOutside:
		q.Origin = explain.FromOutside
	}
	fam := q.Family()
	tr, err := newTracer(ctx, o, snap, fam, f.Live)
	if err != nil {
		return err
	}
	q.NodeAddrs = tr.nodeAddrs
	var notes []string
	if !snap.Node.Known {
		if named != "" {
			return fmt.Errorf("%s: no Node of that name in the cluster (or in --manifests)", named)
		}
		notes = append(notes, fmt.Sprintf("no Node named %q was found: its addresses, pod CIDR and zone are unknown (--node names another)", o.NodeName))
	}
	from, note, err := Source(f.From, q, snap, o.ClusterCIDRs())
	if err != nil {
		return err
	}
	q.From = from
	if note != "" {
		notes = append(notes, note)
	}
	res, err := explain.Explain(mode, f.Live, tr.view, q, tr.tracer)
	if err != nil {
		return err
	}
	res.Notes = append(res.Notes, notes...)
	if f.Output == "json" {
		return explain.WriteJSON(stdout, res)
	}
	return explain.WriteText(stdout, res)
}

// ParseTo reads ADDRESS:PORT[/proto].
func ParseTo(s string) (netip.AddrPort, v1.Protocol, error) {
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
	OutsideClient4  = netip.MustParseAddr("203.0.113.10")
	OutsideClient6  = netip.MustParseAddr("2001:db8::10")
	podPlaceholder4 = netip.MustParseAddr("10.244.0.2")
	podPlaceholder6 = netip.MustParseAddr("fd00:10:244::2")
)

// Source returns the client address: from (--from), else the node's own
// address (from the node; loopback for a loopback destination), else an
// address of the node's pod CIDR or of the cluster CIDR (from a pod), else
// a documented default; the note says what was assumed.
func Source(from string, q explain.Query, snap *proxy.Snapshot, clusterCIDRs []netip.Prefix) (netip.Addr, string, error) {
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
		return OutsideClient6, "", nil
	}
	return OutsideClient4, "", nil
}
