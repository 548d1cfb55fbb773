// Package compare is the kproxy half of the winkernel oracle (test/winkernel):
// the scenarios fed to both proxies, kproxy's Windows backend run on its
// fake HNS, the normal form both proxies' HNS objects are compared in, and
// the list of intended differences, each with its reason (the same list is
// in docs/compatibility.md, "Windows: upstream's winkernel proxier as the
// oracle"). The upstream half, which needs upstream's package internals,
// is test/winkernel/upstream/oracle_test.go.
//
// The package is plain Go: it builds and is tested on Linux too, where the
// kproxy half runs alone (compare_test.go).
package compare

import (
	"fmt"
	"net/netip"
	"sort"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

// Node names and HNS facts both proxies are given.
const (
	// NetworkName is the HNS network (upstream's tests' name).
	NetworkName = "TestNetwork"
	// HostMAC is the host's MAC (upstream's testHostMacProvider gives one
	// MAC whatever the address).
	HostMAC = "00-11-22-33-44-55"
	// RootEndpoint is the root HNS endpoint forwarded health checks go to.
	RootEndpoint = "cbr0"
	// HealthzPort is the proxy's health port.
	HealthzPort = 10256
)

// Variant is one node setup: the network type, the family, DSR, health
// check forwarding and the HNS version's features.
type Variant struct {
	Name    string
	Overlay bool
	Family  v1.IPFamily
	DSR     bool
	// HealthCheck: forwardHealthCheckVip, with a root endpoint named
	// RootEndpoint on the node's pod gateway address.
	HealthCheck bool
	// OldHNS: an HNS before 12.0 (no session affinity); otherwise 15.5.
	OldHNS bool
}

// Variants are the node setups every object set is tried on.
func Variants() []Variant {
	return []Variant{
		{Name: "l2bridge", Family: v1.IPv4Protocol, HealthCheck: true},
		{Name: "l2bridge-dsr", Family: v1.IPv4Protocol, DSR: true, HealthCheck: true},
		{Name: "overlay", Overlay: true, Family: v1.IPv4Protocol, HealthCheck: true},
		{Name: "overlay-dsr", Overlay: true, Family: v1.IPv4Protocol, DSR: true},
		{Name: "l2bridge-ipv6-dsr", Family: v1.IPv6Protocol, DSR: true, HealthCheck: true},
		{Name: "l2bridge-hns11", Family: v1.IPv4Protocol, OldHNS: true},
		{Name: "overlay-hns11", Overlay: true, Family: v1.IPv4Protocol, OldHNS: true, HealthCheck: true},
	}
}

// Step is the whole desired state after one step of a scenario.
type Step struct {
	Name     string
	Nodes    []*v1.Node
	Services []*v1.Service
	Slices   []*discovery.EndpointSlice
}

// Scenario is a variant and the steps fed to both proxies, one sync each.
type Scenario struct {
	Name string
	Variant
	Topology *proxytest.Topology
	Steps    []Step
}

// Facts are the node facts of a scenario, the same for both proxies.
type Facts struct {
	NodeName  string
	NodeIP    netip.Addr
	SourceVIP netip.Addr // overlay only
	// RemoteSubnets are the other nodes' pod CIDRs and addresses (overlay).
	RemoteSubnets []RemoteSubnet
	// Local are the CNI's endpoints on the node: name → address.
	Local map[string]netip.Addr
}

// RemoteSubnet is a route of the overlay network to another node.
type RemoteSubnet struct {
	Prefix          netip.Prefix
	ProviderAddress netip.Addr
}

// Facts returns the node facts of step i of s.
func (s *Scenario) Facts(i int) Facts {
	t := s.Topology
	node, _ := t.Node(t.ProxyNode)
	f := Facts{NodeName: t.ProxyNode, NodeIP: node.Addr(s.Family), Local: map[string]netip.Addr{}}
	if s.Overlay {
		// The source VIP: an address of the node's pod CIDR no pod uses.
		f.SourceVIP = offset(node.PodCIDR(s.Family), 250)
		for _, n := range s.Steps[i].Nodes {
			if n.Name == t.ProxyNode {
				continue
			}
			pa, cidr := nodeFacts(n, s.Family)
			if pa.IsValid() && cidr.IsValid() {
				f.RemoteSubnets = append(f.RemoteSubnets, RemoteSubnet{Prefix: cidr, ProviderAddress: pa})
			}
		}
		sort.Slice(f.RemoteSubnets, func(a, b int) bool { return f.RemoteSubnets[a].Prefix.String() < f.RemoteSubnets[b].Prefix.String() })
	}
	for _, p := range t.PodsOn(t.ProxyNode) {
		f.Local[p.Name] = p.Addr(s.Family)
	}
	if s.HealthCheck {
		f.Local[RootEndpoint] = node.Gateway(s.Family)
	}
	return f
}

// nodeFacts reads a Node object's address and pod CIDR of a family.
func nodeFacts(n *v1.Node, fam v1.IPFamily) (netip.Addr, netip.Prefix) {
	var addr netip.Addr
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is6() == (fam == v1.IPv6Protocol) && a.Type == v1.NodeInternalIP {
			addr = ip
			break
		}
	}
	var cidr netip.Prefix
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is6() == (fam == v1.IPv6Protocol) {
			cidr = p
		}
	}
	return addr, cidr
}

func offset(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// Scenarios are every object set on every variant: the objects of each
// configuration of the shared behaviour table (test/proxytest), the cases
// issue 24 names (preserve-destination, an externalTrafficPolicy Local
// LoadBalancer, 60 s affinity, Local externalIPs), and multi-step churn
// (endpoints moving between nodes, a Service changing type, a node added).
func Scenarios() ([]Scenario, error) {
	tb, err := proxytest.New()
	if err != nil {
		return nil, err
	}
	t := tb.Topology
	var sets []Scenario
	for _, c := range tb.Configs() {
		nodes, svcs, slices := tb.Objects(c)
		sets = append(sets, Scenario{Name: "table-" + c.String(), Topology: t, Steps: []Step{{Name: "all", Nodes: nodes, Services: svcs, Slices: slices}}})
	}
	extra, err := issueCases(t)
	if err != nil {
		return nil, err
	}
	sets = append(sets, extra)
	churn, err := churnCases(t)
	if err != nil {
		return nil, err
	}
	sets = append(sets, churn...)
	var out []Scenario
	for _, v := range Variants() {
		for _, s := range sets {
			s.Variant = v
			s.Name = v.Name + "/" + s.Name
			out = append(out, s)
		}
	}
	return out, nil
}

// caseBuilder makes Services of the topology with their slices.
type caseBuilder struct {
	t      *proxytest.Topology
	svcs   []*v1.Service
	slices []*discovery.EndpointSlice
	err    error
}

func (b *caseBuilder) add(name string, index int, eps []proxytest.EP, opts ...proxytest.ServiceOption) *v1.Service {
	svc := b.t.Service(name, index, opts...)
	sl, err := b.t.Slices(svc, eps...)
	if err != nil && b.err == nil {
		b.err = err
	}
	b.svcs = append(b.svcs, svc)
	b.slices = append(b.slices, sl...)
	return svc
}

// withAnnotation sets a Service annotation.
func withAnnotation(k, v string) proxytest.ServiceOption {
	return func(_ *proxytest.Topology, svc *v1.Service, _ int) {
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[k] = v
	}
}

// withHealthCheckNodePort gives a Local LoadBalancer Service its
// healthCheckNodePort, as the API server does.
func withHealthCheckNodePort(port int32) proxytest.ServiceOption {
	return func(_ *proxytest.Topology, svc *v1.Service, _ int) { svc.Spec.HealthCheckNodePort = port }
}

func issueCases(t *proxytest.Topology) (Scenario, error) {
	b := &caseBuilder{t: t}
	local, remote := proxytest.PodA1, proxytest.PodB1
	b.add("preserve-destination", 101, proxytest.Ready(local, remote), proxytest.WithLoadBalancer(), withAnnotation("preserve-destination", "true"))
	b.add("etp-local-lb", 102, proxytest.Ready(local, remote), proxytest.WithLoadBalancer(), proxytest.WithExternalLocal(), withHealthCheckNodePort(32102))
	b.add("etp-local-lb-no-local", 103, proxytest.Ready(remote), proxytest.WithLoadBalancer(), proxytest.WithExternalLocal(), withHealthCheckNodePort(32103))
	b.add("affinity-60s", 104, proxytest.Ready(local, remote, proxytest.PodB2), proxytest.WithNodePort(), proxytest.WithAffinity(60))
	b.add("etp-local-externalips", 105, proxytest.Ready(local, remote), proxytest.WithExternalIPs(), proxytest.WithExternalLocal())
	b.add("lb-cluster", 106, proxytest.Ready(local, remote), proxytest.WithLoadBalancer(), proxytest.WithExternalIPs())
	return Scenario{Name: "issue-24-cases", Topology: t, Steps: []Step{{Name: "all", Nodes: t.NodeObjects(), Services: b.svcs, Slices: b.slices}}}, b.err
}

func churnCases(t *proxytest.Topology) ([]Scenario, error) {
	local, remote := proxytest.PodA1, proxytest.PodB1
	step := func(name string, nodes []*v1.Node, build func(b *caseBuilder)) (Step, error) {
		b := &caseBuilder{t: t}
		build(b)
		return Step{Name: name, Nodes: nodes, Services: b.svcs, Slices: b.slices}, b.err
	}
	nodes := t.NodeObjects()
	var errs []error
	must := func(s Step, err error) Step {
		errs = append(errs, err)
		return s
	}

	// Endpoints moving between nodes: the Service's pods go from this
	// node to the other and back, one at a time.
	moving := Scenario{Name: "churn-endpoints-move", Topology: t}
	for _, set := range [][]string{{local, proxytest.PodA2}, {local, remote}, {remote, proxytest.PodB2}, {proxytest.PodA2, proxytest.PodB3}} {
		set := set
		moving.Steps = append(moving.Steps, must(step(fmt.Sprint(set), nodes, func(b *caseBuilder) {
			b.add("mover", 201, proxytest.Ready(set...), proxytest.WithNodePort())
		})))
	}

	// A Service changing type: ClusterIP → NodePort → LoadBalancer
	// (Local, then Cluster) → back to ClusterIP.
	typed := Scenario{Name: "churn-service-type", Topology: t}
	for _, st := range []struct {
		name string
		opts []proxytest.ServiceOption
	}{
		{"clusterip", nil},
		{"nodeport", []proxytest.ServiceOption{proxytest.WithNodePort()}},
		{"loadbalancer-local", []proxytest.ServiceOption{proxytest.WithLoadBalancer(), proxytest.WithExternalLocal(), withHealthCheckNodePort(32202)}},
		{"loadbalancer", []proxytest.ServiceOption{proxytest.WithLoadBalancer()}},
		{"clusterip-again", nil},
	} {
		st := st
		typed.Steps = append(typed.Steps, must(step(st.name, nodes, func(b *caseBuilder) {
			b.add("shifter", 202, proxytest.Ready(local, remote), st.opts...)
		})))
	}

	// A node added: node3 joins (its route appears on overlay), then a pod
	// on it becomes an endpoint.
	added := Scenario{Name: "churn-node-added", Topology: t}
	node3 := nodeObject("node3", "192.168.50.3", "fd00:50::3", "10.244.3.0/24", "fd00:10:244:3::/64")
	withNode3 := append(append([]*v1.Node(nil), nodes...), node3)
	base := func(b *caseBuilder) { b.add("grower", 203, proxytest.Ready(local, remote), proxytest.WithNodePort()) }
	added.Steps = append(added.Steps,
		must(step("two nodes", nodes, base)),
		must(step("node3 joins", withNode3, base)),
		must(step("a pod on node3", withNode3, func(b *caseBuilder) {
			svc := b.t.Service("grower", 203, proxytest.WithNodePort())
			sl, err := b.t.Slices(svc, proxytest.Ready(local, remote)...)
			if err != nil {
				b.err = err
				return
			}
			for _, s := range sl {
				fam := v1.IPv4Protocol
				addr := "10.244.3.10"
				if s.AddressType == discovery.AddressTypeIPv6 {
					fam, addr = v1.IPv6Protocol, "fd00:10:244:3::a"
				}
				_ = fam
				ready, name := true, "node3"
				s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{addr}, NodeName: &name,
					Conditions: discovery.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: new(bool)}})
			}
			b.svcs = append(b.svcs, svc)
			b.slices = append(b.slices, sl...)
		})),
	)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return []Scenario{moving, typed, added}, nil
}

// nodeObject is a Node with its addresses and pod CIDRs.
func nodeObject(name, ip4, ip6, cidr4, cidr6 string) *v1.Node {
	return &v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NodeSpec{PodCIDR: cidr4, PodCIDRs: []string{cidr4, cidr6}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: ip4}, {Type: v1.NodeInternalIP, Address: ip6},
		}},
	}
}
