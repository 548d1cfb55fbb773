package linux

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/test/proxytest"
)

func leastConnection(_ *proxytest.Topology, svc *v1.Service, _ int) {
	svc.Annotations = map[string]string{proxy.AnnotationLoadBalancing: string(proxy.AlgorithmLeastConnection)}
}

// TestLeastConnectionRefresh: the backend reads conntrack only when a
// least-connection port exists and a read is due; counts that changed
// rewrite that port's rules (the busy endpoint's share drops to 1/52 with
// 50 established connections), and a sync of unchanged counts writes
// nothing.
func TestLeastConnectionRefresh(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("plain", 1, proxytest.Ready(proxytest.PodB1))
	w.mustSync(true)
	if w.ct.Counts != 0 {
		t.Fatalf("conntrack read %d times without least-connection Services", w.ct.Counts)
	}

	w.set("lc", 2, proxytest.Ready(proxytest.PodB1, proxytest.PodB2), leastConnection)
	w.mustSync(false)
	if w.ct.Counts != 1 {
		t.Fatalf("conntrack read %d times, want 1", w.ct.Counts)
	}
	b1, _ := w.topo.Host(proxytest.PodB1)
	busy := netip.AddrPortFrom(b1.IPv4, proxytest.EchoPort)
	even := "--probability 0.50000000000 -j DNAT --to-destination " + busy.String()
	if !strings.Contains(w.ipt.Dump(), even) {
		t.Fatalf("without connections want %q in:\n%s", even, w.ipt.Dump())
	}

	for range 50 {
		w.ct.Flows[v1.IPv4Protocol] = append(w.ct.Flows[v1.IPv4Protocol], conntrack.Flow{Protocol: v1.ProtocolTCP,
			OrigDst: netip.MustParseAddrPort("10.96.0.2:80"), ReplySrc: busy, Established: true})
	}
	// Not due yet: the last read was just now.
	snap, _ := w.cache.Snapshot()
	if err := syncSnap(context.Background(), w.b, snap, proxy.Changes{}); err != nil {
		t.Fatal(err)
	}
	if w.ct.Counts != 1 || !strings.Contains(w.ipt.Dump(), even) {
		t.Fatalf("a read before LeastConnRefresh: %d reads", w.ct.Counts)
	}
	w.b.lc.at = w.b.lc.at.Add(-LeastConnRefresh)
	if err := syncSnap(context.Background(), w.b, snap, proxy.Changes{}); err != nil {
		t.Fatal(err)
	}
	weighted := "--probability " + "0.01923076902" + " -j DNAT --to-destination " + busy.String()
	if w.ct.Counts != 2 || !strings.Contains(w.ipt.Dump(), weighted) {
		t.Fatalf("after the refresh (%d reads) want %q in:\n%s", w.ct.Counts, weighted, w.ipt.Dump())
	}
	if last := w.b.Last(); last.Full || last.Stats.WrittenChains != 1 {
		t.Errorf("the refresh wrote %d chains (full %v), want only the port's service chain", last.Stats.WrittenChains, last.Full)
	}
	w.checkMatchesFullPlanWith(w.b.lc.conns)

	// Same counts again: nothing written.
	w.b.lc.at = w.b.lc.at.Add(-LeastConnRefresh)
	if err := syncSnap(context.Background(), w.b, snap, proxy.Changes{}); err != nil {
		t.Fatal(err)
	}
	if w.ct.Counts != 3 || w.b.Last().Stats.WrittenChains != 0 {
		t.Errorf("unchanged counts: %d reads, %d chains written", w.ct.Counts, w.b.Last().Stats.WrittenChains)
	}
}

// TestLeastConnectionCostCap: a slow read pushes the next one out to ten
// times its duration.
func TestLeastConnectionCostCap(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("lc", 2, proxytest.Ready(proxytest.PodB1, proxytest.PodB2), leastConnection)
	w.mustSync(true)
	w.b.lc.cost = 2 * time.Second
	w.b.lc.at = time.Now().Add(-10 * time.Second)
	snap, _ := w.cache.Snapshot()
	if err := syncSnap(context.Background(), w.b, snap, proxy.Changes{}); err != nil {
		t.Fatal(err)
	}
	if w.ct.Counts != 1 {
		t.Errorf("read again 10 s after a 2 s read: %d reads, want 1 (next after 20 s)", w.ct.Counts)
	}
}

// TestLeastConnectionReadsOnEndpointChange: a change of a least-connection
// port reads the counts at once (new endpoints are weighted from the
// start), without waiting for LeastConnRefresh.
func TestLeastConnectionReadsOnEndpointChange(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("lc", 2, proxytest.Ready(proxytest.PodB1), leastConnection)
	w.mustSync(true)
	w.set("other", 3, proxytest.Ready(proxytest.PodB1))
	w.mustSync(false)
	if w.ct.Counts != 1 {
		t.Fatalf("a change of another Service read conntrack: %d reads", w.ct.Counts)
	}
	w.set("lc", 2, proxytest.Ready(proxytest.PodB1, proxytest.PodB2), leastConnection)
	w.mustSync(false)
	if w.ct.Counts != 2 {
		t.Errorf("a new endpoint did not read the counts: %d reads", w.ct.Counts)
	}
}

// TestLeastConnectionTracksChangedPorts: the least-connection ports are
// kept from the changed ports of each sync, and equal those of the whole
// view after ports become, stay and stop being least-connection ones.
func TestLeastConnectionTracksChangedPorts(t *testing.T) {
	name := func(s string) proxy.ServicePortName {
		return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: s}, Protocol: v1.ProtocolTCP}
	}
	port := func(s string, alg proxy.Algorithm, proto v1.Protocol) *proxy.ServicePort {
		n := name(s)
		n.Protocol = proto
		return &proxy.ServicePort{Name: n, Protocol: proto, Algorithm: alg}
	}
	steps := []map[string]*proxy.ServicePort{
		{"a": port("a", proxy.AlgorithmLeastConnection, v1.ProtocolTCP), "b": port("b", "", v1.ProtocolTCP)},
		{"a": port("a", proxy.AlgorithmLeastConnection, v1.ProtocolTCP), "b": port("b", proxy.AlgorithmLeastConnection, v1.ProtocolTCP)},
		{"a": port("a", proxy.AlgorithmRoundRobin, v1.ProtocolTCP), "b": port("b", proxy.AlgorithmLeastConnection, v1.ProtocolTCP)},
		{"b": port("b", proxy.AlgorithmLeastConnection, v1.ProtocolTCP), "c": port("c", proxy.AlgorithmLeastConnection, v1.ProtocolUDP)},
		{},
	}
	var lc leastConn
	prev := map[string]*proxy.ServicePort{}
	for i, step := range steps {
		m := map[proxy.ServicePortName]*proxy.ServicePort{}
		ch := proxy.Changes{Full: i == 0, Ports: map[proxy.ServicePortName]struct{}{}}
		for k, p := range step {
			m[name(k)] = p
			if q := prev[k]; q == nil || q.Algorithm != p.Algorithm {
				ch.Ports[name(k)] = struct{}{}
			}
		}
		for k := range prev {
			if step[k] == nil {
				ch.Ports[name(k)] = struct{}{}
			}
		}
		lc.track(proxy.NewFamilyView(v1.IPv4Protocol, m), ch)
		want := map[proxy.ServicePortName]bool{}
		for n, p := range m {
			if leastConnPort(p) {
				want[n] = true
			}
		}
		if len(lc.ports) != len(want) {
			t.Fatalf("step %d: tracked %v, want %v", i, lc.ports, want)
		}
		for n := range lc.ports {
			if !want[n] {
				t.Fatalf("step %d: tracked %v, want %v", i, lc.ports, want)
			}
		}
		prev = step
	}
}
