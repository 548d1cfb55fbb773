package windows

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Hand-made snapshots: the endpoint lists are filled the way the cache fills
// them (cluster endpoints only when cluster traffic uses them, local
// endpoints only when node-local traffic does).

type portOpt func(*proxy.ServicePort)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func svcPort(name string, proto v1.Protocol, clusterIP string, port int32, opts ...portOpt) *proxy.ServicePort {
	p := &proxy.ServicePort{
		Name:      proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p", Protocol: proto},
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: mustAddr(clusterIP),
		Port:      port,
		Protocol:  proto,
	}
	p.Family = v1.IPv4Protocol
	if p.ClusterIP.Is6() {
		p.Family = v1.IPv6Protocol
	}
	var eps []proxy.Endpoint
	for _, o := range opts {
		o(p)
	}
	eps = p.ClusterEndpoints // collected by eps()
	p.ClusterEndpoints, p.LocalEndpoints = nil, nil
	proxy.SortEndpoints(eps)
	var local []proxy.Endpoint
	for _, e := range eps {
		if e.Local {
			local = append(local, e)
		}
	}
	p.HasAnyEndpoints = len(eps) > 0
	if p.UsesClusterEndpoints() && len(eps) > 0 {
		p.ClusterEndpoints = eps
	}
	if p.UsesLocalEndpoints() && len(local) > 0 {
		p.LocalEndpoints = local
	}
	return p
}

// eps adds endpoints "ip:port" (remote) or "ip:port:local".
func eps(list ...proxy.Endpoint) portOpt {
	return func(p *proxy.ServicePort) { p.ClusterEndpoints = append(p.ClusterEndpoints, list...) }
}

func remoteEP(ip string, port int32) proxy.Endpoint {
	return proxy.Endpoint{IP: mustAddr(ip), Port: port, Ready: true, Serving: true, NodeName: "other"}
}

func localEP(ip string, port int32) proxy.Endpoint {
	return proxy.Endpoint{IP: mustAddr(ip), Port: port, Ready: true, Serving: true, NodeName: "node1", Local: true}
}

func named(ns, name, port string) portOpt {
	return func(p *proxy.ServicePort) {
		p.Name.Namespace, p.Name.Name, p.Name.Port = ns, name, port
	}
}

func nodePort(n int32) portOpt {
	return func(p *proxy.ServicePort) { p.Type = v1.ServiceTypeNodePort; p.NodePort = n }
}

func externalIPs(ips ...string) portOpt {
	return func(p *proxy.ServicePort) {
		for _, s := range ips {
			p.ExternalIPs = append(p.ExternalIPs, mustAddr(s))
		}
	}
}

func lbIPs(ips ...string) portOpt {
	return func(p *proxy.ServicePort) {
		p.Type = v1.ServiceTypeLoadBalancer
		for _, s := range ips {
			p.LoadBalancerIPs = append(p.LoadBalancerIPs, mustAddr(s))
		}
	}
}

func healthCheckNodePort(n int32) portOpt {
	return func(p *proxy.ServicePort) { p.HealthCheckNodePort = n }
}

func affinity(seconds int32) portOpt {
	return func(p *proxy.ServicePort) { p.AffinityTimeoutSeconds = seconds }
}

func preserveDestination() portOpt {
	return func(p *proxy.ServicePort) { p.PreserveDestination = true }
}

func externalLocal() portOpt {
	return func(p *proxy.ServicePort) { p.ExternalPolicyLocal = true }
}

func internalLocal() portOpt {
	return func(p *proxy.ServicePort) { p.InternalPolicyLocal = true }
}

func sourceRanges(cidrs ...string) portOpt {
	return func(p *proxy.ServicePort) {
		for _, c := range cidrs {
			p.LoadBalancerSourceRanges = append(p.LoadBalancerSourceRanges, netip.MustParsePrefix(c))
		}
	}
}

// snap builds a snapshot for node1 with these addresses and ports.
func snap(addrs []string, ports ...*proxy.ServicePort) *proxy.Snapshot {
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
		s.Node.Addresses = append(s.Node.Addresses, mustAddr(a))
	}
	return s
}

// Network facts used across tests: node1 is 10.0.0.1 with pods in
// 10.244.1.0/24; node2 (10.0.0.2) holds 10.244.2.0/24; node3 (10.0.0.3)
// holds 10.244.3.0/24.
var (
	l2bridge = Network{Name: "cbr0", Type: NetworkTypeL2Bridge}
	overlay  = Network{Name: "vxlan0", Type: NetworkTypeOverlay, RemoteSubnets: []RemoteSubnet{
		{DestinationPrefix: "10.244.2.0/24", ProviderAddress: "10.0.0.2", IsolationID: 4096},
		{DestinationPrefix: "10.244.3.0/24", ProviderAddress: "10.0.0.3", IsolationID: 4096},
	}}
	hnsModern = Version{Major: 15, Minor: 5}
)

func mustEqual(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n--- got\n%s--- want\n%s", what, got, want)
	}
}
