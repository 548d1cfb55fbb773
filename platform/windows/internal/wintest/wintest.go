// Package wintest holds the hand-made snapshots and network facts the
// Windows backend's tests share (platform/windows and its subpackages). It
// is imported by tests only.
package wintest

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// Hand-made snapshots: the endpoint lists are filled the way the cache fills
// them (cluster endpoints only when cluster traffic uses them, local
// endpoints only when node-local traffic does).

type PortOpt func(*proxy.ServicePort)

func MustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func SvcPort(name string, proto v1.Protocol, clusterIP string, port int32, opts ...PortOpt) *proxy.ServicePort {
	p := &proxy.ServicePort{
		Name:      proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p", Protocol: proto},
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: MustAddr(clusterIP),
		Port:      port,
		Protocol:  proto,
	}
	p.Family = v1.IPv4Protocol
	if p.ClusterIP.Is6() {
		p.Family = v1.IPv6Protocol
	}
	var all []proxy.Endpoint
	for _, o := range opts {
		o(p)
	}
	all = p.ClusterEndpoints // collected by Eps()
	p.ClusterEndpoints, p.LocalEndpoints = nil, nil
	proxy.SortEndpoints(all)
	var local []proxy.Endpoint
	for _, e := range all {
		if e.Local {
			local = append(local, e)
		}
	}
	p.HasAnyEndpoints = len(all) > 0
	if p.UsesClusterEndpoints() && len(all) > 0 {
		p.ClusterEndpoints = all
	}
	if p.UsesLocalEndpoints() && len(local) > 0 {
		p.LocalEndpoints = local
	}
	return p
}

// Eps adds endpoints "ip:port" (remote) or "ip:port:local".
func Eps(list ...proxy.Endpoint) PortOpt {
	return func(p *proxy.ServicePort) { p.ClusterEndpoints = append(p.ClusterEndpoints, list...) }
}

func RemoteEP(ip string, port int32) proxy.Endpoint {
	return proxy.Endpoint{IP: MustAddr(ip), Port: port, Ready: true, Serving: true, Where: proxy.At("other", "")}
}

func LocalEP(ip string, port int32) proxy.Endpoint {
	return proxy.Endpoint{IP: MustAddr(ip), Port: port, Ready: true, Serving: true, Where: proxy.At("node1", ""), Local: true}
}

func Named(ns, name, port string) PortOpt {
	return func(p *proxy.ServicePort) {
		p.Name.Namespace, p.Name.Name, p.Name.Port = ns, name, port
	}
}

func NodePort(n int32) PortOpt {
	return func(p *proxy.ServicePort) { p.Type = v1.ServiceTypeNodePort; p.NodePort = n }
}

func ExternalIPs(ips ...string) PortOpt {
	return func(p *proxy.ServicePort) {
		for _, s := range ips {
			p.ExternalIPs = append(p.ExternalIPs, MustAddr(s))
		}
	}
}

func LBIPs(ips ...string) PortOpt {
	return func(p *proxy.ServicePort) {
		p.Type = v1.ServiceTypeLoadBalancer
		for _, s := range ips {
			p.LoadBalancerIPs = append(p.LoadBalancerIPs, MustAddr(s))
		}
	}
}

func HealthCheckNodePort(n int32) PortOpt {
	return func(p *proxy.ServicePort) { p.HealthCheckNodePort = n }
}

func Affinity(seconds int32) PortOpt {
	return func(p *proxy.ServicePort) { p.AffinityTimeoutSeconds = seconds }
}

func PreserveDestination() PortOpt {
	return func(p *proxy.ServicePort) { p.PreserveDestination = true }
}

func ExternalLocal() PortOpt {
	return func(p *proxy.ServicePort) { p.ExternalPolicyLocal = true }
}

func InternalLocal() PortOpt {
	return func(p *proxy.ServicePort) { p.InternalPolicyLocal = true }
}

func SourceRanges(cidrs ...string) PortOpt {
	return func(p *proxy.ServicePort) {
		for _, c := range cidrs {
			p.LoadBalancerSourceRanges = append(p.LoadBalancerSourceRanges, netip.MustParsePrefix(c))
		}
	}
}

// Snap builds a snapshot for node1 with these addresses and ports.
func Snap(addrs []string, ports ...*proxy.ServicePort) *proxy.Snapshot {
	m4 := make(map[proxy.ServicePortName]*proxy.ServicePort)
	m6 := make(map[proxy.ServicePortName]*proxy.ServicePort)
	for _, p := range ports {
		if p.Family == v1.IPv6Protocol {
			m6[p.Name] = p
		} else {
			m4[p.Name] = p
		}
	}
	s := &proxy.Snapshot{
		Generation: 1,
		Node:       proxy.Node{Name: "node1", Known: true},
		IPv4:       proxy.NewFamilyView(v1.IPv4Protocol, m4),
		IPv6:       proxy.NewFamilyView(v1.IPv6Protocol, m6),
	}
	for _, a := range addrs {
		s.Node.Addresses = append(s.Node.Addresses, MustAddr(a))
	}
	return s
}

// Network facts used across tests: node1 is 10.0.0.1 with pods in
// 10.244.1.0/24; node2 (10.0.0.2) holds 10.244.2.0/24; node3 (10.0.0.3)
// holds 10.244.3.0/24.
var (
	L2Bridge = hns.Network{Name: "cbr0", Type: hns.NetworkTypeL2Bridge}
	Overlay  = hns.Network{Name: "vxlan0", Type: hns.NetworkTypeOverlay, RemoteSubnets: []hns.RemoteSubnet{
		{DestinationPrefix: "10.244.2.0/24", ProviderAddress: "10.0.0.2", IsolationID: 4096},
		{DestinationPrefix: "10.244.3.0/24", ProviderAddress: "10.0.0.3", IsolationID: 4096},
	}}
	HNSModern = hns.Version{Major: 15, Minor: 5}
)

func MustEqual(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n--- got\n%s--- want\n%s", what, got, want)
	}
}

// ScratchDir is a temporary directory removed at the end of the test, best
// effort: under Wine, deleting files fails with "Invalid function", which
// would fail t.TempDir's cleanup.
func ScratchDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kproxy-"+strings.ReplaceAll(t.Name(), "/", "-"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Settings are the intent settings of the kernelspace mode (a copy of
// windows.Settings, which this package cannot import; a test in
// platform/windows keeps the two equal).
var Settings = intent.Settings{PodsAlwaysKnown: true, PreserveDestination: true}

// View returns the full intent view of family f of snap, as the app builds
// it for the kernelspace mode.
func View(snap *proxy.Snapshot, f v1.IPFamily) *intent.View {
	return intent.NewBuilder(f).Build(intent.Input{Config: Settings.Config(f, snap.Node, nil), Ports: snap.Family(f),
		Node: snap.Node, Generation: snap.Generation, Changes: proxy.Changes{Full: true}})
}

// IPv4View is View(snap, IPv4).
func IPv4View(snap *proxy.Snapshot) *intent.View { return View(snap, v1.IPv4Protocol) }
