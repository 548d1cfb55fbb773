package linux

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/conntrack"
	v1 "k8s.io/api/core/v1"
)

func ctFilter(dst string, keep ...string) conntrack.Filter {
	f := conntrack.Filter{Protocol: v1.ProtocolUDP, OrigDst: netip.MustParseAddrPort(dst)}
	for _, k := range keep {
		f.Keep = append(f.Keep, netip.MustParseAddrPort(k))
	}
	return f
}

func TestConntrackQueueNewestKeepSetWins(t *testing.T) {
	var q conntrackQueue
	// A failed plan kept pod-a; a later plan (pod-a gone) keeps only pod-b.
	q.add([]conntrack.Filter{ctFilter("10.96.0.1:53", "10.244.1.1:53")})
	q.add([]conntrack.Filter{ctFilter("10.96.0.1:53", "10.244.2.1:53")})
	if q.len() != 1 {
		t.Fatalf("%d filters queued for one frontend, want 1", q.len())
	}
	m := conntrack.NewMatcher(q.filters())
	flow := func(reply string) conntrack.Flow {
		return conntrack.Flow{Protocol: v1.ProtocolUDP, OrigDst: netip.MustParseAddrPort("10.96.0.1:53"), ReplySrc: netip.MustParseAddrPort(reply)}
	}
	if !m.Match(flow("10.244.1.1:53")) {
		t.Error("a flow to the endpoint removed since the failed plan survives the retry")
	}
	if m.Match(flow("10.244.2.1:53")) {
		t.Error("a flow to the current endpoint is deleted")
	}
	// Filters of one plan on the same frontend merge.
	q.add([]conntrack.Filter{ctFilter("10.96.0.1:53", "10.244.2.1:53"), ctFilter("10.96.0.1:53", "10.244.3.1:53")})
	m = conntrack.NewMatcher(q.filters())
	if m.Match(flow("10.244.2.1:53")) || m.Match(flow("10.244.3.1:53")) {
		t.Error("filters of one plan on one frontend did not merge")
	}
}

func TestConntrackQueueIsBounded(t *testing.T) {
	var q conntrackQueue
	addr := func(i int) string {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 53).String()
	}
	for i := range maxPendingConntrack + 500 {
		q.add([]conntrack.Filter{ctFilter(addr(i))})
	}
	if q.len() != maxPendingConntrack {
		t.Fatalf("%d frontends queued, want the cap %d", q.len(), maxPendingConntrack)
	}
	// The newest survive.
	if _, ok := q.byKey[keyOf(ctFilter(addr(maxPendingConntrack+499)))]; !ok {
		t.Error("the newest filter was dropped")
	}
	if _, ok := q.byKey[keyOf(ctFilter(addr(0)))]; ok {
		t.Error("the oldest filter was kept")
	}
}
