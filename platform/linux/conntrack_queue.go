package linux

import (
	"maps"
	"slices"

	"github.com/kproxy/kproxy/platform/linux/conntrack"
)

// maxPendingConntrack bounds the frontends whose stale-flow cleanup waits
// for a later sync (after failed cleanups); beyond it the oldest are dropped
// (their flows then age out on their own conntrack timeouts).
const maxPendingConntrack = 20000

// conntrackQueue holds the conntrack cleanups still to do, one filter per
// frontend (protocol and original destination). A later plan's filter for a
// frontend replaces an earlier one: its keep-set (the endpoints then in use)
// is the newest truth. Filters of one plan for the same frontend merge.
type conntrackQueue struct {
	byKey map[conntrackKey]queued
	seq   uint64
}

type conntrackKey struct {
	proto string
	dst   string
}

type queued struct {
	f   conntrack.Filter
	seq uint64
}

func keyOf(f conntrack.Filter) conntrackKey {
	return conntrackKey{string(f.Protocol), f.OrigDst.String()}
}

// add queues the filters of one plan.
func (q *conntrackQueue) add(filters []conntrack.Filter) {
	if len(filters) == 0 {
		return
	}
	if q.byKey == nil {
		q.byKey = map[conntrackKey]queued{}
	}
	q.seq++
	for _, f := range filters {
		k := keyOf(f)
		if cur, ok := q.byKey[k]; ok && cur.seq == q.seq {
			// Same plan: a flow survives when any filter keeps it.
			cur.f.Keep = append(slices.Clip(cur.f.Keep), f.Keep...)
			q.byKey[k] = cur
			continue
		}
		q.byKey[k] = queued{f: f, seq: q.seq}
	}
	if over := len(q.byKey) - maxPendingConntrack; over > 0 {
		old := slices.SortedFunc(maps.Keys(q.byKey), func(a, b conntrackKey) int {
			return int(q.byKey[a].seq) - int(q.byKey[b].seq)
		})
		for _, k := range old[:over] {
			delete(q.byKey, k)
		}
	}
}

func (q *conntrackQueue) empty() bool { return len(q.byKey) == 0 }
func (q *conntrackQueue) len() int    { return len(q.byKey) }
func (q *conntrackQueue) clear()      { clear(q.byKey) }

// filters returns the queued filters.
func (q *conntrackQueue) filters() []conntrack.Filter {
	out := make([]conntrack.Filter, 0, len(q.byKey))
	for _, e := range q.byKey {
		out = append(out, e.f)
	}
	return out
}
