package cache

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// gen turns fuzz bytes into choices.
type gen struct {
	data []byte
	pos  int
}

func (g *gen) byte() byte {
	if g.pos >= len(g.data) {
		return 0
	}
	b := g.data[g.pos]
	g.pos++
	return b
}

func (g *gen) done() bool { return g.pos >= len(g.data) }

func pickOf[T any](g *gen, xs ...T) T { return xs[int(g.byte())%len(xs)] }

var fuzzIPs = []string{"10.96.0.1", "10.96.0.2", "fd00::1", "fd00::2", "None", "", "junk", "10.0.0.256", "::ffff:10.1.1.1", "fe80::1%eth0", "0.0.0.0"}
var fuzzEPIPs = []string{"10.0.1.1", "10.0.1.2", "10.0.2.1", "fd00:1::1", "fd00:1::2", "junk", "", "10.0.1.1 ", "300.1.1.1"}
var fuzzPorts = []int32{80, 443, 0, -1, 65535, 65536, 53, 8080}
var fuzzProtos = []v1.Protocol{"TCP", "UDP", "SCTP", "", "ICMP"}
var fuzzNames = []string{"", "http", "dns", "http"}

func (g *gen) service() *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: pickOf(g, "a", "b", "c")}}
	s.Spec.Type = pickOf(g, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName, "")
	for i := int(g.byte() % 3); i > 0; i-- {
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, pickOf(g, fuzzIPs...))
	}
	if g.byte()%2 == 0 {
		s.Spec.ClusterIP = pickOf(g, fuzzIPs...)
	}
	for i := int(g.byte() % 3); i > 0; i-- {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: pickOf(g, fuzzNames...), Port: pickOf(g, fuzzPorts...),
			Protocol: pickOf(g, fuzzProtos...), NodePort: pickOf(g, fuzzPorts...)})
	}
	for i := int(g.byte() % 3); i > 0; i-- {
		s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, pickOf(g, fuzzIPs...))
	}
	for i := int(g.byte() % 3); i > 0; i-- {
		ing := v1.LoadBalancerIngress{IP: pickOf(g, fuzzIPs...)}
		if g.byte()%3 == 0 {
			ing.IPMode = ptr(pickOf(g, v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy, "bogus"))
		}
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, ing)
	}
	for i := int(g.byte() % 3); i > 0; i-- {
		s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, pickOf(g, "10.0.0.0/8", "fd00::/8", "junk", "1.2.3.4/33", " 192.168.0.0/16 "))
	}
	if g.byte()%2 == 0 {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if g.byte()%2 == 0 {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(pickOf[int32](g, 0, 1, 100, 86401))}}
		}
	}
	s.Spec.ExternalTrafficPolicy = pickOf(g, v1.ServiceExternalTrafficPolicyLocal, v1.ServiceExternalTrafficPolicyCluster, "")
	if g.byte()%2 == 0 {
		s.Spec.InternalTrafficPolicy = ptr(pickOf(g, v1.ServiceInternalTrafficPolicyLocal, v1.ServiceInternalTrafficPolicyCluster))
	}
	s.Spec.HealthCheckNodePort = pickOf(g, fuzzPorts...)
	return s
}

func (g *gen) slice() *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: pickOf(g, "s1", "s2", "s3", "s4"),
		Labels: map[string]string{}}}
	if g.byte()%8 != 0 {
		es.Labels[discovery.LabelServiceName] = pickOf(g, "a", "b", "c")
	}
	es.AddressType = pickOf(g, discovery.AddressTypeIPv4, discovery.AddressTypeIPv6, discovery.AddressTypeFQDN, "bogus")
	for i := int(g.byte() % 3); i > 0; i-- {
		p := discovery.EndpointPort{Name: ptr(pickOf(g, fuzzNames...)), Port: ptr(pickOf(g, fuzzPorts...))}
		if g.byte()%2 == 0 {
			p.Protocol = ptr(pickOf(g, fuzzProtos...))
		}
		if g.byte()%5 == 0 {
			p.Port = nil
		}
		es.Ports = append(es.Ports, p)
	}
	for i := int(g.byte() % 4); i > 0; i-- {
		e := discovery.Endpoint{}
		for j := int(g.byte() % 3); j > 0; j-- {
			e.Addresses = append(e.Addresses, pickOf(g, fuzzEPIPs...))
		}
		tri := func() *bool { return pickOf(g, nil, ptr(true), ptr(false)) }
		e.Conditions = discovery.EndpointConditions{Ready: tri(), Serving: tri(), Terminating: tri()}
		if g.byte()%2 == 0 {
			e.NodeName = ptr(pickOf(g, thisNode, "node2", ""))
		}
		if g.byte()%2 == 0 {
			e.Hints = &discovery.EndpointHints{}
			if g.byte()%2 == 0 {
				e.Hints.ForZones = []discovery.ForZone{{Name: pickOf(g, "zone-a", "zone-b")}}
			}
			if g.byte()%2 == 0 {
				e.Hints.ForNodes = []discovery.ForNode{{Name: pickOf(g, thisNode, "node2")}}
			}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// checkInvariants verifies what every backend relies on.
func checkInvariants(t *testing.T, snap *proxy.Snapshot) {
	t.Helper()
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		view := snap.Family(fam)
		if len(view.Sorted()) != view.Len() {
			t.Fatalf("%s: sorted view has %d ports, map %d", fam, len(view.Sorted()), view.Len())
		}
		for i, p := range view.Sorted() {
			if view.Get(p.Name) != p {
				t.Fatalf("%s: sorted view holds %s not in the map", fam, p.Name)
			}
			if i > 0 && !view.Sorted()[i-1].Name.Less(p.Name) {
				t.Fatalf("%s: sorted view out of order at %s", fam, p.Name)
			}
		}
		is4 := fam == v1.IPv4Protocol
		for p := range view.All() {
			name := p.Name
			if p.Name != name || p.Family != fam {
				t.Fatalf("%s: port filed under %s is %s/%s", fam, name, p.Name, p.Family)
			}
			if !p.ClusterIP.IsValid() || p.ClusterIP.Is4() != is4 {
				t.Fatalf("%s: %s has ClusterIP %s", fam, name, p.ClusterIP)
			}
			if !validPort(p.Port) || p.NodePort < 0 || p.NodePort > 65535 || !validProtocol(p.Protocol) {
				t.Fatalf("%s: %s has port %d nodePort %d protocol %q", fam, name, p.Port, p.NodePort, p.Protocol)
			}
			for _, a := range append(append([]netip.Addr{}, p.ExternalIPs...), p.LoadBalancerIPs...) {
				if a.Is4() != is4 {
					t.Fatalf("%s: %s has frontend %s", fam, name, a)
				}
			}
			for _, r := range p.LoadBalancerSourceRanges {
				if r.Addr().Is4() != is4 {
					t.Fatalf("%s: %s has range %s", fam, name, r)
				}
			}
			for _, list := range [][]proxy.Endpoint{p.ClusterEndpoints, p.LocalEndpoints} {
				for i, e := range list {
					if e.IP.Is4() != is4 || !validPort(e.Port) {
						t.Fatalf("%s: %s has endpoint %s", fam, name, e)
					}
					if i > 0 && list[i-1].AddrPort() == e.AddrPort() {
						t.Fatalf("%s: %s has duplicate endpoint %s", fam, name, e)
					}
					if i > 0 && list[i-1].IP.Compare(e.IP) > 0 {
						t.Fatalf("%s: %s endpoints not sorted", fam, name)
					}
				}
			}
			for _, e := range p.LocalEndpoints {
				if !e.Local {
					t.Fatalf("%s: %s has non-local endpoint %s in its local list", fam, name, e)
				}
			}
			if (len(p.ClusterEndpoints) > 0 || len(p.LocalEndpoints) > 0) && !p.HasAnyEndpoints {
				t.Fatalf("%s: %s has endpoints but HasAnyEndpoints is false", fam, name)
			}
			if !p.UsesClusterEndpoints() && p.ClusterEndpoints != nil || !p.UsesLocalEndpoints() && p.LocalEndpoints != nil {
				t.Fatalf("%s: %s has a list it never uses", fam, name)
			}
		}
	}
}

// FuzzCache throws random Service and EndpointSlice events at the cache. It
// checks that nothing panics, that every snapshot keeps the invariants
// backends rely on, and that the incremental state always equals the state
// built from scratch from the same objects.
func FuzzCache(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte("\x00\x00\x02\x00\x02\x01\x01\x00\x01\x01\x01\x00\x01\x00\x00\x01\x00\x02\x01\x00\x01\x02\x01\x00\x00\x02\x01\x00"))
	f.Add([]byte("kproxy fuzz seed: dual stack with local endpoints and hints"))
	f.Add([]byte{1, 0, 2, 2, 0, 1, 2, 0, 0, 0, 3, 1, 1, 1, 2, 0, 0, 1, 1, 0, 1, 1, 2, 3, 0, 1, 2, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &gen{data: data}
		c := New(Options{NodeName: thisNode, Logger: ptr(discardLogger())})
		services := map[string]*v1.Service{}
		slices := map[string]*discovery.EndpointSlice{}
		handed := map[string]*discovery.EndpointSlice{}
		if g.byte()%2 == 0 {
			c.OnNode(nil, node(thisNode, map[string]string{v1.LabelTopologyZone: pickOf(g, "zone-a", "zone-b")}))
		}
		for step := 0; step < 40 && !g.done(); step++ {
			switch g.byte() % 7 {
			case 0, 1:
				s := g.service()
				c.OnService(services[s.Name], s)
				services[s.Name] = s
			case 2:
				name := pickOf(g, "a", "b", "c")
				if old := services[name]; old != nil {
					c.OnService(old, nil)
					delete(services, name)
				}
			case 3, 4:
				// The source's old object is the last version handed
				// over; the state from scratch has the last one the
				// cache accepted (a rejected update keeps it).
				es := g.slice()
				c.OnEndpointSlice(handed[es.Name], es)
				handed[es.Name] = es
				if info, problems := parseSlice(es); info != nil || len(problems) == 0 {
					slices[es.Name] = es
				}
			case 6:
				name := pickOf(g, "s1", "s2", "s3", "s4")
				if old := handed[name]; old != nil {
					c.OnEndpointSlice(old, nil)
					delete(handed, name)
					delete(slices, name)
				}
			case 5:
				snap, _ := c.Snapshot()
				checkInvariants(t, snap)
				if g.byte()%2 == 0 {
					c.Ack(snap)
				}
			}
		}
		snap, _ := c.Snapshot()
		checkInvariants(t, snap)
		var svcs []*v1.Service
		for _, s := range services {
			svcs = append(svcs, s)
		}
		var sls []*discovery.EndpointSlice
		for _, s := range slices {
			sls = append(sls, s)
		}
		var n *v1.Node
		if c.node.Known {
			n = node(thisNode, map[string]string{v1.LabelTopologyZone: c.node.Zone})
		}
		fresh := Build(thisNode, n, svcs, sls)
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			a, b := snap.Family(fam), fresh.Family(fam)
			if a.Len() != b.Len() {
				t.Fatalf("%s: incremental has %v, from scratch %v", fam, portNames(a), portNames(b))
			}
			for p := range a.All() {
				name := p.Name
				if q := b.Get(name); q == nil || !equalPorts(p, q) {
					t.Fatalf("%s %s: incremental %s differs from scratch %s", fam, name, dump(p), dump(q))
				}
			}
		}
	})
}

func dump(p *proxy.ServicePort) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%+v", *p)
}
