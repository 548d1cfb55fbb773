package proxytest

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Role says what a Host is.
type Role string

// Host roles.
const (
	RolePod     Role = "pod"
	RoleNode    Role = "node"
	RoleOutside Role = "outside"
)

// Names of the hosts in the fixed topology. The proxy under test runs on Node1.
const (
	Node1   = "node1"
	Node2   = "node2"
	Outside = "outside"

	// PodA1 and PodA2 run on node1; PodB1, PodB2 and PodB3 on node2. All of
	// them serve the echo protocol on EchoPort and can be endpoints.
	PodA1 = "pod-a1"
	PodA2 = "pod-a2"
	PodB1 = "pod-b1"
	PodB2 = "pod-b2"
	PodB3 = "pod-b3"
	// Client1 (on node1) and Client2 (on node2) are pods that are never
	// endpoints: rows use them as "a pod on node1/node2".
	Client1 = "client-1"
	Client2 = "client-2"
)

// Zones of the two nodes (topology.kubernetes.io/zone).
const (
	Zone1 = "zone-a"
	Zone2 = "zone-b"
)

// EchoPort is the TCP and UDP port every pod's echo server listens on; every
// Service port of the table targets it.
const EchoPort = 8080

// ServicePort is the port number of every Service port in the table.
const ServicePort = 80

// NodePortBase plus a case index is the NodePort of that case's Service.
const NodePortBase = 30000

// Host is one network endpoint of the topology: a pod, a node or the outside client.
type Host struct {
	Name string
	Role Role
	// Node is the node a pod runs on, or the node itself for a node ("" for outside).
	Node string
	// IPv4 and IPv6 are the host's primary addresses: a pod's IP, a node's IP
	// on the node network, the outside client's IP on the node network.
	IPv4, IPv6 netip.Addr
}

// Addr returns the host's address of one family.
func (h Host) Addr(f v1.IPFamily) netip.Addr {
	if f == v1.IPv6Protocol {
		return h.IPv6
	}
	return h.IPv4
}

// Node describes one node of the topology.
type Node struct {
	Host
	Zone string
	// PodCIDR4 and PodCIDR6 are the node's pod ranges.
	PodCIDR4, PodCIDR6 netip.Prefix
	// Gateway4 and Gateway6 are the node's addresses on its pod links: the
	// pods' default gateway. They are node addresses too (a masqueraded
	// packet sent to a local pod carries one of them).
	Gateway4, Gateway6 netip.Addr
}

// PodCIDR returns the node's pod range of one family.
func (n Node) PodCIDR(f v1.IPFamily) netip.Prefix {
	if f == v1.IPv6Protocol {
		return n.PodCIDR6
	}
	return n.PodCIDR4
}

// Gateway returns the node's pod-link address of one family.
func (n Node) Gateway(f v1.IPFamily) netip.Addr {
	if f == v1.IPv6Protocol {
		return n.Gateway6
	}
	return n.Gateway4
}

// Addrs returns every address the node owns in one family (node IP first,
// then the pod gateway). Loopback is not included.
func (n Node) Addrs(f v1.IPFamily) []netip.Addr {
	return []netip.Addr{n.Addr(f), n.Gateway(f)}
}

// Topology is the fixed test network:
//
//	                node network 192.168.50.0/24, fd00:50::/64
//	  ┌──────────────────────┬───────────────────────┬─────────────┐
//	node1 .1 / ::1         node2 .2 / ::2          outside .100 / ::100
//	pods 10.244.1.0/24     pods 10.244.2.0/24
//	     fd00:10:244:1::/64     fd00:10:244:2::/64
//	pod-a1 .10  pod-a2 .11 pod-b1 .10 pod-b2 .11 pod-b3 .12
//	client-1 .100          client-2 .100
//
// Services get ClusterIPs from ServiceCIDR4/6, externalIPs from
// ExternalCIDR4/6 and LoadBalancer ingress IPs from LoadBalancerCIDR4/6; the
// outside client and node2 route those two ranges (and the service range, for
// the cluster-CIDR rows) to node1. Pods route everything to their node; each
// node routes the other node's pod ranges over the node network.
//
// All addresses are private (10/8, 192.168/16, fd00::/8). A Topology is a plain
// value: Default returns a fresh one each time.
type Topology struct {
	// ProxyNode is the node whose proxy the rows exercise (node1).
	ProxyNode   string
	Nodes       []Node
	Pods        []Host
	OutsideHost Host

	NodeNetwork4, NodeNetwork6           netip.Prefix
	ClusterCIDR4, ClusterCIDR6           netip.Prefix
	ServiceCIDR4, ServiceCIDR6           netip.Prefix
	ExternalCIDR4, ExternalCIDR6         netip.Prefix
	LoadBalancerCIDR4, LoadBalancerCIDR6 netip.Prefix
}

// Default returns the fixed topology.
func Default() *Topology {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	t := &Topology{
		ProxyNode: Node1,
		Nodes: []Node{
			{
				Host:     Host{Name: Node1, Role: RoleNode, Node: Node1, IPv4: a("192.168.50.1"), IPv6: a("fd00:50::1")},
				Zone:     Zone1,
				PodCIDR4: p("10.244.1.0/24"), PodCIDR6: p("fd00:10:244:1::/64"),
				Gateway4: a("10.244.1.1"), Gateway6: a("fd00:10:244:1::1"),
			},
			{
				Host:     Host{Name: Node2, Role: RoleNode, Node: Node2, IPv4: a("192.168.50.2"), IPv6: a("fd00:50::2")},
				Zone:     Zone2,
				PodCIDR4: p("10.244.2.0/24"), PodCIDR6: p("fd00:10:244:2::/64"),
				Gateway4: a("10.244.2.1"), Gateway6: a("fd00:10:244:2::1"),
			},
		},
		OutsideHost:       Host{Name: Outside, Role: RoleOutside, IPv4: a("192.168.50.100"), IPv6: a("fd00:50::100")},
		NodeNetwork4:      p("192.168.50.0/24"),
		NodeNetwork6:      p("fd00:50::/64"),
		ClusterCIDR4:      p("10.244.0.0/16"),
		ClusterCIDR6:      p("fd00:10:244::/48"),
		ServiceCIDR4:      p("10.96.0.0/16"),
		ServiceCIDR6:      p("fd00:10:96::/108"),
		ExternalCIDR4:     p("192.168.60.0/24"),
		ExternalCIDR6:     p("fd00:60::/64"),
		LoadBalancerCIDR4: p("192.168.70.0/24"),
		LoadBalancerCIDR6: p("fd00:70::/64"),
	}
	pod := func(name, node string, n int) Host {
		nd, _ := t.Node(node)
		return Host{Name: name, Role: RolePod, Node: node, IPv4: host(nd.PodCIDR4, n), IPv6: host(nd.PodCIDR6, n)}
	}
	t.Pods = []Host{
		pod(PodA1, Node1, 10), pod(PodA2, Node1, 11), pod(Client1, Node1, 100),
		pod(PodB1, Node2, 10), pod(PodB2, Node2, 11), pod(PodB3, Node2, 12), pod(Client2, Node2, 100),
	}
	return t
}

// nth returns the address at offset n inside prefix p (n counts from the
// network address; it must fit in the prefix).
func nth(p netip.Prefix, n uint64) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := len(b) - 1; i >= 0 && n > 0; i-- {
		sum := uint64(b[i]) + n&0xff
		b[i] = byte(sum)
		n = n>>8 + sum>>8
	}
	addr, _ := netip.AddrFromSlice(b)
	return addr
}

// host returns the address with host number n in p. For IPv6 the number is
// written with decimal digits in the last group (host 11 → "::11"), so IPv4
// and IPv6 addresses of one object read alike; n must be below 10000.
func host(p netip.Prefix, n int) netip.Addr {
	if p.Addr().Is4() {
		return nth(p, uint64(n))
	}
	var v uint64
	for _, d := range strconv.Itoa(n) {
		v = v<<4 | uint64(d-'0')
	}
	return nth(p, v)
}

// Node returns a node by name.
func (t *Topology) Node(name string) (Node, bool) {
	for _, n := range t.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// Host returns any host (pod, node or the outside client) by name.
func (t *Topology) Host(name string) (Host, bool) {
	for _, p := range t.Pods {
		if p.Name == name {
			return p, true
		}
	}
	if n, ok := t.Node(name); ok {
		return n.Host, true
	}
	if name == t.OutsideHost.Name {
		return t.OutsideHost, true
	}
	return Host{}, false
}

// Hosts returns every host: nodes, pods, then the outside client.
func (t *Topology) Hosts() []Host {
	var out []Host
	for _, n := range t.Nodes {
		out = append(out, n.Host)
	}
	out = append(out, t.Pods...)
	return append(out, t.OutsideHost)
}

// PodsOn returns the pods running on one node.
func (t *Topology) PodsOn(node string) []Host {
	var out []Host
	for _, p := range t.Pods {
		if p.Node == node {
			out = append(out, p)
		}
	}
	return out
}

// ClusterCIDRs returns the cluster (pod) ranges, IPv4 first.
func (t *Topology) ClusterCIDRs() []netip.Prefix {
	return []netip.Prefix{t.ClusterCIDR4, t.ClusterCIDR6}
}

// ClusterCIDR returns the cluster range of one family.
func (t *Topology) ClusterCIDR(f v1.IPFamily) netip.Prefix {
	if f == v1.IPv6Protocol {
		return t.ClusterCIDR6
	}
	return t.ClusterCIDR4
}

// NodeNetwork returns the node network of one family.
func (t *Topology) NodeNetwork(f v1.IPFamily) netip.Prefix {
	if f == v1.IPv6Protocol {
		return t.NodeNetwork6
	}
	return t.NodeNetwork4
}

// ServiceCIDR returns the Service range of one family.
func (t *Topology) ServiceCIDR(f v1.IPFamily) netip.Prefix {
	if f == v1.IPv6Protocol {
		return t.ServiceCIDR6
	}
	return t.ServiceCIDR4
}

// ExternalCIDR returns the externalIP range of one family.
func (t *Topology) ExternalCIDR(f v1.IPFamily) netip.Prefix {
	if f == v1.IPv6Protocol {
		return t.ExternalCIDR6
	}
	return t.ExternalCIDR4
}

// LoadBalancerCIDR returns the LoadBalancer ingress range of one family.
func (t *Topology) LoadBalancerCIDR(f v1.IPFamily) netip.Prefix {
	if f == v1.IPv6Protocol {
		return t.LoadBalancerCIDR6
	}
	return t.LoadBalancerCIDR4
}

// IsNodeAddr reports whether addr belongs to the named node (its node IP or
// its pod gateway address).
func (t *Topology) IsNodeAddr(node string, addr netip.Addr) bool {
	n, ok := t.Node(node)
	if !ok {
		return false
	}
	addr = addr.Unmap()
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, a := range n.Addrs(f) {
			if a == addr {
				return true
			}
		}
	}
	return false
}

// HostByAddr names the host owning addr ("" when none does). A node's pod
// gateway address names the node.
func (t *Topology) HostByAddr(addr netip.Addr) string {
	addr = addr.Unmap()
	for _, h := range t.Hosts() {
		if h.IPv4 == addr || h.IPv6 == addr {
			return h.Name
		}
	}
	for _, n := range t.Nodes {
		if n.Gateway4 == addr || n.Gateway6 == addr {
			return n.Name
		}
	}
	return ""
}

// NodeObjects returns the Node objects of the topology (status addresses,
// podCIDRs, zone labels), sorted by name.
func (t *Topology) NodeObjects() []*v1.Node {
	out := make([]*v1.Node, 0, len(t.Nodes))
	for _, n := range t.Nodes {
		out = append(out, &v1.Node{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{
				Name: n.Name,
				Labels: map[string]string{
					v1.LabelHostname:       n.Name,
					v1.LabelTopologyZone:   n.Zone,
					v1.LabelTopologyRegion: "region-1",
					v1.LabelOSStable:       "linux",
				},
			},
			Spec: v1.NodeSpec{
				PodCIDR:  n.PodCIDR4.String(),
				PodCIDRs: []string{n.PodCIDR4.String(), n.PodCIDR6.String()},
			},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: n.IPv4.String()},
				{Type: v1.NodeInternalIP, Address: n.IPv6.String()},
				{Type: v1.NodeHostName, Address: n.Name},
			}},
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// NodeObject returns the Node object of one node.
func (t *Topology) NodeObject(name string) (*v1.Node, error) {
	for _, n := range t.NodeObjects() {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("proxytest: no node %q in the topology", name)
}
