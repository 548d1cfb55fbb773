package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/platform/windows"
)

// envIPAMDataDir overrides the host-local IPAM data directory in which the
// source VIP is reserved (default windows.DefaultIPAMDataDir).
const envIPAMDataDir = "KPROXY_IPAM_DATA_DIR"

// checkHNSCommand is the subcommand that checks, on a Windows node, that HNS
// returns what kproxy sends (docs/windows.md).
const checkHNSCommand = "check-hns"

const checkHNSUsage = `Usage: kproxy check-hns [--network-name NAME] [--fake exact|drop|drop-all] [flags]

On a Windows node, creates a set of test Services' HNS objects the way
kproxy does, reads them back and reports any field HNS did not return as
sent, then removes them (docs/windows.md). Exit 0 when HNS returned every
field and a resync would change nothing, 1 otherwise, 2 for a usage error.

`

// runCheckHNS runs `kproxy check-hns` and returns the exit code: 0 when HNS
// returned every field and a resync would change nothing, 1 otherwise, 2 for
// a usage error. getenv reads KUBE_NETWORK and KPROXY_IPAM_DATA_DIR.
func runCheckHNS(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kproxy "+checkHNSCommand, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	network := fs.String("network-name", "", "HNS network (default: $KUBE_NETWORK, else the only L2Bridge or Overlay network)")
	fake := fs.String("fake", "", `run against kproxy's in-memory fake HNS instead of the host's, on any OS: "exact" (returns every field), "drop" (leaves out the fields nothing shows HNS returns) or "drop-all" (also frontend VIPs, names and MACs)`)
	rootEndpoint := fs.String("root-hnsendpoint-name", windows.DefaultRootHNSEndpointName, "the endpoint the check's forwarded health check goes to (default: when the network has none by that name, the local endpoint the check uses)")
	var nodeIP, nodeIPv6, sourceVIP, clusterIP, externalIP, remoteIP, podCIDR string
	fs.StringVar(&nodeIP, "node-ip", "", "this node's IPv4 address (default: the first one of a host interface)")
	fs.StringVar(&nodeIPv6, "node-ipv6", "", "this node's IPv6 address (default: the first global one of a host interface); with one, IPv6 is checked too")
	fs.StringVar(&sourceVIP, "source-vip", "", "overlay: the source VIP (default: the Calico_ep endpoint's, else kproxy's source VIP endpoint's or reservation, else one reserved in --pod-cidr)")
	fs.StringVar(&podCIDR, "pod-cidr", "", "overlay: this node's pod CIDR, to reserve a source VIP in when kproxy has none on the node yet")
	fs.StringVar(&clusterIP, "cluster-ip", "", "an unused IPv4 address for the check's ClusterIP (default 198.18.0.10)")
	fs.StringVar(&externalIP, "external-ip", "", "an unused address for the check's external IP; the LoadBalancer Service uses the next two (default 198.18.0.11)")
	fs.StringVar(&remoteIP, "remote-ip", "", "an address for the check's remote endpoint (default: in another node's subnet on overlay, else 198.18.1.10)")
	nodePort := fs.Int32("node-port", 32767, "an unused NodePort for the check")
	fs.Usage = func() {
		_, _ = io.WriteString(stdout, checkHNSUsage)
		_, _ = io.WriteString(stdout, fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		flagError(stderr, "kproxy "+checkHNSCommand, fs, err)
		return 2
	}

	var o windows.CheckOptions
	switch *fake {
	case "":
		hns, err := windows.NewHNS()
		if errors.Is(err, windows.ErrUnsupportedPlatform) {
			_, _ = fmt.Fprintf(stderr, "kproxy %s needs Windows (HNS); --fake=exact or --fake=drop runs it against kproxy's in-memory fake\n", checkHNSCommand)
			return 1
		}
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "kproxy %s: %v\n", checkHNSCommand, err)
			return 1
		}
		o.HNS = hns
		o.NetworkName = *network
		if o.NetworkName == "" {
			o.NetworkName = getenv(windows.EnvNetworkName)
		}
		o.ReserveSourceVIP = windows.ReserveInIPAMStore(getenv(envIPAMDataDir))
		o.ReservedSourceVIP = windows.FindInIPAMStore(getenv(envIPAMDataDir))
	case "exact":
		_, o = windows.FakeNode(0)
	case "drop":
		_, o = windows.FakeNode(windows.DropUnechoed)
	case "drop-all":
		_, o = windows.FakeNode(windows.DropAll)
	default:
		_, _ = fmt.Fprintf(stderr, "kproxy %s: --fake=%q: want exact, drop or drop-all\n", checkHNSCommand, *fake)
		return 2
	}
	o.RootHNSEndpointName = *rootEndpoint
	o.NodePort = *nodePort
	for _, a := range []struct {
		flag, v string
		to      *netip.Addr
	}{
		{"node-ip", nodeIP, &o.NodeIP}, {"node-ipv6", nodeIPv6, &o.NodeIPv6}, {"source-vip", sourceVIP, &o.SourceVIP},
		{"cluster-ip", clusterIP, &o.ClusterIP}, {"external-ip", externalIP, &o.ExternalIP}, {"remote-ip", remoteIP, &o.RemoteIP},
	} {
		if a.v == "" {
			continue
		}
		ip, err := netip.ParseAddr(a.v)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "kproxy %s: --%s: %v\n", checkHNSCommand, a.flag, err)
			return 2
		}
		*a.to = ip
	}
	if podCIDR != "" {
		p, err := netip.ParsePrefix(podCIDR)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "kproxy %s: --pod-cidr: %v\n", checkHNSCommand, err)
			return 2
		}
		o.PodCIDRs = []netip.Prefix{p}
	}

	res, err := windows.CheckHNS(ctx, o)
	if res != nil {
		if werr := res.Write(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy %s: %v\n", checkHNSCommand, err)
		return 1
	}
	if !res.OK() {
		return 1
	}
	return 0
}
