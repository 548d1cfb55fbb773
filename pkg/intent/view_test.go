package intent

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

func spName(ns, name, port string, proto v1.Protocol) proxy.ServicePortName {
	return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// randomPort makes a service port whose frontends often collide with other
// ports' (a small address and port space).
func randomPort(r *rand.Rand, n proxy.ServicePortName) *proxy.ServicePort {
	sp := &proxy.ServicePort{
		Name: n, Family: v1.IPv4Protocol, Protocol: n.Protocol,
		ClusterIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(1 + r.IntN(6))}),
		Port:      int32(80 + r.IntN(2)),
	}
	if r.IntN(3) == 0 {
		sp.NodePort = int32(30000 + r.IntN(3))
	}
	for range r.IntN(3) {
		sp.ExternalIPs = append(sp.ExternalIPs, netip.AddrFrom4([4]byte{192, 168, 60, byte(1 + r.IntN(3))}))
	}
	slices.SortFunc(sp.ExternalIPs, netip.Addr.Compare)
	sp.ExternalIPs = slices.Compact(sp.ExternalIPs)
	if r.IntN(4) == 0 {
		sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 60, byte(1 + r.IntN(3))})}
		if r.IntN(2) == 0 {
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.50.0/24")}
		}
	}
	if r.IntN(5) == 0 {
		sp.Algorithm = proxy.AlgorithmLeastConnection
	}
	sp.ExternalPolicyLocal = r.IntN(3) == 0 && sp.ExternallyAccessible()
	for i := range r.IntN(4) {
		ep := proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(1 + i%2), byte(1 + i)}), Port: 8080, Ready: true, Serving: true, Local: i%2 == 0}
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
		if ep.Local {
			sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
		}
		sp.HasAnyEndpoints = true
	}
	if r.IntN(15) == 0 {
		sp.ClusterIP = netip.Addr{} // invalid: left out
	}
	return sp
}

func viewOf(ports map[proxy.ServicePortName]*proxy.ServicePort) *proxy.FamilyView {
	return proxy.NewFamilyView(v1.IPv4Protocol, ports)
}

// sameView compares two views by value: the same ports with the same
// intent, the same problems.
func sameView(t *testing.T, step int, got, want *View) {
	t.Helper()
	if got.Len() != want.Len() {
		t.Fatalf("step %d: %d ports, from scratch %d", step, got.Len(), want.Len())
	}
	for _, w := range want.Sorted() {
		g := got.Port(w.Name)
		if g == nil {
			t.Fatalf("step %d: %s missing", step, w.Name)
		}
		if !reflect.DeepEqual(g, w) {
			gv, wv := reflect.ValueOf(*g), reflect.ValueOf(*w)
			for i := range gv.NumField() {
				if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
					t.Errorf("step %d: %s: %s: incremental %+v, from scratch %+v", step, w.Name, gv.Type().Field(i).Name, gv.Field(i).Interface(), wv.Field(i).Interface())
				}
			}
			t.FailNow()
		}
	}
	if g, w := got.Problems(), want.Problems(); !reflect.DeepEqual(g, w) {
		t.Fatalf("step %d: problems differ:\n incremental %v\n from scratch %v", step, g, w)
	}
}

// TestBuilderIncrementalEqualsScratch drives a Builder through random
// changes (ports added, changed, removed, least-connection counts, node
// addresses) and checks after each step that its View equals one built
// from scratch, that an unchanged port keeps its pointer and that Changed
// names every port whose intent differs from the previous View's.
func TestBuilderIncrementalEqualsScratch(t *testing.T) {
	for seed := range uint64(30) {
		r := rand.New(rand.NewPCG(seed, 1))
		var names []proxy.ServicePortName
		for _, ns := range []string{"a", "b"} {
			for _, svc := range []string{"s1", "s2", "s3"} {
				for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
					names = append(names, spName(ns, svc, "p", proto))
				}
			}
		}
		ports := map[proxy.ServicePortName]*proxy.ServicePort{}
		b := NewBuilder(v1.IPv4Protocol)
		cfg := Config{PodSources: true, NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.1")}}
		conns := map[proxy.ServicePortName]map[netip.AddrPort]int{}
		var prev *View
		for step := range 40 {
			ch := proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{}}
			connsChanged := map[proxy.ServicePortName]struct{}{}
			for range 1 + r.IntN(3) {
				n := names[r.IntN(len(names))]
				ports = cloneMap(ports)
				if r.IntN(4) == 0 {
					delete(ports, n)
				} else {
					ports[n] = randomPort(r, n)
				}
				ch.Ports[n] = struct{}{}
			}
			if r.IntN(5) == 0 {
				n := names[r.IntN(len(names))]
				conns = cloneConns(conns)
				conns[n] = map[netip.AddrPort]int{netip.MustParseAddrPort("10.244.1.1:8080"): r.IntN(5)}
				connsChanged[n] = struct{}{}
			}
			if r.IntN(8) == 0 {
				cfg.NodeIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 50, byte(1 + r.IntN(2))})}
			}
			if r.IntN(20) == 0 {
				cfg.MasqueradeAll = !cfg.MasqueradeAll
			}
			ch.Full = r.IntN(10) == 0
			in := Input{Config: cfg, Ports: viewOf(ports), Changes: ch, Conns: conns, ConnsChanged: connsChanged}
			got := b.Build(in)
			want := NewBuilder(v1.IPv4Protocol).Build(in)
			sameView(t, step, got, want)
			if got.Full != ch.Full {
				t.Fatalf("step %d: Full %v, want %v", step, got.Full, ch.Full)
			}
			if prev != nil {
				for _, p := range got.Sorted() {
					old := prev.Port(p.Name)
					_, changed := got.changed[p.Name]
					if old != p && !changed {
						t.Fatalf("step %d: %s has a new intent but is not in Changed", step, p.Name)
					}
					if old == p && changed {
						t.Fatalf("step %d: %s is in Changed with the same intent", step, p.Name)
					}
					if old != nil && old != p && reflect.DeepEqual(old, p) && old.From == p.From && !got.NodeChanged && len(connsChanged) == 0 {
						t.Logf("step %d: %s rebuilt to the same value", step, p.Name)
					}
				}
				for _, p := range prev.Sorted() {
					if got.Port(p.Name) == nil && !got.Changed(p.Name) {
						t.Fatalf("step %d: %s is gone but not in Changed", step, p.Name)
					}
				}
			}
			prev = got
		}
	}
}

func cloneMap(m map[proxy.ServicePortName]*proxy.ServicePort) map[proxy.ServicePortName]*proxy.ServicePort {
	out := make(map[proxy.ServicePortName]*proxy.ServicePort, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func cloneConns(m map[proxy.ServicePortName]map[netip.AddrPort]int) map[proxy.ServicePortName]map[netip.AddrPort]int {
	out := make(map[proxy.ServicePortName]map[netip.AddrPort]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func ports(sps ...*proxy.ServicePort) *proxy.FamilyView {
	m := map[proxy.ServicePortName]*proxy.ServicePort{}
	for _, sp := range sps {
		m[sp.Name] = sp
	}
	return viewOf(m)
}

func withExternal(sp *proxy.ServicePort, ips ...string) *proxy.ServicePort {
	cp := *sp
	cp.ExternalIPs = nil
	for _, ip := range ips {
		cp.ExternalIPs = append(cp.ExternalIPs, netip.MustParseAddr(ip))
	}
	return &cp
}

func basePort(ns, name string, clusterIP string, port int32) *proxy.ServicePort {
	return &proxy.ServicePort{Name: spName(ns, name, "", v1.ProtocolTCP), Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP,
		ClusterIP: netip.MustParseAddr(clusterIP), Port: port,
		ClusterEndpoints: []proxy.Endpoint{{IP: netip.MustParseAddr("10.244.1.1"), Port: 80, Ready: true, Serving: true}},
		HasAnyEndpoints:  true}
}

func frontends(p *Port) string {
	if p == nil {
		return "<left out>"
	}
	var out []string
	for i := range p.Frontends {
		out = append(out, p.Frontends[i].String())
	}
	return strings.Join(out, ", ")
}

// TestOwnership: when two service ports claim one frontend, the first in
// name order owns it (a ClusterIP claim before any other); the other loses
// it with a FrontendConflict and gets it back when the owner gives it up.
func TestOwnership(t *testing.T) {
	a := withExternal(basePort("a", "web", "10.96.0.10", 80), "192.168.60.1")
	b := withExternal(basePort("b", "web", "10.96.0.11", 80), "192.168.60.1", "192.168.60.2")
	bld := NewBuilder(v1.IPv4Protocol)
	v := bld.Build(Input{Ports: ports(a, b), Changes: proxy.Changes{Full: true}})
	if got := frontends(v.Port(a.Name)); got != "ClusterIP 10.96.0.10:80, externalIP 192.168.60.1:80" {
		t.Errorf("a/web: %s", got)
	}
	if got := frontends(v.Port(b.Name)); got != "ClusterIP 10.96.0.11:80, externalIP 192.168.60.2:80" {
		t.Errorf("b/web: %s", got)
	}
	ps := v.ProblemsOf(b.Name)
	if len(ps) != 1 || ps[0].Reason != ReasonFrontendConflict || !strings.Contains(ps[0].Message, "a/web") {
		t.Errorf("b/web's problems: %v", ps)
	}
	if len(v.ProblemsOf(a.Name)) != 0 {
		t.Errorf("a/web has problems: %v", v.ProblemsOf(a.Name))
	}

	// a/web gives the address up: b/web gets it back, both are changed.
	a2 := withExternal(a)
	v = bld.Build(Input{Ports: ports(a2, b), Changes: proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{a.Name: {}}}})
	if got := frontends(v.Port(b.Name)); got != "ClusterIP 10.96.0.11:80, externalIP 192.168.60.1:80, externalIP 192.168.60.2:80" {
		t.Errorf("b/web after a/web gave 192.168.60.1 up: %s", got)
	}
	if !v.Changed(b.Name) || !v.Changed(a.Name) {
		t.Errorf("changed: a %v, b %v; want both", v.Changed(a.Name), v.Changed(b.Name))
	}
	if len(v.ProblemsOf(b.Name)) != 0 {
		t.Errorf("b/web still has problems: %v", v.ProblemsOf(b.Name))
	}

	// An externalIP that is another port's ClusterIP:port loses to it,
	// whatever the names.
	c := withExternal(basePort("0", "first", "10.96.0.12", 80), "10.96.0.11")
	v = bld.Build(Input{Ports: ports(a2, b, c), Changes: proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{c.Name: {}}}})
	if got := frontends(v.Port(c.Name)); got != "ClusterIP 10.96.0.12:80" {
		t.Errorf("0/first: %s", got)
	}
	if got := frontends(v.Port(b.Name)); !strings.HasPrefix(got, "ClusterIP 10.96.0.11:80") {
		t.Errorf("b/web: %s", got)
	}

	// Two ports with one ClusterIP, port and protocol: the second is left
	// out, and comes back when the first goes.
	d := basePort("z", "dup", "10.96.0.10", 80)
	v = bld.Build(Input{Ports: ports(a2, b, c, d), Changes: proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{d.Name: {}}}})
	if v.Port(d.Name) != nil {
		t.Errorf("z/dup is programmed with a/web's ClusterIP: %s", frontends(v.Port(d.Name)))
	}
	if ps := v.ProblemsOf(d.Name); len(ps) != 1 || ps[0].Reason != ReasonFrontendConflict {
		t.Errorf("z/dup's problems: %v", ps)
	}
	v = bld.Build(Input{Ports: ports(b, c, d), Changes: proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{a.Name: {}}}})
	if got := frontends(v.Port(d.Name)); got != "ClusterIP 10.96.0.10:80" || !v.Changed(d.Name) {
		t.Errorf("z/dup after a/web went: %s (changed %v)", got, v.Changed(d.Name))
	}
	if ps := v.Problems(); len(ps) != 1 || ps[0].Service.Namespace != "0" {
		t.Errorf("problems left: %v; want only 0/first's", ps)
	}
}
