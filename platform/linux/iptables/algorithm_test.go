package iptables

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/linux/trace"
)

// traceOne traces one first packet from src to dst and returns its single
// outcome's destination (failing when the outcome is not single).
func traceOne(t *testing.T, rs *iptmodel.Ruleset, h trace.Host, src netip.Addr, dst string) string {
	t.Helper()
	d := netip.MustParseAddrPort(dst)
	out, err := rs.Trace(h, trace.Packet{Src: src, Dst: d.Addr(), Proto: "tcp", SrcPort: 40000, DstPort: d.Port()})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Verdict != trace.VerdictDNAT || !out[0].DNAT {
		t.Fatalf("%s → %s: outcomes %v, want exactly one DNAT", src, dst, out)
	}
	return out[0].Dst.String()
}

var algoEndpoints = []proxy.Endpoint{ep(podLocal, 8080, true), ep(podRemote1, 8080, false), ep(podRemote2, 8080, false)}

// TestTraceRoundRobin: one client, 30 sequential connections to 3 endpoints
// → exactly 10 each, in turn; through the ClusterIP and the NodePort (the
// counters are per rule: the NodePort's chain jumps to the same service
// chain, so both frontends share one rotation).
func TestTraceRoundRobin(t *testing.T) {
	sp := svc("ns/rr", "10.96.0.31", 80, v1.ProtocolTCP, withNodePort(30031), withAlgorithm(proxy.AlgorithmRoundRobin), withEndpoints(algoEndpoints...))
	rs, h := tracePlan(t, testConfig(v1.IPv4Protocol), view(v1.IPv4Protocol, sp), false)
	counts := map[string]int{}
	var order []string
	for i := range 30 {
		dst := "10.96.0.31:80"
		if i%2 == 1 {
			dst = node1IP.String() + ":30031"
		}
		got := traceOne(t, rs, h, clientPod, dst)
		counts[got]++
		if i < 6 {
			order = append(order, got)
		}
	}
	for _, e := range algoEndpoints {
		if counts[e.String()] != 10 {
			t.Errorf("counts %v, want 10 each", counts)
			break
		}
	}
	want := "10.244.1.5:8080 10.244.2.5:8080 10.244.2.6:8080 10.244.1.5:8080 10.244.2.5:8080 10.244.2.6:8080"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("order %s, want %s", got, want)
	}
}

// TestTraceRoundRobinEveryN: the rotation is exact for every endpoint count.
func TestTraceRoundRobinEveryN(t *testing.T) {
	for n := 1; n <= 7; n++ {
		var eps []proxy.Endpoint
		for i := range n {
			eps = append(eps, ep(fmt.Sprintf("10.244.2.%d", 10+i), 8080, false))
		}
		sp := svc("ns/rr", "10.96.0.31", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmRoundRobin), withEndpoints(eps...))
		rs, h := tracePlan(t, testConfig(v1.IPv4Protocol), view(v1.IPv4Protocol, sp), false)
		for i := range 3 * n {
			if got, want := traceOne(t, rs, h, clientPod, "10.96.0.31:80"), eps[i%n].String(); got != want {
				t.Fatalf("n=%d connection %d went to %s, want %s", n, i, got, want)
			}
		}
	}
}

// TestTraceSourceHash: every client address reaches exactly one endpoint,
// the one the table predicts for its kernel hash slot, through the
// ClusterIP and the NodePort, and the same from a fresh planner and kernel
// (another node, or a restart); ClientIP affinity wins over source-hash.
func TestTraceSourceHash(t *testing.T) {
	sp := svc("ns/sh", "10.96.0.32", 80, v1.ProtocolTCP, withNodePort(30032), withAlgorithm(proxy.AlgorithmSourceHash), withEndpoints(algoEndpoints...))
	table := proxy.SourceHashTable(algoEndpoints)
	node1, h1 := tracePlan(t, testConfig(v1.IPv4Protocol), view(v1.IPv4Protocol, sp), false)
	// A second planner and kernel: what another node or a restarted kproxy
	// builds (the rules hold nothing of the node but its addresses).
	restarted, h2 := tracePlan(t, testConfig(v1.IPv4Protocol), view(v1.IPv4Protocol, sp), false)
	seen := map[string]int{}
	for i := range 200 {
		src := netip.AddrFrom4([4]byte{10, 244, byte(3 + i/250), byte(1 + i%250)})
		want := algoEndpoints[table[trace.ClusterSlot(src, clusterSeed, proxy.SourceHashSlots)]].String()
		for _, dst := range []string{"10.96.0.32:80", node1IP.String() + ":30032"} {
			if got := traceOne(t, node1, h1, src, dst); got != want {
				t.Fatalf("%s → %s: %s, want %s", src, dst, got, want)
			}
		}
		if got := traceOne(t, restarted, h2, src, "10.96.0.32:80"); got != want {
			t.Fatalf("%s after restart: %s, want %s", src, got, want)
		}
		seen[want]++
	}
	if len(seen) != 3 {
		t.Errorf("200 clients reached %v, want all 3 endpoints", seen)
	}

	sticky := svc("ns/sh", "10.96.0.32", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmSourceHash), withAffinity(60), withEndpoints(algoEndpoints...))
	rs, h := tracePlan(t, testConfig(v1.IPv4Protocol), view(v1.IPv4Protocol, sticky), false)
	out, err := rs.Trace(h, trace.Packet{Src: clientPod, Dst: a("10.96.0.32"), Proto: "tcp", SrcPort: 1, DstPort: 80})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 {
		t.Errorf("with affinity a new client is placed at random over 3 endpoints, got %v", out)
	}
}

// TestSourceHashTooManyEndpoints: past 32 endpoints the port is random, and
// the plan says so.
func TestSourceHashTooManyEndpoints(t *testing.T) {
	var eps []proxy.Endpoint
	for i := range proxy.MaxSourceHashEndpoints + 1 {
		eps = append(eps, ep(fmt.Sprintf("10.244.2.%d", 10+i), 8080, false))
	}
	sp := svc("ns/big", "10.96.0.40", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmSourceHash), withEndpoints(eps...))
	plan := planned(mustPlanner(t, testConfig(v1.IPv4Protocol)), fullInput(view(v1.IPv4Protocol, sp)))
	if len(problems(plan)) != 1 || !strings.Contains(problems(plan)[0].Message, "source-hash spreads over at most 32 endpoints, 33 here: using random") ||
		problems(plan)[0].Reason != intent.ReasonSourceHashTooManyEndpoints {
		t.Errorf("problems %q", problems(plan))
	}
	if strings.Contains(string(plan.Restore), "-m cluster") || !strings.Contains(string(plan.Restore), "--mode random") {
		t.Errorf("want random rules:\n%s", plan.Restore)
	}
}

// TestLeastConnection: weighted random from the conntrack counts: with one
// endpoint holding 50 connections, ≥ 80% (here 98%) of new connections go to
// the other (51/52); without counts the spread is even; counts that change reach the
// kernel through a partial plan of that port.
func TestLeastConnection(t *testing.T) {
	two := []proxy.Endpoint{ep(podRemote1, 8080, false), ep(podRemote2, 8080, false)}
	sp := svc("ns/lc", "10.96.0.41", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmLeastConnection), withEndpoints(two...))
	v := view(v1.IPv4Protocol, sp)
	p := mustPlanner(t, testConfig(v1.IPv4Protocol))
	rs := iptmodel.New()
	share := func() map[string]float64 {
		t.Helper()
		out, err := rs.Trace(trace.Host{}, trace.Packet{Src: clientPod, Dst: a("10.96.0.41"), Proto: "tcp", SrcPort: 1, DstPort: 80})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for _, o := range out {
			m[o.Dst.String()] += o.Probability
		}
		return m
	}
	plan := planned(p, fullInput(v))
	if len(problems(plan)) > 0 {
		t.Fatal(problems(plan))
	}
	kernel(t, rs, plan)
	if got := share(); math.Abs(got[podRemote1+":8080"]-0.5) > 1e-6 {
		t.Errorf("without counts: %v, want even", got)
	}
	busy := netip.MustParseAddrPort(podRemote1 + ":8080")
	in := testInput{View: v, Changes: changed(sp.Name), Connections: map[proxy.ServicePortName]map[netip.AddrPort]int{sp.Name: {busy: 50}}}
	in.Node, in.LocalAddrs = nodeFor(v1.IPv4Protocol)
	plan = planned(p, in)
	if plan.Stats.WrittenChains == 0 {
		t.Fatalf("new counts rewrote nothing:\n%s", plan.Restore)
	}
	kernel(t, rs, plan)
	got := share()
	if idle := got[podRemote2+":8080"]; idle < 0.8 || math.Abs(idle-51.0/52) > 1e-6 {
		t.Errorf("with 50 connections on %s: %v, want 51/52 to the idle endpoint (weights 1/51 and 1)", busy, got)
	}
	if want := "--probability " + savedProbability(1.0/52) + " -j DNAT --to-destination " + busy.String(); !strings.Contains(string(plan.Restore), want) {
		t.Errorf("want %q in:\n%s", want, plan.Restore)
	}
}

// TestLeastConnectionWeights: three endpoints, the probabilities chain to
// the weights 1/(1+c).
func TestLeastConnectionWeights(t *testing.T) {
	eps := []proxy.Endpoint{ep("10.244.2.1", 80, false), ep("10.244.2.2", 80, false), ep("10.244.2.3", 80, false)}
	conns := map[netip.AddrPort]int{eps[0].AddrPort(): 1, eps[1].AddrPort(): 3}
	w := intent.LeastConnectionWeights(eps, conns)
	want := []float64{0.5, 0.25, 1}
	for i := range w {
		if math.Abs(w[i]-want[i]) > 1e-12 {
			t.Fatalf("weights %v, want %v", w, want)
		}
	}
	sp := svc("ns/lc", "10.96.0.41", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmLeastConnection), withEndpoints(eps...))
	in := fullInput(view(v1.IPv4Protocol, sp))
	in.Connections = map[proxy.ServicePortName]map[netip.AddrPort]int{sp.Name: conns}
	rs := iptmodel.New()
	kernel(t, rs, planned(mustPlanner(t, testConfig(v1.IPv4Protocol)), in))
	out, err := rs.Trace(trace.Host{}, trace.Packet{Src: clientPod, Dst: a("10.96.0.41"), Proto: "tcp", SrcPort: 1, DstPort: 80})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		i := slices.IndexFunc(eps, func(e proxy.Endpoint) bool { return e.AddrPort() == o.Dst })
		if math.Abs(o.Probability-want[i]/1.75) > 1e-6 {
			t.Errorf("%s: probability %v, want %v", o.Dst, o.Probability, want[i]/1.75)
		}
	}
}
