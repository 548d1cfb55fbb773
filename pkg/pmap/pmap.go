// Package pmap is a persistent ordered map: Clone is O(1), and a change to
// either copy afterwards copies only the few tree nodes it touches (a
// copy-on-write B-tree, github.com/google/btree). kproxy keeps the state
// it publishes from sync to sync in such maps (the cache's ports, each
// intent View's, the nftables renderer's record of what it applied), so
// that a change costs the same at 1,000 and at 100,000 Services: nothing
// is copied whole per sync.
//
// A Map is not safe for concurrent writes. A clone that is no longer
// written may be read concurrently with writes to the original.
package pmap

import (
	"cmp"
	"iter"

	"github.com/google/btree"
)

// Map maps keys to values, in key order.
type Map[K, V any] struct {
	tree *btree.BTreeG[entry[K, V]]
}

type entry[K, V any] struct {
	key   K
	value V
}

// degree: nodes of up to 63 entries, so a change copies a few hundred
// words per tree level.
const degree = 32

// New returns an empty map ordered by less.
func New[K, V any](less func(a, b K) bool) *Map[K, V] {
	return &Map[K, V]{tree: btree.NewG(degree, func(a, b entry[K, V]) bool { return less(a.key, b.key) })}
}

// NewOrdered returns an empty map ordered by <.
func NewOrdered[K cmp.Ordered, V any]() *Map[K, V] {
	return New[K, V](cmp.Less[K])
}

// Get returns the value of k and whether k is present. A nil map is empty.
func (m *Map[K, V]) Get(k K) (V, bool) {
	if m == nil {
		var zero V
		return zero, false
	}
	e, ok := m.tree.Get(entry[K, V]{key: k})
	return e.value, ok
}

// Value returns the value of k, the zero value when absent.
func (m *Map[K, V]) Value(k K) V {
	v, _ := m.Get(k)
	return v
}

// Set sets the value of k; it reports whether k is new.
func (m *Map[K, V]) Set(k K, v V) bool {
	_, replaced := m.tree.ReplaceOrInsert(entry[K, V]{key: k, value: v})
	return !replaced
}

// Delete removes k; it reports whether k was present.
func (m *Map[K, V]) Delete(k K) bool {
	_, ok := m.tree.Delete(entry[K, V]{key: k})
	return ok
}

// Len returns the number of entries. A nil map is empty.
func (m *Map[K, V]) Len() int {
	if m == nil {
		return 0
	}
	return m.tree.Len()
}

// Clone returns a copy in O(1); later changes to either do not show in
// the other.
func (m *Map[K, V]) Clone() *Map[K, V] {
	return &Map[K, V]{tree: m.tree.Clone()}
}

// All yields the entries in key order. A nil map yields nothing.
func (m *Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		if m == nil {
			return
		}
		m.tree.Ascend(func(e entry[K, V]) bool { return yield(e.key, e.value) })
	}
}

// Keys yields the keys in order.
func (m *Map[K, V]) Keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		for k := range m.All() {
			if !yield(k) {
				return
			}
		}
	}
}
