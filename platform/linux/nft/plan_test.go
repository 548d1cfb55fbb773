package nft

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

func testConfig() facts.Config {
	cfg := facts.DefaultConfig(v1.IPv4Protocol)
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	return cfg
}

var testNode = Node{PodSources: true, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, NodePortsAll: true, Localhost: true}

func mustRenderer(t testing.TB, cfg facts.Config) *Renderer {
	t.Helper()
	r, err := NewRenderer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// genPort makes a random service port: a ClusterIP, maybe a NodePort,
// externalIPs and load balancer IPs (with source ranges), traffic policies,
// affinity, an algorithm, 0-5 endpoints some of them local.
func genPort(rnd *rand.Rand, i int) *proxy.ServicePort {
	name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}, Port: "p",
		Protocol: []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}[rnd.IntN(3)]}
	sp := &proxy.ServicePort{Name: name, Family: v1.IPv4Protocol, Protocol: name.Protocol,
		ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)}), Port: int32(80 + rnd.IntN(3))}
	if rnd.IntN(3) == 0 {
		sp.NodePort = int32(30000 + i)
	}
	if rnd.IntN(4) == 0 {
		// Shared across ports on purpose: two Services may claim one.
		sp.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 1, byte(rnd.IntN(4) + 1)})}
	}
	if rnd.IntN(4) == 0 {
		sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 2, byte(i%250 + 1)})}
		if rnd.IntN(2) == 0 {
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.50.0/24")}
		}
	}
	sp.ExternalPolicyLocal = sp.ExternallyAccessible() && rnd.IntN(3) == 0
	sp.InternalPolicyLocal = rnd.IntN(5) == 0
	if rnd.IntN(5) == 0 {
		sp.AffinityTimeoutSeconds = int32(10 + rnd.IntN(3))
	}
	sp.Algorithm = []proxy.Algorithm{"", proxy.AlgorithmRoundRobin, proxy.AlgorithmSourceHash, proxy.AlgorithmLeastConnection}[rnd.IntN(4)]
	n := rnd.IntN(6)
	for e := range n {
		ep := proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(rnd.IntN(3)), byte(e + 1)}), Port: 8080, Ready: true, Serving: true}
		ep.Local = ep.IP.As4()[2] == 1
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
	}
	proxy.SortEndpoints(sp.ClusterEndpoints)
	// One address once (the cache collapses duplicates).
	var eps []proxy.Endpoint
	for _, ep := range sp.ClusterEndpoints {
		if len(eps) == 0 || eps[len(eps)-1].IP != ep.IP {
			eps = append(eps, ep)
		}
	}
	sp.ClusterEndpoints = eps
	for _, ep := range eps {
		if ep.Local {
			sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
		}
	}
	sp.HasAnyEndpoints = len(eps) > 0
	if len(sp.ClusterEndpoints) == 0 {
		sp.ClusterEndpoints = nil
	}
	return sp
}

func build(t testing.TB, sp *proxy.ServicePort) *intent.Port {
	t.Helper()
	var conns map[netip.AddrPort]int
	if sp.Algorithm == proxy.AlgorithmLeastConnection && len(sp.ClusterEndpoints) > 0 {
		conns = map[netip.AddrPort]int{sp.ClusterEndpoints[0].AddrPort(): 3}
	}
	p, problems := intent.Build(intent.Config{Family: v1.IPv4Protocol, PodSources: true, NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.10")}}, sp, conns)
	if p == nil {
		t.Fatalf("%s: %v", sp.Name, problems)
	}
	return p
}

// ownGen matches the generation that ends a port's own chain name.
var ownGen = regexp.MustCompile(`(port-[a-z2-7]{8}-[^ ]*?-(?:eps-cluster|eps-local|route-cip|route-ext|route-np|fw-[a-z2-7]{8}))-[0-9]+`)

// normalized is a Fake's dump with own chains' generations removed (a
// partial sync names a rewritten chain afresh), sorted again.
func normalized(f *Fake) string {
	lines := strings.Split(ownGen.ReplaceAllString(f.Dump(), "$1"), "\n")
	return strings.Join(lines, "\n")
}

func run(t testing.TB, f *Fake, plan *Plan) {
	t.Helper()
	if err := f.Run(context.Background(), plan.Tx); err != nil {
		t.Fatalf("transaction refused: %v\n%s", err, plan.Tx)
	}
}

// runSplit runs a full plan on f in the three parts of Tx.Split, the
// netlink batch as the same operations in nft -f text.
func runSplit(t testing.TB, f *Fake, plan *Plan) {
	t.Helper()
	pre, bulk, post, ok := plan.Tx.Split()
	if !ok {
		t.Fatal("a full transaction does not split")
	}
	var flushes strings.Builder
	var elems []ElemOp
	for _, o := range bulk {
		if !o.Flush {
			elems = append(elems, o)
			continue
		}
		sc, _ := schemaOf(o.Set)
		kind := "set"
		if sc.verdict || len(sc.value) > 0 {
			kind = "map"
		}
		fmt.Fprintf(&flushes, "flush %s ip %s %s\n", kind, TableName, o.Set)
	}
	for i, tx := range []*Tx{pre, TextTx(knftables.IPv4Family, flushes.String()+ElementTx(knftables.IPv4Family, elems).String()), post} {
		if tx.NumOperations() == 0 {
			continue
		}
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatalf("part %d of 3 refused: %v\n%s", i+1, err, tx)
		}
	}
}

// TestPartialSyncsEqualFullSync applies random changes one partial render
// at a time and checks, after each, that the table equals what a full
// render of the same ports makes in an empty table, and that a full render
// over the live table (a restart, a periodic full sync) gives the same
// again. The Fake refuses what the kernel refuses (an element key with two
// values, a chain deleted while referenced), so every transaction is also
// one nft accepts.
func TestPartialSyncsEqualFullSync(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	rd := mustRenderer(t, testConfig())
	live := NewFake(knftables.IPv4Family, TableName)
	ports := map[proxy.ServicePortName]*proxy.ServicePort{}
	var applied *Applied
	intents := func() map[proxy.ServicePortName]*intent.Port {
		out := map[proxy.ServicePortName]*intent.Port{}
		for n, sp := range ports {
			out[n] = build(t, sp)
		}
		return out
	}
	// shadow follows live, but takes the full renders as System sends
	// them over netlink (Tx.Split).
	shadow := NewFake(knftables.IPv4Family, TableName)
	plan, applied := rd.Render(Input{Full: true, Ports: intents(), Node: testNode}, nil)
	run(t, live, plan)
	runSplit(t, shadow, plan)
	for step := range 300 {
		changed := map[proxy.ServicePortName]*intent.Port{}
		for range 1 + rnd.IntN(4) {
			i := rnd.IntN(40)
			sp := genPort(rnd, i)
			if rnd.IntN(4) == 0 {
				if _, ok := ports[sp.Name]; ok {
					delete(ports, sp.Name)
					changed[sp.Name] = nil
					continue
				}
			}
			ports[sp.Name] = sp
			changed[sp.Name] = build(t, sp)
		}
		plan, next := rd.Render(Input{Ports: changed, Node: testNode}, applied)
		if plan.Full {
			t.Fatalf("step %d: partial render went full", step)
		}
		run(t, live, plan)
		run(t, shadow, plan)
		applied = next

		fresh := NewFake(knftables.IPv4Family, TableName)
		fp, _ := rd.Render(Input{Full: true, Ports: intents(), Node: testNode}, nil)
		run(t, fresh, fp)
		if got, want := normalized(live), normalized(fresh); got != want {
			t.Fatalf("step %d: partial syncs differ from a full sync:\n%s", step, diffLines(got, want))
		}
		if step%50 == 49 {
			// A full sync over the live table (kproxy restarted): the
			// same table, nothing left over.
			ex := existingOf(live)
			fp, next := rd.Render(Input{Full: true, Ports: intents(), Node: testNode, Existing: ex}, nil)
			run(t, live, fp)
			applied = next
			if got, want := normalized(live), normalized(fresh); got != want {
				t.Fatalf("step %d: full sync over the live table differs:\n%s", step, diffLines(got, want))
			}
			sp, _ := rd.Render(Input{Full: true, Ports: intents(), Node: testNode, Existing: existingOf(shadow)}, nil)
			runSplit(t, shadow, sp)
			if got, want := normalized(shadow), normalized(fresh); got != want {
				t.Fatalf("step %d: full sync over the live table in three parts differs:\n%s", step, diffLines(got, want))
			}
		}
	}
}

func existingOf(f *Fake) *Existing {
	all, err := f.ListAll(context.Background())
	if err != nil {
		return nil
	}
	return &Existing{Chains: all["chain"], Sets: all["set"]}
}

func diffLines(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	gs, ws := map[string]bool{}, map[string]bool{}
	for _, l := range g {
		gs[l] = true
	}
	for _, l := range w {
		ws[l] = true
	}
	var b strings.Builder
	for _, l := range g {
		if !ws[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	for _, l := range w {
		if !gs[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	return b.String()
}

// TestEndpointChangeWritesOnlyElements: an endpoint replaced, added or
// removed writes elements only (and the frontends' verdict elements when
// the count changes); no rule, no chain, when some Service already has
// the new count.
func TestEndpointChangeWritesOnlyElements(t *testing.T) {
	rd := mustRenderer(t, testConfig())
	mk := func(eps ...string) *proxy.ServicePort {
		sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP},
			Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, NodePort: 30080, HasAnyEndpoints: len(eps) > 0}
		for _, e := range eps {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, proxy.Endpoint{IP: netip.MustParseAddr(e), Port: 8080, Ready: true, Serving: true})
		}
		return sp
	}
	// Other Services with 3 and 4 endpoints: the shared DNAT chains for 3
	// and 4 endpoints exist whatever web has.
	other := mk("10.244.2.1", "10.244.2.2", "10.244.2.4")
	other.Name.Name, other.ClusterIP, other.NodePort = "other", netip.MustParseAddr("10.96.0.11"), 30081
	four := mk("10.244.3.1", "10.244.3.2", "10.244.3.4", "10.244.3.5")
	four.Name.Name, four.ClusterIP, four.NodePort = "four", netip.MustParseAddr("10.96.0.12"), 30082
	f := NewFake(knftables.IPv4Family, TableName)
	sp := mk("10.244.1.1", "10.244.1.2", "10.244.1.3")
	plan, a := rd.Render(Input{Full: true, Node: testNode, Ports: map[proxy.ServicePortName]*intent.Port{
		sp.Name: build(t, sp), other.Name: build(t, other), four.Name: build(t, four)}}, nil)
	run(t, f, plan)
	for _, tc := range []struct {
		name              string
		eps               []string
		added, deleted    int
		wantVerdictChange bool
	}{
		{"replaced", []string{"10.244.1.1", "10.244.1.2", "10.244.1.9"}, 2, 2, false},
		{"added", []string{"10.244.1.1", "10.244.1.2", "10.244.1.8", "10.244.1.9"}, 6, 4, true},
		{"removed", []string{"10.244.1.1", "10.244.1.2", "10.244.1.8"}, 2, 4, true},
	} {
		sp := mk(tc.eps...)
		plan, next := rd.Render(Input{Node: testNode, Ports: map[proxy.ServicePortName]*intent.Port{sp.Name: build(t, sp)}}, a)
		text := plan.Tx.String()
		if strings.Contains(text, "rule") || strings.Contains(text, " chain ") {
			t.Errorf("%s: writes rules or chains:\n%s", tc.name, text)
		}
		if plan.Stats.AddedElements != tc.added || plan.Stats.DeletedElements != tc.deleted {
			t.Errorf("%s: %d elements added, %d deleted; want %d, %d:\n%s", tc.name, plan.Stats.AddedElements, plan.Stats.DeletedElements, tc.added, tc.deleted, text)
		}
		if got := strings.Contains(strings.ReplaceAll(text, "frontends { 0.0.0.0 . tcp . 0", ""), "frontends"); got != tc.wantVerdictChange {
			t.Errorf("%s: verdict element changed = %v, want %v:\n%s", tc.name, got, tc.wantVerdictChange, text)
		}
		run(t, f, plan)
		a = next
	}
}

// TestFrontendHandover: two Services list one externalIP; the first by
// name owns it, the other is reported; when the owner goes, the other takes
// it over in the same transaction.
func TestFrontendHandover(t *testing.T) {
	rd := mustRenderer(t, testConfig())
	mk := func(name, cip string, ep string) *proxy.ServicePort {
		return &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "http", Protocol: v1.ProtocolTCP},
			Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr(cip), Port: 80,
			ExternalIPs:      []netip.Addr{netip.MustParseAddr("192.168.1.1")},
			ClusterEndpoints: []proxy.Endpoint{{IP: netip.MustParseAddr(ep), Port: 8080, Ready: true, Serving: true}}, HasAnyEndpoints: true}
	}
	a, b := mk("a", "10.96.0.1", "10.244.1.1"), mk("b", "10.96.0.2", "10.244.1.2")
	f := NewFake(knftables.IPv4Family, TableName)
	plan, applied := rd.Render(Input{Full: true, Node: testNode, Ports: map[proxy.ServicePortName]*intent.Port{a.Name: build(t, a), b.Name: build(t, b)}}, nil)
	run(t, f, plan)
	if len(plan.Problems) != 1 || plan.Problems[0].Service.Name != "b" || plan.Problems[0].Reason != "FrontendConflict" {
		t.Errorf("problems %v, want one FrontendConflict for b", plan.Problems)
	}
	if !strings.Contains(f.Dump(), "192.168.1.1 . 80 . 0 : 10.244.1.1 . 8080") {
		t.Errorf("a does not own the externalIP:\n%s", f.Dump())
	}
	plan, _ = rd.Render(Input{Node: testNode, Ports: map[proxy.ServicePortName]*intent.Port{a.Name: nil}}, applied)
	run(t, f, plan)
	if !strings.Contains(f.Dump(), "192.168.1.1 . 80 . 0 : 10.244.1.2 . 8080") {
		t.Errorf("b did not take the externalIP over:\n%s\n%s", plan.Tx, f.Dump())
	}
}
