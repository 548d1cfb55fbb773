package model

// The evaluator: it walks a packet through the parsed table, branch by
// branch (trace.State), and turns each branch into a trace.Outcome.

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"github.com/kproxy/kproxy/platform/linux/trace"
)

// Trace follows p through the table and returns every possible outcome,
// most probable first (ties in a deterministic order).
func (t *Tracer) Trace(h trace.Host, p trace.Packet) ([]trace.Outcome, error) {
	if !p.Src.IsValid() || !p.Dst.IsValid() {
		return nil, fmt.Errorf("%s: source and destination are required", p)
	}
	if p.Src.Is6() != (t.ip == "ip6") || p.Dst.Is6() != (t.ip == "ip6") {
		return nil, fmt.Errorf("%s: not an %s packet (the table is of family %s)", p, t.ip, t.ip)
	}
	if _, ok := nft.Protocols[p.Proto]; !ok || p.Proto == "icmp" || p.Proto == "icmpv6" {
		return nil, fmt.Errorf("%s: protocol %q: want tcp, udp or sctp", p, p.Proto)
	}
	if p.Local && p.InIface != "" {
		return nil, fmt.Errorf("%s: a local packet has no input interface", p)
	}
	first := "prerouting"
	if p.Local {
		first = "output"
	}
	cur, err := t.hook(h, first, []trace.Branch{{St: trace.NewState(h, p)}})
	if err != nil {
		return nil, err
	}
	var out []trace.Outcome
	for _, b := range cur {
		if b.End.Final() {
			out = append(out, b.Outcome(""))
			continue
		}
		delivered, hooks := trace.Route(h, p, b.St.Dst)
		bs := []trace.Branch{b}
		for _, hk := range hooks {
			if bs, err = t.hook(h, hk, bs); err != nil {
				return nil, err
			}
		}
		for _, b := range bs {
			if b.End.Final() {
				out = append(out, b.Outcome(""))
			} else {
				out = append(out, b.Outcome(delivered))
			}
		}
	}
	slices.SortStableFunc(out, func(a, b trace.Outcome) int {
		return cmp.Or(cmp.Compare(b.Probability, a.Probability), cmp.Compare(a.Verdict, b.Verdict),
			a.Dst.Compare(b.Dst), cmp.Compare(strings.Join(a.Path, "\n"), strings.Join(b.Path, "\n")))
	})
	return out, nil
}

// hook runs the base chains of hook hk, in priority order, over the
// branches still going (a drop or reject is final; an accept ends one base
// chain only). The End of a branch that goes on is EndNone.
func (t *Tracer) hook(h trace.Host, hk string, in []trace.Branch) ([]trace.Branch, error) {
	cur := in
	for _, c := range t.hooks[hk] {
		var next []trace.Branch
		for _, b := range cur {
			if b.End.Final() {
				next = append(next, b)
				continue
			}
			st := b.St.Clone()
			st.Hook = hk
			res, err := t.walk(h, c, st, 0)
			if err != nil {
				return nil, err
			}
			for _, r := range res {
				switch r.End {
				case trace.EndNone:
					if c.Policy == "drop" {
						r.St.Note("%s: end of base chain, policy drop", c.name)
						r.End = trace.EndDrop
					}
				case trace.EndAccept:
					r.End = trace.EndNone
				}
				next = append(next, r)
			}
		}
		cur = next
	}
	return cur, nil
}

// walk enters chain c.
func (t *Tracer) walk(h trace.Host, c *tchain, st trace.State, depth int) ([]trace.Branch, error) {
	if err := trace.CheckDepth(depth, "chain "+c.name); err != nil {
		return nil, err
	}
	if c.Hook != "" {
		st.Note("%s: hook %s (type %s, priority %d)", c.name, c.Hook, c.Type, c.Priority)
	}
	return t.walkFrom(h, c, 0, st, depth)
}

// walkFrom evaluates chain c from rule index i.
func (t *Tracer) walkFrom(h trace.Host, c *tchain, i int, st trace.State, depth int) ([]trace.Branch, error) {
	if st.Prob == 0 {
		return nil, nil
	}
	if i >= len(c.rules) {
		return []trace.Branch{{St: st}}, nil
	}
	return t.evalItems(h, c, i, 0, st, depth)
}

func (t *Tracer) ruleRef(c *tchain, i int) string {
	return fmt.Sprintf("%s #%d", c.name, c.rules[i].num)
}

// evalItems evaluates rule i of c from its statement k. A match that fails
// sends the branch on to the next rule.
func (t *Tracer) evalItems(h trace.Host, c *tchain, i, k int, st trace.State, depth int) ([]trace.Branch, error) {
	r := c.rules[i]
	if k == 0 && t.visit != nil {
		t.visit(c.name, r.num)
	}
	if k == len(r.stmts) {
		// Matched, no verdict: the next rule.
		st.Note("%s: %s", t.ruleRef(c, i), r.text)
		return t.walkFrom(h, c, i+1, st, depth)
	}
	next := func(st trace.State) ([]trace.Branch, error) { return t.evalItems(h, c, i, k+1, st, depth) }
	fail := func(st trace.State) ([]trace.Branch, error) { return t.walkFrom(h, c, i+1, st, depth) }
	// lookup evaluates key, looks each alternative up in map name, and
	// goes on with found for an element, with the next rule otherwise.
	lookup := func(key []nft.Expr, name string, found func(trace.State, valAlt, *telem) ([]trace.Branch, error)) ([]trace.Branch, error) {
		alts, err := t.evalConcat(h, c, r, k, key, &st)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", t.ruleRef(c, i), r.text, err)
		}
		var out []trace.Branch
		for _, a := range alts {
			s := a.apply(st, len(alts) > 1)
			var res []trace.Branch
			var e *telem
			if !a.absent {
				e = t.sets[name].lookup(a.vals)
			}
			switch {
			case a.absent:
				res, err = fail(s)
			case e == nil:
				s.Note("%s: %s: %s not in @%s, next rule", t.ruleRef(c, i), r.text, canon(a.vals), name)
				res, err = fail(s)
			default:
				res, err = found(s, a, e)
			}
			if err != nil {
				return nil, err
			}
			out = append(out, res...)
		}
		return out, nil
	}
	switch it := r.stmts[k].(type) {
	case *nft.Match:
		alts, err := t.evalCond(h, c, r, k, it, &st)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", t.ruleRef(c, i), r.text, err)
		}
		var out []trace.Branch
		for _, a := range alts {
			s := st
			if len(alts) > 1 {
				s = st.Clone()
			}
			s.Prob *= a.p
			if a.ctr != "" {
				s.Counters = maps.Clone(s.Counters)
				s.Counters[a.ctr] = a.ctrVal
			}
			if a.note != "" {
				if a.ok {
					s.Note("%s: %s", t.ruleRef(c, i), a.note)
				} else {
					s.Note("%s: %s: no match, next rule", t.ruleRef(c, i), a.note)
				}
			}
			var res []trace.Branch
			if a.ok {
				res, err = next(s)
			} else {
				res, err = fail(s)
			}
			if err != nil {
				return nil, err
			}
			out = append(out, res...)
		}
		return out, nil
	case *nft.MarkSet:
		val := uint32(it.Val.Num)
		switch it.Op {
		case "":
			st.Mark = val
		case "|":
			st.Mark |= val
		case "^":
			st.Mark ^= val
		case "&":
			st.Mark &= val
		}
		return next(st)
	case *nft.Update:
		st.AddAffinity(it.Set)
		return next(st)
	case *nft.Verdict:
		st.Note("%s: %s", t.ruleRef(c, i), r.text)
		return t.verdict(h, c, i, it, st, depth)
	case *nft.VMap:
		return lookup(it.Key, it.Map, func(s trace.State, _ valAlt, e *telem) ([]trace.Branch, error) {
			s.Note("%s: %s: %s → %s", t.ruleRef(c, i), r.text, e.Key, e.Verdict)
			return t.verdict(h, c, i, e.Verdict, s, depth)
		})
	case *nft.DNAT:
		if it.Map == "" {
			st.Dst, st.DNAT = it.Addr, true
			if it.Port != 0 {
				st.DstPort = it.Port
			}
			st.Note("%s: %s", t.ruleRef(c, i), r.text)
			return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
		}
		return lookup(it.Key, it.Map, func(s trace.State, a valAlt, e *telem) ([]trace.Branch, error) {
			if len(e.Data) < 1 || len(e.Data) > 2 || e.Data[0].Kind != nft.KindAddr || (len(e.Data) == 2 && e.Data[1].Kind != nft.KindNum) {
				return nil, fmt.Errorf("%s (%s): element %s: want address [. port]", t.ruleRef(c, i), r.text, e.text)
			}
			s.Dst, s.DNAT = e.Data[0].Addr, true
			if len(e.Data) == 2 {
				s.DstPort = uint16(e.Data[1].Num)
			}
			s.Note("%s: %s: %s → %s", t.ruleRef(c, i), r.text, a.describe(), netip.AddrPortFrom(s.Dst, s.DstPort))
			return []trace.Branch{{St: s, End: trace.EndAccept}}, nil
		})
	case *nft.Masquerade:
		st.Masq = true
		st.Note("%s: %s", t.ruleRef(c, i), r.text)
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	case *nft.Opaque:
		st.Note("%s: %s: not simulated: what the kernel does with the packet from here is not known", t.ruleRef(c, i), r.text)
		return []trace.Branch{{St: st, End: trace.EndUnknown}}, nil
	case *nft.Reject:
		with := it.With
		if with == "" {
			with = "icmp port unreachable"
		}
		st.Note("%s: %s (%s)", t.ruleRef(c, i), r.text, with)
		return []trace.Branch{{St: st, End: trace.EndReject}}, nil
	}
	return nil, fmt.Errorf("%s: statement %q not modelled", t.ruleRef(c, i), r.stmts[k])
}

// verdict applies a verdict taken in rule i of c.
func (t *Tracer) verdict(h trace.Host, c *tchain, i int, v *nft.Verdict, st trace.State, depth int) ([]trace.Branch, error) {
	switch v.Kind {
	case "return":
		return []trace.Branch{{St: st}}, nil
	case "drop":
		return []trace.Branch{{St: st, End: trace.EndDrop}}, nil
	case "accept":
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	}
	sub := t.chains[v.Chain]
	res, err := t.walk(h, sub, st, depth+1)
	if err != nil {
		return nil, err
	}
	if v.Kind == "goto" {
		// Never back here: the end of sub (or a return) goes back to the
		// last jump.
		return res, nil
	}
	var out []trace.Branch
	for _, b := range res {
		if b.End != trace.EndNone {
			out = append(out, b)
			continue
		}
		rest, err := t.walkFrom(h, c, i+1, b.St, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
	}
	return out, nil
}

func (s *tset) lookup(vals []nft.Value) *telem {
	if s.index != nil {
		return s.index[indexKey(vals)]
	}
	for i := range s.elems {
		e := &s.elems[i]
		if len(e.Key) != len(vals) {
			continue
		}
		ok := true
		for j := range vals {
			if !partMatches(e.Key[j], vals[j]) {
				ok = false
				break
			}
		}
		if ok {
			return e
		}
	}
	return nil
}

// valAlt is one possible value of a concatenation.
type valAlt struct {
	p    float64
	vals []nft.Value
	// absent: a header the packet does not have (tcp dport of a UDP
	// packet): the rule does not match.
	absent bool
	// notes on the values drawn (numgen, jhash)
	notes []string
	// counters written
	ctrs map[string]uint32
}

func (a valAlt) apply(st trace.State, fork bool) trace.State {
	if fork {
		st = st.Clone()
	}
	st.Prob *= a.p
	if len(a.ctrs) > 0 {
		st.Counters = maps.Clone(st.Counters)
		maps.Copy(st.Counters, a.ctrs)
	}
	return st
}

func (a valAlt) describe() string {
	s := canon(a.vals)
	if len(a.notes) > 0 {
		s += " (" + strings.Join(a.notes, ", ") + ")"
	}
	return s
}

// evalConcat evaluates a concatenation: every combination of the values
// its random parts may take.
func (t *Tracer) evalConcat(h trace.Host, c *tchain, r *trule, k int, exprs []nft.Expr, st *trace.State) ([]valAlt, error) {
	alts := []valAlt{{p: 1}}
	for _, e := range exprs {
		var next []valAlt
		for _, a := range alts {
			if a.absent {
				next = append(next, a)
				continue
			}
			vs, err := t.evalExpr(h, c, r, k, e, st, a.ctrs)
			if err != nil {
				return nil, err
			}
			for _, v := range vs {
				b := valAlt{p: a.p * v.p, vals: append(slices.Clone(a.vals), v.val), absent: v.absent, notes: a.notes, ctrs: a.ctrs}
				if v.note != "" {
					b.notes = append(slices.Clone(a.notes), v.note)
				}
				if v.ctr != "" {
					b.ctrs = maps.Clone(a.ctrs)
					if b.ctrs == nil {
						b.ctrs = map[string]uint32{}
					}
					b.ctrs[v.ctr] = v.ctrVal
				}
				next = append(next, b)
			}
		}
		alts = next
	}
	return alts, nil
}

// exprVal is one possible value of an expression.
type exprVal struct {
	p      float64
	val    nft.Value
	absent bool
	note   string
	ctr    string
	ctrVal uint32
}

// maxBranches bounds the values a numgen may branch into.
const maxBranches = 1 << 16

func (t *Tracer) evalExpr(h trace.Host, c *tchain, r *trule, k int, e nft.Expr, st *trace.State, pending map[string]uint32) ([]exprVal, error) {
	p := st.Pkt
	one := func(v nft.Value) []exprVal { return []exprVal{{p: 1, val: v}} }
	switch x := e.(type) {
	case *nft.Payload:
		switch x.Field {
		case "saddr":
			return one(nft.Addr(p.Src)), nil
		case "daddr":
			return one(nft.Addr(st.Dst)), nil
		}
		if x.Base != "th" && x.Base != p.Proto {
			return []exprVal{{p: 1, absent: true}}, nil
		}
		port := st.DstPort
		if x.Field == "sport" {
			port = p.SrcPort
		}
		return one(nft.Num(uint64(port))), nil
	case *nft.Meta:
		switch x.Key {
		case "l4proto":
			return one(nft.Named(p.Proto, nft.Protocols[p.Proto])), nil
		case "mark":
			return one(nft.Num(uint64(st.Mark))), nil
		case "iifname":
			return one(nft.Name(p.InIface)), nil
		}
		// oifname: only the output, forward and postrouting hooks know the
		// output interface (elsewhere the expression breaks: the rule does
		// not match). A local destination is reached through "lo"; any
		// other through an interface the model does not name.
		switch st.Hook {
		case "output", "forward", "postrouting":
		default:
			return []exprVal{{p: 1, absent: true}}, nil
		}
		if h.IsLocal(st.Dst) {
			return one(nft.Name("lo")), nil
		}
		return one(nft.Name("(not lo)")), nil
	case *nft.Fib:
		a := p.Src
		if x.Addr == "daddr" {
			a = st.Dst
		}
		typ := "unicast"
		switch {
		case h.IsLocal(a):
			typ = "local"
		case a.IsMulticast():
			typ = "multicast"
		}
		return one(nft.Name(typ)), nil
	case *nft.CT:
		if x.Key == "state" {
			return one(nft.Name("new")), nil
		}
		var s uint64
		if st.DNAT {
			s |= nft.CTStatusBits["dnat"]
		}
		return one(nft.Num(s)), nil
	case *nft.Jhash:
		src := p.Src
		if of, ok := x.Of.(*nft.Payload); ok && of.Field == "daddr" {
			src = st.Dst
		}
		slot := uint64(trace.ClusterSlot(src, x.Seed, uint32(x.Mod))) + x.Offset
		return []exprVal{{p: 1, val: nft.Num(slot), note: fmt.Sprintf("jhash %s = %d", src, slot)}}, nil
	case *nft.Numgen:
		if key, ok := t.counterKey(c, r, k, x); ok && st.Counters != nil {
			v, next := t.incNext(st.Counters, pending, key, x.Mod)
			return []exprVal{{p: 1, val: nft.Num(v + x.Offset), note: fmt.Sprintf("numgen inc = %d (counter %s)", v+x.Offset, key), ctr: key, ctrVal: next}}, nil
		}
		if x.Mod > maxBranches {
			return nil, fmt.Errorf("%s: %d values to branch into (at most %d modelled)", x, x.Mod, maxBranches)
		}
		out := make([]exprVal, 0, x.Mod)
		for v := range x.Mod {
			note := fmt.Sprintf("slot %d of %d, p %s", v+x.Offset, x.Mod, frac(1, x.Mod))
			if x.Mode == "inc" {
				note = fmt.Sprintf("slot %d of %d: round robin, 1 in %d connections", v+x.Offset, x.Mod, x.Mod)
			}
			out = append(out, exprVal{p: 1 / float64(x.Mod), val: nft.Num(v + x.Offset), note: note})
		}
		return out, nil
	}
	return nil, fmt.Errorf("expression %s not modelled", e)
}

// isInc reports whether e is a numgen inc (an expression with a counter).
func isInc(e nft.Expr) bool {
	n, ok := e.(*nft.Numgen)
	return ok && n.Mode == "inc"
}

// counterKey names e's counter when it is a numgen inc.
func (t *Tracer) counterKey(c *tchain, r *trule, k int, e nft.Expr) (string, bool) {
	if !isInc(e) {
		return "", false
	}
	nth := 0
	for j := 0; j <= k; j++ {
		var exprs []nft.Expr
		switch x := r.stmts[j].(type) {
		case *nft.Match:
			exprs = x.Left
		case *nft.VMap:
			exprs = x.Key
		case *nft.DNAT:
			exprs = x.Key
		}
		for _, y := range exprs {
			if isInc(y) {
				nth++
			}
			if y == e {
				return CounterKey(c.name, r.num, nth), true
			}
		}
	}
	return CounterKey(c.name, r.num, max(nth, 1)), true
}

// incNext is the kernel's nft_ng_inc_gen: the counter (created at mod-1)
// moves on by one, wrapping to 0, and its new value is the result.
func (t *Tracer) incNext(counters, pending map[string]uint32, key string, mod uint64) (val uint64, next uint32) {
	old, ok := pending[key]
	if !ok {
		old, ok = counters[key]
	}
	if !ok {
		old = uint32(mod - 1)
	}
	n := uint64(old) + 1
	if n >= mod {
		n = 0
	}
	return n, uint32(n)
}

func frac(a, b uint64) string {
	if a == 0 {
		return "0"
	}
	if a == b {
		return "1"
	}
	if b > 1000 {
		return strconv.FormatFloat(float64(a)/float64(b), 'g', 4, 64)
	}
	return fmt.Sprintf("%d/%d", a, b)
}

// condAlt is one outcome of a match.
type condAlt struct {
	p      float64
	ok     bool
	note   string
	ctr    string
	ctrVal uint32
}

// opFlag is the operator of a match that tests bits: a flag of a bitmask
// compared with no operator ("ct status dnat": the bit is set).
const opFlag nft.Op = "flag"

// opOf returns the operator m applies: nft.OpEq for an implicit one, but
// opFlag for one constant of ct status with no mask.
func opOf(m *nft.Match) nft.Op {
	if m.Op != nft.OpImplicit {
		return m.Op
	}
	if m.Mask == nil && m.Set == "" && !m.Anon && len(m.Left) == 1 && m.Left[0].Type() == nft.TypeCTStatus {
		return opFlag
	}
	return nft.OpEq
}

func (t *Tracer) evalCond(h trace.Host, c *tchain, r *trule, k int, m *nft.Match, st *trace.State) ([]condAlt, error) {
	// A numgen compared with constants: split analytically (no branch per
	// value), unless its counter is tracked.
	if e, ok := m.Left[0].(*nft.Numgen); ok && len(m.Left) == 1 && m.Mask == nil && m.Set == "" {
		if _, inc := t.counterKey(c, r, k, e); !inc || st.Counters == nil {
			n := countMatching(e, m)
			note := fmt.Sprintf("%s: p %s", m, frac(n, e.Mod))
			if e.Mode == "inc" {
				note = fmt.Sprintf("%s: round robin, %d in %d connections reaching the rule", m, n, e.Mod)
			}
			var out []condAlt
			if n > 0 {
				out = append(out, condAlt{p: float64(n) / float64(e.Mod), ok: true, note: note})
			}
			if n < e.Mod {
				out = append(out, condAlt{p: float64(e.Mod-n) / float64(e.Mod), ok: false, note: note})
			}
			return out, nil
		}
	}
	alts, err := t.evalConcat(h, c, r, k, m.Left, st)
	if err != nil {
		return nil, err
	}
	var out []condAlt
	for _, a := range alts {
		ca := condAlt{p: a.p}
		for key, v := range a.ctrs {
			ca.ctr, ca.ctrVal = key, v
		}
		if len(a.ctrs) > 1 {
			return nil, fmt.Errorf("%s: more than one numgen inc in a match", m)
		}
		if len(a.notes) > 0 {
			ca.note = m.String() + ": " + strings.Join(a.notes, ", ")
		}
		if a.absent {
			out = append(out, ca)
			continue
		}
		ok, err := t.holds(h, m, a.vals, st.Pkt.Src)
		if err != nil {
			return nil, err
		}
		ca.ok = ok
		out = append(out, ca)
	}
	return out, nil
}

// countMatching counts the values of numgen e that satisfy m.
func countMatching(e *nft.Numgen, m *nft.Match) uint64 {
	lo, hi := e.Offset, e.Offset+e.Mod // [lo, hi)
	inRange := func(v uint64) bool { return v >= lo && v < hi }
	var n uint64
	switch op := opOf(m); op {
	case nft.OpEq, nft.OpNe:
		seen := map[uint64]bool{}
		for _, v := range m.Right {
			if inRange(v[0].Num) && !seen[v[0].Num] {
				seen[v[0].Num] = true
				n++
			}
		}
		if op == nft.OpNe {
			n = e.Mod - n
		}
	default:
		x := m.Right[0][0].Num
		// Count v in [lo, hi) with v op x.
		count := func(a, b uint64) uint64 { // values in [a, b) ∩ [lo, hi)
			a, b = max(a, lo), min(b, hi)
			if b <= a {
				return 0
			}
			return b - a
		}
		switch op {
		case nft.OpLt:
			n = count(0, x)
		case nft.OpLe:
			n = count(0, x+1)
		case nft.OpGt:
			n = count(x+1, math.MaxUint64)
		case nft.OpGe:
			n = count(x, math.MaxUint64)
		}
	}
	return n
}

// holds evaluates match m on the values vals.
func (t *Tracer) holds(h trace.Host, m *nft.Match, vals []nft.Value, src netip.Addr) (bool, error) {
	if m.Mask != nil {
		vals = []nft.Value{nft.Num(vals[0].Num & m.Mask.Num)}
	}
	op := opOf(m)
	var in bool
	switch {
	case m.Set != "":
		s := t.sets[m.Set]
		if s.isMap {
			return false, fmt.Errorf("@%s is a map, not a set", m.Set)
		}
		in = s.lookup(vals) != nil
		// An affinity set the caller says holds the source.
		if !in && len(vals) == 1 && vals[0].Kind == nft.KindAddr && vals[0].Addr == src && h.AffinityHit[m.Set] {
			in = true
		}
	case op == opFlag:
		return vals[0].Num&m.Right[0][0].Num != 0, nil
	case op == nft.OpEq || op == nft.OpNe:
		for _, l := range m.Right {
			if constMatches(m.Left, l, vals) {
				in = true
				break
			}
		}
	default:
		v, x := vals[0].Num, m.Right[0][0].Num
		switch op {
		case nft.OpLt:
			return v < x, nil
		case nft.OpLe:
			return v <= x, nil
		case nft.OpGt:
			return v > x, nil
		case nft.OpGe:
			return v >= x, nil
		}
		return false, fmt.Errorf("operator %s not modelled", op)
	}
	if op == nft.OpNe {
		return !in, nil
	}
	return in, nil
}

// constMatches compares a packet's values with one constant of each part;
// interface names ending in "*" match by prefix.
func constMatches(exprs []nft.Expr, c nft.Key, vals []nft.Value) bool {
	for i := range vals {
		if exprs[i].Type() == nft.TypeIface {
			if pfx, ok := strings.CutSuffix(c[i].Str, "*"); ok {
				if !strings.HasPrefix(vals[i].Str, pfx) {
					return false
				}
				continue
			}
		}
		if !partMatches(c[i], vals[i]) {
			return false
		}
	}
	return true
}

// TraceSequence traces n packets like p, one after the other (each from
// the next source port), carrying the numgen inc counters from one to the
// next: the round robin rotation. Every outcome of one packet must leave
// the same counters (a counter behind a random branch has no single next
// state): otherwise it is an error.
func (t *Tracer) TraceSequence(h trace.Host, p trace.Packet, n int) ([][]trace.Outcome, error) {
	if h.Counters == nil {
		h.Counters = map[string]uint32{}
	}
	var out [][]trace.Outcome
	for i := range n {
		outs, err := t.Trace(h, p)
		if err != nil {
			return nil, err
		}
		if len(outs) == 0 {
			return nil, fmt.Errorf("packet %d: no outcome", i+1)
		}
		for _, o := range outs[1:] {
			if !maps.Equal(o.Counters, outs[0].Counters) {
				return nil, fmt.Errorf("packet %d: the outcomes leave different numgen inc counters (%v, %v)", i+1, outs[0].Counters, o.Counters)
			}
		}
		h.Counters = outs[0].Counters
		out = append(out, outs)
		p.SrcPort++
	}
	return out, nil
}
