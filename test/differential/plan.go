package differential

import (
	"fmt"
	"net/netip"
	"sort"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

// Frontend is the kind of Service address a probe sends to.
type Frontend string

// Frontends.
const (
	ClusterIP Frontend = "clusterip"
	// NodePort is the proxy node's primary IP of the probe's family.
	NodePort Frontend = "nodeport"
	// NodePortSecondary is the proxy node's other address (its pod
	// gateway address).
	NodePortSecondary Frontend = "nodeport-secondary"
	// NodePortLocalhost is 127.0.0.1 (IPv4 only, from the node itself).
	NodePortLocalhost Frontend = "nodeport-localhost"
	ExternalIP        Frontend = "externalip"
	LoadBalancerIP    Frontend = "lbip"
)

// External reports whether f is an external frontend (anything but the
// ClusterIP).
func (f Frontend) External() bool { return f != ClusterIP }

// Probe is one client host sending to one frontend of one service port,
// over one protocol and family, as many attempts as its Sampler wants.
type Probe struct {
	Seed uint64
	// Service is the Service's name (namespace proxytest.Namespace) and
	// Port its port's name.
	Service  string
	Port     string
	Protocol v1.Protocol
	Family   v1.IPFamily
	Frontend Frontend
	Addr     netip.AddrPort
	// From is the client host (a pod, node1 or the outside client).
	From string
	// Affinity is set for Services with session affinity ClientIP.
	Affinity bool
	// Addresses is the number of client addresses the probe uses (more
	// than one under session affinity from a host that has extra
	// addresses: which endpoint one address sticks to is a draw, so many
	// addresses show the set); 1 otherwise.
	Addresses int
	// Candidates are the backends that could answer (every endpoint of the
	// family's slices on a slice port matching the service port), sorted:
	// once each answered, there is nothing more to see.
	Candidates []string
	// Thorough makes the Sampler sample mixed outcomes longer (the second
	// look at a probe whose outcomes differed).
	Thorough bool
}

// String names a probe in reports.
func (p Probe) String() string {
	port := p.Port
	if port == "" {
		port = `""`
	}
	return fmt.Sprintf("%s/%s %s %s %s %s from %s", p.Service, port, p.Protocol, p.Family, p.Frontend, p.Addr, p.From)
}

// Key identifies a probe within a scenario.
func (p Probe) Key() string { return p.String() }

// Hosts that probe: a pod on the proxy node, the proxy node itself, the
// outside client, and a pod on the other node (external frontends only).
var (
	fromClusterIP = []string{proxytest.Client1, proxytest.Node1, proxytest.Outside}
	fromExternal  = []string{proxytest.Client1, proxytest.Node1, proxytest.Outside, proxytest.Client2}
	fromSecondary = []string{proxytest.Client1, proxytest.Node1}
	// MultiAddressHosts have ExtraAddresses client addresses besides
	// their own.
	MultiAddressHosts = []string{proxytest.Client1, proxytest.Client2, proxytest.Outside}
)

// ExtraAddresses is the number of extra client addresses of each
// MultiAddressHosts host, per family.
const ExtraAddresses = 64

// Plan lists the probes of a scenario on a topology: every frontend of
// every service port (ClusterIP, NodePort on the proxy node's primary and
// secondary addresses and on 127.0.0.1, externalIPs, LoadBalancer ingress
// IPs, each of every family the Service lists), from every host that can
// reach it; a backend pod on the proxy node probes the ClusterIP too
// (hairpin). Sorted by key.
func Plan(top *proxytest.Topology, sc *proxytest.Scenario) []Probe {
	node, _ := top.Node(top.ProxyNode)
	var out []Probe
	for _, svc := range sc.Services {
		slices := sc.SlicesOf(svc.Name)
		affinity := svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP
		for _, sp := range svc.Spec.Ports {
			add := func(fam v1.IPFamily, f Frontend, addr netip.AddrPort, from ...string) {
				for _, h := range from {
					p := Probe{
						Seed: sc.Seed, Service: svc.Name, Port: sp.Name, Protocol: sp.Protocol, Family: fam,
						Frontend: f, Addr: addr, From: h, Affinity: affinity, Addresses: 1,
						Candidates: Candidates(slices, sp, fam),
					}
					if affinity && contains(MultiAddressHosts, h) {
						p.Addresses = ExtraAddresses
					}
					out = append(out, p)
				}
			}
			for _, fam := range svc.Spec.IPFamilies {
				if ip, ok := pick(svc.Spec.ClusterIPs, fam); ok {
					from := fromClusterIP
					if hp := hairpinPod(top, slices); hp != "" {
						from = append(append([]string(nil), from...), hp)
					}
					add(fam, ClusterIP, netip.AddrPortFrom(ip, uint16(sp.Port)), from...)
				}
				if sp.NodePort != 0 {
					np := uint16(sp.NodePort)
					add(fam, NodePort, netip.AddrPortFrom(node.Addr(fam), np), fromExternal...)
					add(fam, NodePortSecondary, netip.AddrPortFrom(node.Gateway(fam), np), fromSecondary...)
					if fam == v1.IPv4Protocol {
						add(fam, NodePortLocalhost, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), np), proxytest.Node1)
					}
				}
			}
			for _, s := range svc.Spec.ExternalIPs {
				ip := netip.MustParseAddr(s)
				add(familyOf(ip), ExternalIP, netip.AddrPortFrom(ip, uint16(sp.Port)), fromExternal...)
			}
			for _, in := range svc.Status.LoadBalancer.Ingress {
				ip := netip.MustParseAddr(in.IP)
				add(familyOf(ip), LoadBalancerIP, netip.AddrPortFrom(ip, uint16(sp.Port)), fromExternal...)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// Candidates returns the backends a service port could reach in one
// family: every endpoint of the family's slices, on each slice port of the
// service port's name and protocol (AltEchoPort answers as
// proxytest.AltBackend), sorted.
func Candidates(slices []*discovery.EndpointSlice, sp v1.ServicePort, fam v1.IPFamily) []string {
	set := map[string]bool{}
	for _, s := range slices {
		if string(s.AddressType) != string(fam) {
			continue
		}
		for _, p := range s.Ports {
			if p.Name == nil || *p.Name != sp.Name || p.Protocol == nil || *p.Protocol != sp.Protocol || p.Port == nil {
				continue
			}
			for _, e := range s.Endpoints {
				if e.TargetRef == nil {
					continue
				}
				name := e.TargetRef.Name
				if *p.Port == proxytest.AltEchoPort {
					name = proxytest.AltBackend(name)
				}
				set[name] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// hairpinPod returns an endpoint pod on the proxy node listed in slices
// ("" when there is none): it probes its own Service's ClusterIP.
func hairpinPod(top *proxytest.Topology, slices []*discovery.EndpointSlice) string {
	var pods []string
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.TargetRef == nil {
				continue
			}
			if h, ok := top.Host(e.TargetRef.Name); ok && h.Node == top.ProxyNode && !contains(pods, h.Name) {
				pods = append(pods, h.Name)
			}
		}
	}
	sort.Strings(pods)
	if len(pods) == 0 {
		return ""
	}
	return pods[0]
}

func pick(ips []string, fam v1.IPFamily) (netip.Addr, bool) {
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && familyOf(a) == fam {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ExtraAddress returns the i-th extra client address (0 ≤ i <
// ExtraAddresses) of a MultiAddressHosts host in one family: host number
// 150+i of the host's network (its pod CIDR, or the node network for the
// outside client), written like proxytest's addresses (the IPv6 host
// number in decimal digits).
func ExtraAddress(top *proxytest.Topology, host string, fam v1.IPFamily, i int) (netip.Addr, error) {
	h, ok := top.Host(host)
	if !ok {
		return netip.Addr{}, fmt.Errorf("differential: no host %q", host)
	}
	var p netip.Prefix
	switch h.Role {
	case proxytest.RolePod:
		n, _ := top.Node(h.Node)
		p = n.PodCIDR(fam)
	case proxytest.RoleOutside:
		p = top.NodeNetwork(fam)
	default:
		return netip.Addr{}, fmt.Errorf("differential: host %s has no extra addresses", host)
	}
	n := 150 + i
	b := p.Masked().Addr().As16()
	if fam == v1.IPv4Protocol {
		b4 := p.Masked().Addr().As4()
		b4[3] = byte(n)
		return netip.AddrFrom4(b4), nil
	}
	// Decimal digits as hex digits: 150 → 0x0150.
	bcd := uint16(n/100)<<8 | uint16(n/10%10)<<4 | uint16(n%10)
	b[14], b[15] = byte(bcd>>8), byte(bcd)
	return netip.AddrFrom16(b), nil
}

// HostOf names the host owning addr: a host of the topology (a node's pod
// gateway address names the node), a MultiAddressHosts host's extra
// address, or the address itself.
func HostOf(top *proxytest.Topology, addr netip.Addr) string {
	addr = addr.Unmap()
	if h := top.HostByAddr(addr); h != "" {
		return h
	}
	for _, h := range MultiAddressHosts {
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			first, err := ExtraAddress(top, h, fam, 0)
			if err != nil || familyOf(first) != familyOf(addr) {
				continue
			}
			for i := 0; i < ExtraAddresses; i++ {
				if a, _ := ExtraAddress(top, h, fam, i); a == addr {
					return h
				}
			}
		}
	}
	return addr.String()
}

// frontendOf maps a behaviour-table target to a frontend.
var frontendOf = map[proxytest.Target]Frontend{
	proxytest.TargetClusterIP:         ClusterIP,
	proxytest.TargetNodePort:          NodePort,
	proxytest.TargetSecondaryNodePort: NodePortSecondary,
	proxytest.TargetLocalhostNodePort: NodePortLocalhost,
	proxytest.TargetExternalIP:        ExternalIP,
	proxytest.TargetLoadBalancerIP:    LoadBalancerIP,
}

// RowProbe turns a behaviour-table row into a probe (from the row's one
// client address) and its case in mode, so that the table's differential
// (test/integration TestDifferential) compares outcomes and consults the
// same documented differences as the randomized one.
func RowProbe(top *proxytest.Topology, row proxytest.Row, mode string) (Probe, Case, error) {
	addr, err := row.Address(top)
	if err != nil {
		return Probe{}, Case{}, err
	}
	f, ok := frontendOf[row.Target]
	if !ok {
		return Probe{}, Case{}, fmt.Errorf("differential: row %s: unknown target %q", row.Name, row.Target)
	}
	svc, ok := row.Case.Service(row.Service)
	if !ok {
		return Probe{}, Case{}, fmt.Errorf("differential: row %s: no Service %s", row.Name, row.Service)
	}
	var sp *v1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Protocol == row.Protocol {
			sp = &svc.Spec.Ports[i]
			break
		}
	}
	if sp == nil {
		return Probe{}, Case{}, fmt.Errorf("differential: row %s: Service %s has no %s port", row.Name, svc.Name, row.Protocol)
	}
	var slices []*discovery.EndpointSlice
	for _, s := range row.Case.Slices {
		if s.Labels[discovery.LabelServiceName] == svc.Name {
			slices = append(slices, s)
		}
	}
	p := Probe{
		Service: svc.Name, Port: sp.Name, Protocol: sp.Protocol, Family: row.Family, Frontend: f, Addr: addr,
		From: row.From, Affinity: svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP, Addresses: 1,
		Candidates: Candidates(slices, *sp, row.Family),
	}
	c := Case{Mode: mode, Service: svc, Slices: slices, AllSlices: row.Case.Slices}
	for _, n := range row.Case.Contenders {
		if o, ok := row.Case.Service(n); ok && n != svc.Name {
			c.Contenders = append(c.Contenders, o)
		}
	}
	return p, c, nil
}
