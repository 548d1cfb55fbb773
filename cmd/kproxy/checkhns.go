package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/check"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// checkHNSCommand is the subcommand that checks, on a Windows node, that HNS
// returns what kproxy sends, and that Service traffic from the host gets
// through (docs/windows.md).
const checkHNSCommand = "check-hns"

const checkHNSUsage = `Usage: kproxy check-hns [--network-name NAME] [--fake exact|drop|drop-all] [--traffic ...] [flags]

On a Windows node, creates a set of test Services' HNS objects the way
kproxy does, reads them back and reports any field HNS did not return as
sent, then removes them. With --traffic, it then connects from the host to
the Service frontends named by --traffic-cluster-ip, --traffic-node-port
and --traffic-dns (programmed by kproxy running on the node) and prints a
verdict per path (docs/windows.md, "Canary"). Exit 0 when HNS returned
every field, a resync would change nothing and every path tried got
through; 1 otherwise; 2 for a usage error.

`

// runCheckHNS runs `kproxy check-hns` and returns the exit code (see
// checkHNSUsage). getenv reads KUBE_NETWORK, KPROXY_IPAM_DATA_DIR and
// KPROXY_CNI_CONF_DIR.
func runCheckHNS(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kproxy "+checkHNSCommand, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	network := fs.String("network-name", "", "HNS network (default: $KUBE_NETWORK, else the one the CNI configuration names, else the only L2Bridge or Overlay network)")
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
	traffic := fs.Bool("traffic", false, "after the object check, connect from the host through the --traffic-* Service frontends and print a verdict per path")
	trafficOnly := fs.Bool("traffic-only", false, "only the traffic check (implies --traffic; changes nothing on the node)")
	var tClusterIP, tNodePort, tDNS string
	fs.StringVar(&tClusterIP, "traffic-cluster-ip", "", "a ClusterIP Service to connect to over TCP, ADDRESS:PORT (e.g. the kubernetes Service, 10.96.0.1:443)")
	fs.StringVar(&tNodePort, "traffic-node-port", "", "a NodePort to connect to over TCP, NODE-ADDRESS:PORT (this node's address)")
	fs.StringVar(&tDNS, "traffic-dns", "", "the cluster DNS Service to query over UDP, ADDRESS:PORT (e.g. 10.96.0.10:53)")
	dnsName := fs.String("traffic-dns-name", "kubernetes.default.svc.cluster.local", "the name asked of --traffic-dns (any answer counts: the path works)")
	attempts := fs.Int("traffic-attempts", 3, "connections per path, each from a new source port")
	timeout := fs.Duration("traffic-timeout", 3*time.Second, "how long each connection may take")
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
	usage := func(format string, a ...any) int {
		_, _ = fmt.Fprintf(stderr, "kproxy %s: "+format+"\n", append([]any{checkHNSCommand}, a...)...)
		return 2
	}

	var to check.TrafficOptions
	for _, a := range []struct {
		flag, v string
		to      *netip.AddrPort
	}{{"traffic-cluster-ip", tClusterIP, &to.ClusterIP}, {"traffic-node-port", tNodePort, &to.NodePort}, {"traffic-dns", tDNS, &to.DNS}} {
		if a.v == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(a.v)
		if err != nil {
			return usage("--%s: %v", a.flag, err)
		}
		*a.to = ap
	}
	to.DNSName, to.Attempts, to.Timeout = *dnsName, *attempts, *timeout
	if *trafficOnly {
		*traffic = true
	}
	if *traffic && !to.ClusterIP.IsValid() && !to.NodePort.IsValid() && !to.DNS.IsValid() {
		return usage("--traffic needs at least one of --traffic-cluster-ip, --traffic-node-port, --traffic-dns")
	}

	code := 0
	if !*trafficOnly {
		o, rc := checkHNSOptions(*fake, *network, getenv, stderr)
		if rc != 0 {
			return rc
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
				return usage("--%s: %v", a.flag, err)
			}
			*a.to = ip
		}
		if podCIDR != "" {
			p, err := netip.ParsePrefix(podCIDR)
			if err != nil {
				return usage("--pod-cidr: %v", err)
			}
			o.PodCIDRs = []netip.Prefix{p}
		}
		res, err := check.Run(ctx, o)
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
			code = 1
		}
	}
	if *traffic {
		if !*trafficOnly {
			_, _ = io.WriteString(stdout, "\n")
		}
		res := check.Traffic(ctx, to)
		if err := res.Write(stdout); err != nil {
			_, _ = fmt.Fprintf(stderr, "kproxy %s: %v\n", checkHNSCommand, err)
			return 1
		}
		if !res.OK() {
			code = 1
		}
	}
	return code
}

// checkHNSOptions are the object check's options for the host's HNS, or
// for the fake one --fake names; rc is non-zero when the check cannot run.
func checkHNSOptions(fake, network string, getenv func(string) string, stderr io.Writer) (o check.Options, rc int) {
	switch fake {
	case "":
		h, err := hns.NewHNS()
		if errors.Is(err, hns.ErrUnsupportedPlatform) {
			_, _ = fmt.Fprintf(stderr, "kproxy %s needs Windows (HNS); --fake=exact or --fake=drop runs it against kproxy's in-memory fake\n", checkHNSCommand)
			return o, 1
		}
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "kproxy %s: %v\n", checkHNSCommand, err)
			return o, 1
		}
		o.HNS = h
		o.NetworkName = network
		if o.NetworkName == "" {
			o.NetworkName = getenv(windows.EnvNetworkName)
		}
		o.CNIConfig = cniConfigReader(getenv)
		o.IPAMDataDir = getenv(envIPAMDataDir)
		o.ReserveSourceVIP = windows.ReserveInIPAMStore()
		o.ReservedSourceVIP = windows.FindInIPAMStore()
	case "exact":
		_, o = check.FakeNode(0)
	case "drop":
		_, o = check.FakeNode(hns.FieldsUnechoed)
	case "drop-all":
		_, o = check.FakeNode(hns.FieldsAll)
	default:
		_, _ = fmt.Fprintf(stderr, "kproxy %s: --fake=%q: want exact, drop or drop-all\n", checkHNSCommand, fake)
		return o, 2
	}
	return o, 0
}
