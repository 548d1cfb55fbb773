package proxy

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// SourceHashSlots is the size of the source-hash table every backend
// renders. It is fixed, not sized from the endpoint count: a table whose size
// changed with the endpoints would move almost every client when one
// endpoint comes or goes. 32 is the most the iptables cluster match
// addresses.
const SourceHashSlots = 32

// SourceHashSeed is the seed of the hash of a client's address that picks
// its slot on Linux (the iptables cluster match and nftables' jhash compute
// the same jhash of the source address, scaled to SourceHashSlots): a
// constant, so a client reaches the same endpoint from every node, in
// either mode, and after every restart ("kprx").
const SourceHashSeed = 0x6b707278

// MaxSourceHashEndpoints is the most endpoints a source-hash port spreads
// over: each needs at least one slot. Beyond it backends use random.
const MaxSourceHashEndpoints = SourceHashSlots

// SourceHashTable fills the consistent source-hash table of eps (rendezvous
// hashing with bounded loads, over SourceHashSlots slots): slot i holds the index in eps of
// the endpoint that the clients hashed to slot i reach. It depends only on
// the endpoints' addresses and ports, never on the node, the time or the
// order of eps beyond their sorted order (callers pass the sorted lists
// of ServicePort), so every node builds the same table and a restart keeps
// it. When one endpoint of N is added or removed, about 1/N of the slots
// change hands on average, somewhat more in the worst case
// (TestSourceHashTableDisruption measures it). Each endpoint gets
// at least one slot and at most ⌈32/N⌉. It returns nil when eps is empty or longer than
// MaxSourceHashEndpoints.
func SourceHashTable(eps []Endpoint) []int {
	n := len(eps)
	if n == 0 || n > MaxSourceHashEndpoints {
		return nil
	}
	const m = SourceHashSlots
	// Every (slot, endpoint) pair gets a score from the endpoint's address
	// and port and the slot number (rendezvous hashing). The pairs are
	// taken best score first, each slot going to the first endpoint that
	// still has room: without the cap each slot
	// would go to its best endpoint, which moves only the slots an added
	// endpoint wins (the least possible) but balances poorly over 31 slots;
	// the cap trades a little of the first for the second.
	type pair struct {
		score    uint64
		slot, ep int
	}
	pairs := make([]pair, 0, m*n)
	for e, ep := range eps {
		key := ep.AddrPort().String()
		for s := range m {
			pairs = append(pairs, pair{score: hash64(key, uint16(s)), slot: s, ep: e})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		switch {
		case a.score != b.score:
			return cmp.Compare(b.score, a.score)
		case a.slot != b.slot:
			return a.slot - b.slot
		}
		return a.ep - b.ep
	})
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	load := make([]int, n)
	capacity := (m + n - 1) / n
	for _, p := range pairs {
		if table[p.slot] < 0 && load[p.ep] < capacity {
			table[p.slot] = p.ep
			load[p.ep]++
		}
	}
	// An endpoint the cap left without a slot takes, from an endpoint with
	// more than one, the slot it scores best on.
	for e := range n {
		if load[e] > 0 {
			continue
		}
		best := -1
		for s := range m {
			if load[table[s]] > 1 && (best < 0 || score(eps[e], s) > score(eps[e], best)) {
				best = s
			}
		}
		load[table[best]]--
		table[best] = e
		load[e]++
	}
	return table
}

// score ranks ep for slot s.
func score(ep Endpoint, s int) uint64 { return hash64(ep.AddrPort().String(), uint16(s)) }

// hash64 is FNV-1a of key after a two-byte salt: stable across versions,
// platforms and processes.
func hash64(key string, salt uint16) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte{byte(salt >> 8), byte(salt)})
	_, _ = h.Write([]byte(key))
	return h.Sum64()
}
