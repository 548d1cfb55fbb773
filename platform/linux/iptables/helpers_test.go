package iptables

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name.golden (rewriting it with -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from the golden file (run with -update after checking):\n%s", path, diff(string(want), string(got)))
	}
}

// diff renders the lines only in want (-) or only in got (+).
func diff(want, got string) string {
	w, g := map[string]int{}, map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		w[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		g[l]++
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if g[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if w[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	if b.Len() == 0 {
		return "(same lines, different order)"
	}
	return b.String()
}

var (
	node1IP  = netip.MustParseAddr("192.168.50.1")
	node1IP6 = netip.MustParseAddr("fd00:50::1")
)

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(addr string, port int32, local bool) proxy.Endpoint {
	return proxy.Endpoint{IP: a(addr), Port: port, Ready: true, Serving: true, Local: local}
}

type spOpt func(*proxy.ServicePort)

// svc builds a ClusterIP service port "ns/name:p" with the given endpoints as
// cluster endpoints (and the local ones also as local endpoints when a Local
// policy asks for them).
func svc(name, clusterIP string, port int32, proto v1.Protocol, opts ...spOpt) *proxy.ServicePort {
	ns, n, _ := strings.Cut(name, "/")
	ip := a(clusterIP)
	fam := v1.IPv4Protocol
	if ip.Is6() {
		fam = v1.IPv6Protocol
	}
	sp := &proxy.ServicePort{
		Name:      proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: n}, Port: "p", Protocol: proto},
		Family:    fam,
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: ip,
		Port:      port,
		Protocol:  proto,
	}
	for _, o := range opts {
		o(sp)
	}
	return sp
}

func withEndpoints(eps ...proxy.Endpoint) spOpt {
	return func(sp *proxy.ServicePort) {
		sp.HasAnyEndpoints = len(eps) > 0
		if sp.UsesClusterEndpoints() {
			sp.ClusterEndpoints = eps
		}
		if sp.UsesLocalEndpoints() {
			var local []proxy.Endpoint
			for _, e := range eps {
				if e.Local {
					local = append(local, e)
				}
			}
			sp.LocalEndpoints = local
		}
	}
}

func withAlgorithm(alg proxy.Algorithm) spOpt {
	return func(sp *proxy.ServicePort) { sp.Algorithm = alg }
}

func withNodePort(np int32) spOpt {
	return func(sp *proxy.ServicePort) { sp.NodePort = np; sp.Type = v1.ServiceTypeNodePort }
}

func withExternalIPs(ips ...string) spOpt {
	return func(sp *proxy.ServicePort) {
		for _, s := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, a(s))
		}
	}
}

func withLB(ips ...string) spOpt {
	return func(sp *proxy.ServicePort) {
		sp.Type = v1.ServiceTypeLoadBalancer
		for _, s := range ips {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, a(s))
		}
	}
}

func withSourceRanges(cidrs ...string) spOpt {
	return func(sp *proxy.ServicePort) {
		for _, s := range cidrs {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(s))
		}
	}
}

func withAffinity(seconds int32) spOpt {
	return func(sp *proxy.ServicePort) { sp.AffinityTimeoutSeconds = seconds }
}

// withETPLocal must come after the frontends and before withEndpoints.
func withETPLocal() spOpt {
	return func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal = sp.ExternallyAccessible() }
}

// withITPLocal must come before withEndpoints.
func withITPLocal() spOpt {
	return func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true }
}

func withHealthCheck(port int32) spOpt {
	return func(sp *proxy.ServicePort) { sp.HealthCheckNodePort = port }
}

func view(fam v1.IPFamily, ports ...*proxy.ServicePort) *proxy.FamilyView {
	m := map[proxy.ServicePortName]*proxy.ServicePort{}
	for _, p := range ports {
		m[p.Name] = p
	}
	return proxy.NewFamilyView(fam, m)
}

func testConfig(fam v1.IPFamily) facts.Config {
	c := facts.DefaultConfig(fam)
	if fam == v1.IPv6Protocol {
		c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:10::/32")}
	} else {
		c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	}
	return c
}

func mustPlanner(t testing.TB, cfg facts.Config) *Planner {
	t.Helper()
	p, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func nodeFor(fam v1.IPFamily) (proxy.Node, []netip.Addr) {
	if fam == v1.IPv6Protocol {
		return proxy.Node{Name: "node1", Known: true, Addresses: []netip.Addr{node1IP, node1IP6}},
			[]netip.Addr{a("::1"), node1IP6}
	}
	return proxy.Node{Name: "node1", Known: true, Addresses: []netip.Addr{node1IP, node1IP6}},
		[]netip.Addr{a("127.0.0.1"), node1IP}
}

func fullInput(v *proxy.FamilyView) testInput {
	node, local := nodeFor(v.Family)
	return testInput{View: v, Node: node, LocalAddrs: local, Changes: proxy.Changes{Full: true}}
}

// testInput is a plan's input in the cache's terms: the tests' planners
// get it as an intent View built by a Builder of their own (a planner
// sees a sequence of Views, as from the app).
type testInput struct {
	View        *proxy.FamilyView
	Node        proxy.Node
	LocalAddrs  []netip.Addr
	Changes     proxy.Changes
	Connections map[proxy.ServicePortName]map[netip.AddrPort]int
	Existing    map[string]map[string]uint64
	Extra       map[string][]string
	Exclude     map[proxy.ServicePortName]bool
	Referenced  map[string]map[string]bool
}

var builders = map[*Planner]*intent.Builder{}

// input builds in's View with p's Builder.
func (in testInput) input(p *Planner) Input {
	b := builders[p]
	if b == nil {
		b = intent.NewBuilder(p.cfg.Family)
		builders[p] = b
	}
	cfg := intent.Settings{MasqueradeAll: p.cfg.MasqueradeAll, DetectLocal: p.cfg.DetectLocal()}.Config(p.cfg.Family, in.Node, in.LocalAddrs)
	v := b.Build(intent.Input{Config: cfg, Ports: in.View, Node: in.Node, LocalAddrs: in.LocalAddrs, Changes: in.Changes,
		Conns: in.Connections, ConnsChanged: in.Changes.Ports})
	return Input{View: v, Full: in.Changes.Full, Existing: in.Existing, Extra: in.Extra, Exclude: in.Exclude, Referenced: in.Referenced}
}

// planIn plans in (see testInput).
func (p *Planner) planIn(in testInput) *Plan {
	pi := in.input(p)
	plan := p.Plan(pi)
	viewProblems[plan] = pi.View.Problems()
	return plan
}

// viewProblems holds the problems of the View each test plan was made
// from: what the intent left out.
var viewProblems = map[*Plan][]proxy.Unsupported{}

func problems(plan *Plan) []proxy.Unsupported { return viewProblems[plan] }

func changed(names ...proxy.ServicePortName) proxy.Changes {
	ch := proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{}}
	for _, n := range names {
		ch.Ports[n] = struct{}{}
	}
	return ch
}

var fullChanges = proxy.Changes{Full: true}

// planned plans in and commits the plan, as a backend does once the
// restore succeeded.
func planned(p *Planner, in testInput) *Plan {
	plan := p.planIn(in)
	p.Commit(plan)
	return plan
}
