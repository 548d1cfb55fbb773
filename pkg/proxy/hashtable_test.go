package proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func hashEndpoints(r *rand.Rand, n int) []Endpoint {
	seen := map[netip.Addr]bool{}
	var eps []Endpoint
	for len(eps) < n {
		a := netip.AddrFrom4([4]byte{10, 244, byte(r.IntN(256)), byte(1 + r.IntN(254))})
		if !seen[a] {
			seen[a] = true
			eps = append(eps, Endpoint{IP: a, Port: 8080})
		}
	}
	SortEndpoints(eps)
	return eps
}

// owners maps each slot to its endpoint's address, to compare tables built
// from different endpoint lists.
func owners(eps []Endpoint, table []int) []netip.AddrPort {
	out := make([]netip.AddrPort, len(table))
	for i, e := range table {
		out[i] = eps[e].AddrPort()
	}
	return out
}

// TestSourceHashTableBalanced: every endpoint gets at least one slot and at
// most ⌈32/N⌉, for every N the table serves (the fewest seen is logged).
func TestSourceHashTableBalanced(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= MaxSourceHashEndpoints; n++ {
		fewest := SourceHashSlots
		for range 200 {
			eps := hashEndpoints(r, n)
			table := SourceHashTable(eps)
			counts := make([]int, n)
			for _, e := range table {
				counts[e]++
			}
			lo, hi := slices.Min(counts), slices.Max(counts)
			fewest = min(fewest, lo)
			if lo < 1 || hi > (SourceHashSlots+n-1)/n {
				t.Fatalf("N=%d: slots per endpoint %v", n, counts)
			}
		}
		t.Logf("N=%d: at most %d slots, fewest seen %d", n, (SourceHashSlots+n-1)/n, fewest)
	}
	if SourceHashTable(nil) != nil || SourceHashTable(make([]Endpoint, MaxSourceHashEndpoints+1)) != nil {
		t.Error("empty or too long lists must give no table")
	}
}

// TestSourceHashTableDeterministic: the table is a pure function of the
// endpoint set (same input, same table; no seed from the process).
func TestSourceHashTableDeterministic(t *testing.T) {
	eps := []Endpoint{
		{IP: netip.MustParseAddr("10.244.1.5"), Port: 80},
		{IP: netip.MustParseAddr("10.244.2.5"), Port: 80},
		{IP: netip.MustParseAddr("10.244.3.5"), Port: 80},
	}
	// Pinned: a change here moves clients on every node at upgrade time.
	want := "[1 0 0 2 1 0 2 1 0 1 1 2 1 1 2 2 1 2 1 0 0 1 0 0 2 0 2 2 2 0 1 0]"
	if got := fmt.Sprint(SourceHashTable(eps)); got != want {
		t.Errorf("table %s, want %s", got, want)
	}
}

// TestSourceHashTableDisruption measures, over many random endpoint sets,
// the share of slots (so of client addresses) that change endpoint when one
// endpoint is added to N or removed from N+1. The ideal is 1/(N+1): only the
// slots the new endpoint takes. The bound checked is the (at most
// 30% for 4 → 5) and, for every N, 1/(N+1) plus 12 points, worst case.
func TestSourceHashTableDisruption(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := 1; n <= 12; n++ {
		worst, total := 0.0, 0.0
		const rounds = 300
		for range rounds {
			eps := hashEndpoints(r, n+1)
			extra := r.IntN(n + 1)
			fewer := slices.Delete(slices.Clone(eps), extra, extra+1)
			before := owners(fewer, SourceHashTable(fewer))
			after := owners(eps, SourceHashTable(eps))
			moved := 0
			for i := range before {
				if before[i] != after[i] {
					moved++
				}
			}
			f := float64(moved) / SourceHashSlots
			worst = max(worst, f)
			total += f
		}
		ideal := 1 / float64(n+1)
		t.Logf("N=%d → %d: moved mean %.1f%% worst %.1f%% (ideal %.1f%%)", n, n+1, 100*total/rounds, 100*worst, 100*ideal)
		if mean := total / rounds; mean > ideal+0.15 || worst > ideal+0.30 {
			t.Errorf("N=%d → %d: mean %.1f%% worst %.1f%% moved", n, n+1, 100*mean, 100*worst)
		}
		if n == 4 && total/rounds > 0.26 {
			t.Errorf("4 → 5: mean %.1f%% moved, over 26%%", 100*total/rounds)
		}
	}
}
