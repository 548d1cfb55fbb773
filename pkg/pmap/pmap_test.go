package pmap

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestClonesAreIndependent: after Clone, random changes to the original
// and to the clone never show in the other, and each iterates in key
// order, as two plain maps would.
func TestClonesAreIndependent(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	a := NewOrdered[int, int]()
	ref := map[int]int{}
	var clones []*Map[int, int]
	var refs []map[int]int
	for step := range 3000 {
		k := rnd.IntN(500)
		if rnd.IntN(4) == 0 {
			if a.Delete(k) != (func() bool { _, ok := ref[k]; return ok })() {
				t.Fatalf("step %d: Delete(%d) disagrees with the map", step, k)
			}
			delete(ref, k)
		} else {
			_, had := ref[k]
			if a.Set(k, step) == had {
				t.Fatalf("step %d: Set(%d) says new=%v", step, k, !had)
			}
			ref[k] = step
		}
		if step%300 == 0 {
			clones = append(clones, a.Clone())
			refs = append(refs, maps.Clone(ref))
			// A clone written to does not change the original either.
			c := a.Clone()
			c.Set(-1, -1)
			c.Delete(k)
			if _, ok := a.Get(-1); ok || a.Value(k) != ref[k] {
				t.Fatalf("step %d: a write to a clone shows in the original", step)
			}
		}
	}
	check := func(m *Map[int, int], want map[int]int) {
		t.Helper()
		if m.Len() != len(want) {
			t.Fatalf("len %d, want %d", m.Len(), len(want))
		}
		keys := slices.Collect(m.Keys())
		if !slices.Equal(keys, slices.Sorted(maps.Keys(want))) {
			t.Fatalf("keys not the map's, in order")
		}
		for k, v := range m.All() {
			if want[k] != v {
				t.Fatalf("%d = %d, want %d", k, v, want[k])
			}
		}
	}
	check(a, ref)
	for i := range clones {
		check(clones[i], refs[i])
	}
	var nilMap *Map[int, int]
	if nilMap.Len() != 0 || nilMap.Value(3) != 0 {
		t.Error("a nil map is not empty")
	}
}
