package model

// The packet tracer: it follows the first packet of a new connection
// through the base chains of a Model (the Fake's table, or one read back
// from a node), evaluating its typed rules and elements (package nft), and
// returns every possible outcome with its probability and the path that
// leads to it. Every rule and element of the table is checked before any
// packet is traced: a form the tracer does not model is an error
// (NewTracer), never a rule silently skipped, so a trace never "reaches"
// what it did not simulate.
//
// What it models, as the kernel does it for the first packet of a
// connection:
//
//   - hooks: an arriving packet meets the base chains of hook prerouting,
//     then input (delivered to a local address) or forward and
//     postrouting; a packet the node sends meets output, then postrouting
//     (and input when its destination is local). Base chains of one hook
//     run in priority order; accept ends one base chain, drop and reject
//     end the packet. The routing decision is taken after the DNAT.
//   - jump (a return point is pushed), goto (none: the chain's end or a
//     return goes back to the last jump), return, drop, accept, reject,
//     verdict maps (vmap: no element, no match), masquerade, dnat to a
//     constant address or through a data map (no element, no match), meta
//     mark set, update @set; an opaque rule (a rule read back from a node
//     that could not be read, see Opaque) ends the branch with
//     trace.VerdictUnknown: the tracer never goes past what it cannot
//     simulate.
//   - matches: addresses against constants, prefixes, anonymous and named
//     sets (interval sets by containment), concatenations (hairpin), meta
//     l4proto, th/tcp/udp/sctp ports (a protocol's header on another
//     protocol's packet does not match), iifname with its "*" wildcard,
//     fib saddr/daddr type (local: trace.Host.LocalAddrs and loopback),
//     meta mark with & masks, ct state (a first packet is new), ct status
//     (dnat once DNATed).
//   - numgen random mod N: every value, each with probability 1/N (a
//     comparison against a constant is split analytically: "numgen random
//     mod 2147483648 < X" matches with probability X/2^31); numgen inc mod N:
//     with trace.Host.Counters, the kernel's per-expression counter (it
//     starts at N-1, so the first evaluation yields 0, and counts every
//     evaluation);
//     without, every value as for random, noted as a rotation; jhash ADDR mod
//     N seed S: the kernel's jhash of the address bytes with the seed, scaled
//     with reciprocal_scale (trace.ClusterSlot, checked against the
//     kernel's xt_cluster, computes the same function).
//   - session affinity: "ip saddr @S" holds when trace.Host.AffinityHit[S]
//     (or the set's elements hold the source); "update @S { ip saddr }" is
//     reported in trace.Outcome.AffinitySets.
//
// The package's files, by role: this one builds a Tracer from a Model
// (NewTracer: check everything, every reference); check.go says what the
// tracer models of the typed values; parse.go is the Fake's reader of nft
// -f text into them, json.go the reader of the kernel's JSON listing
// (values.go has helpers on values); eval.go walks packets through them, on
// the packet, host, branch and outcome types of platform/linux/trace.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// CounterKey names the counter of a numgen inc expression: its chain and
// rule position from 1 ("port-...-eps-cluster-3 #1"); a second numgen inc
// in the same rule gets ".2" and so on.
func CounterKey(chain string, rule, nth int) string {
	if nth <= 1 {
		return fmt.Sprintf("%s #%d", chain, rule)
	}
	return fmt.Sprintf("%s #%d.%d", chain, rule, nth)
}

// Tracer traces packets through one family's table. It is read-only after
// NewTracer and safe for concurrent use.
type Tracer struct {
	ip     string // "ip" or "ip6"
	chains map[string]*tchain
	sets   map[string]*tset
	// hooks holds the base chains of each hook in priority order.
	hooks map[string][]*tchain
	// visit, when set (tests), is called with every rule evaluated.
	visit func(chain string, rule int)
}

type tchain struct {
	name string
	// BaseChain is the base chain's spec (Hook "" for a regular chain).
	nft.BaseChain
	rules []*trule
}

type trule struct {
	text  string
	num   int // position from 1
	stmts nft.Rule
}

type tset struct {
	name  string
	isMap bool
	elems []telem
	// index holds the elements by canonical key, when no key part is a
	// prefix (otherwise lookups scan elems).
	index map[string]*telem
}

// telem is an element and its text ("key : value").
type telem struct {
	nft.Elem
	text string
}

// NewTracer parses every chain, rule, set and element of m (a table of
// family fam) and returns a tracer over it. Any rule or element form the
// tracer does not model, a reference to a missing chain or set, or a rule
// of the other family is an error.
func NewTracer(fam knftables.Family, m *Model) (*Tracer, error) {
	if m == nil {
		return nil, errors.New("no table")
	}
	t := &Tracer{chains: map[string]*tchain{}, sets: map[string]*tset{}, hooks: map[string][]*tchain{}}
	switch fam {
	case knftables.IPv4Family:
		t.ip = "ip"
	case knftables.IPv6Family:
		t.ip = "ip6"
	default:
		return nil, fmt.Errorf("family %q: the tracer models ip and ip6 tables", fam)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(m.Sets)) {
		s := m.Sets[name]
		ts := &tset{name: name, isMap: s.IsMap}
		t.sets[name] = ts
		for _, id := range slices.Sorted(maps.Keys(s.Elements)) {
			e := s.Elements[id]
			if err := checkElem(s, e); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: element %s: %w", kindName(s.IsMap), name, id, err))
				continue
			}
			ts.elems = append(ts.elems, telem{Elem: e, text: e.String()})
		}
	}
	for _, ts := range t.sets {
		if slices.ContainsFunc(ts.elems, func(e telem) bool {
			return slices.ContainsFunc(e.Key, func(k nft.Value) bool { return k.Kind == nft.KindPrefix })
		}) {
			continue
		}
		ts.index = make(map[string]*telem, len(ts.elems))
		for i := range ts.elems {
			ts.index[indexKey(ts.elems[i].Key)] = &ts.elems[i]
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.Chains)) {
		c := m.Chains[name]
		tc := &tchain{name: name}
		if c.Base != nil {
			if err := checkBase(*c.Base); err != nil {
				errs = append(errs, fmt.Errorf("chain %s: %w", name, err))
				continue
			}
			tc.BaseChain = *c.Base
			t.hooks[tc.Hook] = append(t.hooks[tc.Hook], tc)
		}
		for i, r := range c.Rules {
			if err := checkRule(t.ip, r); err != nil {
				errs = append(errs, fmt.Errorf("chain %s rule %d (%s): %w", name, i+1, r, err))
				continue
			}
			tc.rules = append(tc.rules, &trule{text: r.String(), num: i + 1, stmts: r})
		}
		t.chains[name] = tc
	}
	for _, hs := range t.hooks {
		slices.SortStableFunc(hs, func(a, b *tchain) int { return cmp.Compare(a.Priority, b.Priority) })
	}
	// References: every chain a rule or verdict element points at, every
	// set a rule reads.
	for _, c := range t.chains {
		for _, r := range c.rules {
			for _, st := range r.stmts {
				if err := t.checkRefs(st); err != nil {
					errs = append(errs, fmt.Errorf("chain %s rule %d (%s): %w", c.name, r.num, r.text, err))
				}
			}
		}
	}
	for _, s := range t.sets {
		for _, e := range s.elems {
			if e.Verdict != nil && e.Verdict.Chain != "" && t.chains[e.Verdict.Chain] == nil {
				errs = append(errs, fmt.Errorf("map %s: element %s: no chain %s", s.name, e.text, e.Verdict.Chain))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return t, nil
}

func (t *Tracer) checkRefs(st nft.Stmt) error {
	chains, sets := refs(nft.Rule{st})
	for _, c := range chains {
		if t.chains[c] == nil {
			return fmt.Errorf("no chain %s", c)
		}
	}
	for _, s := range sets {
		if t.sets[s] == nil {
			return fmt.Errorf("no set or map %s", s)
		}
	}
	switch x := st.(type) {
	case *nft.Update:
		if t.sets[x.Set].isMap {
			return fmt.Errorf("update @%s: a map, not a set", x.Set)
		}
	case *nft.Match:
		if x.Set != "" && t.sets[x.Set].isMap {
			return fmt.Errorf("@%s: a map, not a set", x.Set)
		}
	case *nft.VMap:
		if !t.sets[x.Map].isMap {
			return fmt.Errorf("vmap @%s: a set, not a map", x.Map)
		}
	case *nft.DNAT:
		if x.Map != "" && !t.sets[x.Map].isMap {
			return fmt.Errorf("map @%s: a set, not a map", x.Map)
		}
	}
	return nil
}
