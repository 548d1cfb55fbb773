package healthcheck

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int32 {
	t.Helper()
	var ls []net.Listener
	var ports []int32
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, int32(l.Addr().(*net.TCPAddr).Port))
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

type reports struct {
	mu   sync.Mutex
	msgs []string
}

func (r *reports) report(svc types.NamespacedName, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, svc.String()+" "+reason+": "+msg)
}

func (r *reports) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.msgs
	r.msgs = nil
	return out
}

func nsn(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

func url(port int32) string { return fmt.Sprintf("http://127.0.0.1:%d/", port) }

// refused checks that nothing listens on port any more.
func refused(t *testing.T, port int32) {
	t.Helper()
	_, err := client.Get(url(port))
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("port %d: want connection refused, got %v", port, err)
	}
}

// TestServiceServers drives the servers through Services appearing,
// changing, moving and going away, checking real HTTP answers.
func TestServiceServers(t *testing.T) {
	p := freePorts(t, 3)
	var healthy atomic.Bool
	healthy.Store(true)
	var rep reports
	s := NewServiceServers(ServiceOptions{IPs: loopback, Healthy: healthy.Load, Report: rep.report})
	defer s.Close()

	type probe struct {
		port    int32
		code    int // 0: connection refused
		weight  string
		healthy bool
		svc     string
	}
	steps := []struct {
		name   string
		want   map[types.NamespacedName]ServiceHealth
		proxy  bool
		probes []probe
	}{
		{"a with local endpoints", map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: p[0], LocalEndpoints: 2}}, true,
			[]probe{{p[0], 200, "2", true, "a"}}},
		{"a without local endpoints", map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: p[0]}}, true,
			[]probe{{p[0], 503, "0", true, "a"}}},
		{"a back, proxy unhealthy", map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: p[0], LocalEndpoints: 3}}, false,
			[]probe{{p[0], 503, "3", false, "a"}}},
		{"a gone, b added", map[types.NamespacedName]ServiceHealth{nsn("b"): {Port: p[1], LocalEndpoints: 1}}, true,
			[]probe{{p[0], 0, "", false, ""}, {p[1], 200, "1", true, "b"}}},
		{"b moves", map[types.NamespacedName]ServiceHealth{nsn("b"): {Port: p[2], LocalEndpoints: 1}}, true,
			[]probe{{p[1], 0, "", false, ""}, {p[2], 200, "1", true, "b"}}},
		{"a takes b's old port", map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: p[1], LocalEndpoints: 1}, nsn("b"): {Port: p[2], LocalEndpoints: 4}}, true,
			[]probe{{p[1], 200, "1", true, "a"}, {p[2], 200, "4", true, "b"}}},
		{"nothing", nil, true,
			[]probe{{p[0], 0, "", false, ""}, {p[1], 0, "", false, ""}, {p[2], 0, "", false, ""}}},
	}
	for _, st := range steps {
		healthy.Store(st.proxy)
		s.Update(st.want)
		for _, pr := range st.probes {
			if pr.code == 0 {
				refused(t, pr.port)
				continue
			}
			a := get(t, url(pr.port))
			if a.code != pr.code || a.header.Get(WeightHeader) != pr.weight {
				t.Errorf("%s: port %d: %d weight %q, want %d %q", st.name, pr.port, a.code, a.header.Get(WeightHeader), pr.code, pr.weight)
			}
			svc, _ := a.body["service"].(map[string]any)
			if svc["namespace"] != "ns" || svc["name"] != pr.svc || a.body["serviceProxyHealthy"] != pr.healthy ||
				a.body["localEndpoints"] != float64(mustAtoi(pr.weight)) {
				t.Errorf("%s: port %d: body %v", st.name, pr.port, a.body)
			}
		}
		if got := len(s.Serving()); got != len(st.want) {
			t.Errorf("%s: serving %d Services, want %d", st.name, got, len(st.want))
		}
	}
	if msgs := rep.take(); len(msgs) != 0 {
		t.Errorf("unexpected reports: %v", msgs)
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// TestServiceServersBindFailures checks that a port that cannot be bound, or
// that two Services claim, is reported once and disturbs nothing else, and
// that a port freed later is served at the next update.
func TestServiceServersBindFailures(t *testing.T) {
	p := freePorts(t, 2)
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p[0]))
	if err != nil {
		t.Fatal(err)
	}
	var rep reports
	s := NewServiceServers(ServiceOptions{IPs: loopback, Report: rep.report})
	defer s.Close()
	want := map[types.NamespacedName]ServiceHealth{
		nsn("busy"):   {Port: p[0], LocalEndpoints: 1},
		nsn("first"):  {Port: p[1], LocalEndpoints: 1},
		nsn("second"): {Port: p[1], LocalEndpoints: 5},
	}
	for i := range 3 {
		s.Update(want)
		msgs := rep.take()
		if i > 0 {
			if len(msgs) != 0 {
				t.Errorf("update %d reported again: %v", i, msgs)
			}
			continue
		}
		if len(msgs) != 2 || !strings.HasPrefix(msgs[0], "ns/busy "+ReasonFailedToStart) ||
			!strings.Contains(msgs[1], "ns/second "+ReasonFailedToStart) || !strings.Contains(msgs[1], "already the health check node port of Service ns/first") {
			t.Errorf("reports: %q", msgs)
		}
	}
	if a := get(t, url(p[1])); a.code != 200 || a.header.Get(WeightHeader) != "1" {
		t.Errorf("first: %d %q", a.code, a.header.Get(WeightHeader))
	}
	if got := s.Serving(); len(got) != 1 || got[nsn("first")] != p[1] {
		t.Errorf("serving %v", got)
	}

	_ = busy.Close()
	s.Update(want)
	if a := get(t, url(p[0])); a.code != 200 {
		t.Errorf("busy port freed: %d", a.code)
	}
	if msgs := rep.take(); len(msgs) != 0 {
		t.Errorf("reports after recovery: %v", msgs)
	}
	// The second Service gives up the shared port, then asks again: a new
	// conflict is a new report.
	delete(want, nsn("second"))
	s.Update(want)
	want[nsn("second")] = ServiceHealth{Port: p[1]}
	s.Update(want)
	if msgs := rep.take(); len(msgs) != 1 {
		t.Errorf("conflict after a pause: %v", msgs)
	}

	s.Close()
	refused(t, p[0])
	refused(t, p[1])
	s.Update(want)
	if len(s.Serving()) != 0 {
		t.Errorf("Update after Close opened ports")
	}
}

func TestServicesFromSnapshot(t *testing.T) {
	ep := func(ip string, ready, local bool) proxy.Endpoint {
		return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 80, Ready: ready, Serving: ready, Terminating: !ready, Local: local}
	}
	port := func(svc, portName string, fam v1.IPFamily, hc int32, local ...proxy.Endpoint) *proxy.ServicePort {
		return &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: nsn(svc), Port: portName, Protocol: v1.ProtocolTCP},
			Family: fam, Type: v1.ServiceTypeLoadBalancer, HealthCheckNodePort: hc, ExternalPolicyLocal: hc != 0, LocalEndpoints: local}
	}
	view := func(fam v1.IPFamily, ports ...*proxy.ServicePort) *proxy.FamilyView {
		m := map[proxy.ServicePortName]*proxy.ServicePort{}
		for _, p := range ports {
			m[p.Name] = p
		}
		return proxy.NewFamilyView(fam, m)
	}
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	for _, tc := range []struct {
		name   string
		v4, v6 []*proxy.ServicePort
		want   map[types.NamespacedName]ServiceHealth
	}{
		{"no health check ports", []*proxy.ServicePort{port("a", "", v4, 0, ep("10.0.0.1", true, true))}, nil,
			map[types.NamespacedName]ServiceHealth{}},
		{"no local endpoints", []*proxy.ServicePort{port("a", "", v4, 32000)}, nil,
			map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: 32000}}},
		{"ready local endpoints counted by IP across ports", []*proxy.ServicePort{
			port("a", "http", v4, 32000, ep("10.0.0.1", true, true), ep("10.0.0.2", true, true)),
			port("a", "https", v4, 32000, ep("10.0.0.1", true, true), ep("10.0.0.3", true, true)),
		}, nil, map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: 32000, LocalEndpoints: 3}}},
		{"terminating endpoints do not count", []*proxy.ServicePort{
			port("a", "", v4, 32000, ep("10.0.0.1", false, true), ep("10.0.0.2", false, true)),
		}, nil, map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: 32000}}},
		{"dual-stack pods count once", []*proxy.ServicePort{port("a", "", v4, 32000, ep("10.0.0.1", true, true), ep("10.0.0.2", true, true))},
			[]*proxy.ServicePort{port("a", "", v6, 32000, ep("fd00::1", true, true))},
			map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: 32000, LocalEndpoints: 2}}},
		{"IPv6 only", nil, []*proxy.ServicePort{port("b", "", v6, 32001, ep("fd00::1", true, true))},
			map[types.NamespacedName]ServiceHealth{nsn("b"): {Port: 32001, LocalEndpoints: 1}}},
		{"several Services", []*proxy.ServicePort{port("a", "", v4, 32000, ep("10.0.0.1", true, true)), port("b", "", v4, 32001), port("c", "", v4, 0)}, nil,
			map[types.NamespacedName]ServiceHealth{nsn("a"): {Port: 32000, LocalEndpoints: 1}, nsn("b"): {Port: 32001}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := &proxy.Snapshot{IPv4: view(v4, tc.v4...), IPv6: view(v6, tc.v6...)}
			got := ServicesFromSnapshot(snap)
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for name, w := range tc.want {
				if got[name] != w {
					t.Errorf("%s: got %+v, want %+v", name, got[name], w)
				}
			}
		})
	}
	if got := ServicesFromSnapshot(nil); len(got) != 0 {
		t.Errorf("nil snapshot: %v", got)
	}
}

// TestUpdateSomeEqualsUpdate: updating only the Services that changed
// (UpdateSome, the app's partial syncs) serves what updating with every
// Service does (Update), through random changes, port moves, clashes of
// two Services on one port, and ports that cannot be opened for a while
// (retried by both).
func TestUpdateSomeEqualsUpdate(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 9))
	busy := map[string]bool{} // addresses that refuse to listen for now
	listen := func(network, address string) (net.Listener, error) {
		if busy[address] {
			return nil, fmt.Errorf("listen %s: address already in use", address)
		}
		return newIdle(address), nil
	}
	ip := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	full := NewServiceServers(ServiceOptions{IPs: ip, Listen: listen})
	some := NewServiceServers(ServiceOptions{IPs: ip, Listen: listen})
	defer full.Close()
	defer some.Close()
	want := map[types.NamespacedName]ServiceHealth{}
	for step := range 300 {
		var changed []types.NamespacedName
		for range rnd.IntN(3) + 1 {
			name := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", rnd.IntN(8))}
			changed = append(changed, name)
			if rnd.IntN(4) == 0 {
				delete(want, name)
			} else {
				want[name] = ServiceHealth{Port: int32(31000 + rnd.IntN(10)), LocalEndpoints: rnd.IntN(3)}
			}
		}
		clear(busy)
		if rnd.IntN(3) == 0 {
			busy[fmt.Sprintf("192.0.2.1:%d", 31000+rnd.IntN(10))] = true
		}
		full.Update(maps.Clone(want))
		some.UpdateSome(changed, maps.Clone(want))
		if a, b := full.Serving(), some.Serving(); !maps.Equal(a, b) {
			t.Fatalf("step %d: Update serves %v, UpdateSome %v (want %v)", step, a, b, want)
		}
		for name := range some.Serving() {
			if full.services[name].endpoints != some.services[name].endpoints {
				t.Fatalf("step %d: %s: %d local endpoints after Update, %d after UpdateSome", step, name,
					full.services[name].endpoints, some.services[name].endpoints)
			}
		}
	}
}

// idle is a listener that accepts nothing until closed.
type idle struct {
	addr   string
	closed chan struct{}
	once   *sync.Once
}

func newIdle(addr string) idle {
	return idle{addr: addr, closed: make(chan struct{}), once: &sync.Once{}}
}

func (l idle) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l idle) Close() error              { l.once.Do(func() { close(l.closed) }); return nil }
func (l idle) Addr() net.Addr            { a, _ := net.ResolveTCPAddr("tcp", l.addr); return a }
