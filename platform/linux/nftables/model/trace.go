package model

// The packet tracer: it follows the first packet of a new connection
// through the base chains of a Model (the Fake's table, or one read back
// from a node), interpreting the rule text the renderer writes, and returns
// every possible outcome with its probability and the path that leads to
// it. Every rule of the table is parsed before any packet is traced: a form
// the tracer does not understand is an error (NewTracer), never a rule
// silently skipped, so a trace never "reaches" what it did not simulate.
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
//     VerdictUnknown: the tracer never goes past what it cannot simulate.
//   - matches: addresses against constants, prefixes, anonymous and named
//     sets (interval sets by containment), concatenations (hairpin), meta
//     l4proto, th/tcp/udp/sctp ports (a protocol's header on another
//     protocol's packet does not match), iifname with its "*" wildcard,
//     fib saddr/daddr type (local: trace.Host.LocalAddrs and loopback), meta mark
//     with & masks, ct state (a first packet is new), ct status (dnat once
//     DNATed).
//   - numgen random mod N: every value, each with probability 1/N (a
//     comparison against a constant is split analytically: "numgen random
//     mod 2147483648 < X" matches with probability X/2^31); numgen inc mod N:
//     with trace.Host.Counters, the kernel's per-expression counter (it starts at
//     N-1, so the first evaluation yields 0, and counts every evaluation);
//     without, every value as for random, noted as a rotation; jhash ADDR mod
//     N seed S: the kernel's jhash of the address bytes with the seed, scaled
//     with reciprocal_scale (trace.ClusterSlot, checked against the
//     kernel's xt_cluster, computes the same function).
//   - session affinity: "ip saddr @S" holds when trace.Host.AffinityHit[S] (or the
//     set's elements hold the source); "update @S { ip saddr }" is reported
//     in trace.Outcome.AffinitySets.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/trace"
	"sigs.k8s.io/knftables"
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
	name     string
	hook     string // "" for a regular chain
	typ      string
	priority int
	policy   string // "accept" or "drop"
	rules    []*trule
}

type trule struct {
	text  string
	num   int // position from 1
	items []item
}

type tset struct {
	name  string
	isMap bool
	elems []telem
	// index holds the elements by canonical key, when no key part is a
	// prefix (otherwise lookups scan elems).
	index map[string]*telem
}

type telem struct {
	key []kval
	// val is a data map's value, verdict a verdict map's.
	val     []kval
	verdict *verdictItem
	text    string
}

// kval is one part of a key or value: an address, a prefix or a number
// (protocols are numbers).
type kval struct {
	addr netip.Addr
	pfx  netip.Prefix
	num  uint64
	kind byte // 'a', 'p', 'n', 's' (a string: interface names, types)
	str  string
}

func (k kval) String() string {
	switch k.kind {
	case 'a':
		return k.addr.String()
	case 'p':
		return k.pfx.String()
	case 'n':
		if k.str != "" {
			return k.str // a protocol's name
		}
		return strconv.FormatUint(k.num, 10)
	}
	return k.str
}

func canon(ks []kval) string {
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k.String()
	}
	return strings.Join(parts, " . ")
}

// indexKey is the canonical form of a key for exact lookups (protocols as
// numbers, whatever the text said).
func indexKey(ks []kval) string {
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(" . ")
		}
		if k.kind == 'n' {
			b.WriteString(strconv.FormatUint(k.num, 10))
		} else {
			b.WriteString(k.String())
		}
	}
	return b.String()
}

// matches reports whether a packet value v matches element part e.
func (e kval) matches(v kval) bool {
	switch e.kind {
	case 'p':
		return v.kind == 'a' && e.pfx.Contains(v.addr)
	case 'a':
		return v.kind == 'a' && e.addr == v.addr
	case 'n':
		return v.kind == 'n' && e.num == v.num
	}
	return v.kind == 's' && e.str == v.str
}

var protoNums = map[string]uint64{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}

// parseKval reads one part of an element key or value.
func parseKval(s string) (kval, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return kval{}, err
		}
		return kval{kind: 'p', pfx: p.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return kval{kind: 'a', addr: a}, nil
	}
	if n, ok := protoNums[s]; ok {
		return kval{kind: 'n', num: n, str: s}, nil
	}
	if n, err := strconv.ParseUint(s, 0, 32); err == nil {
		return kval{kind: 'n', num: n}, nil
	}
	return kval{}, fmt.Errorf("element part %q: not an address, prefix, protocol or number", s)
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
			te, err := t.parseElem(s, e)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: element %s: %w", kindOf(s), name, id, err))
				continue
			}
			ts.elems = append(ts.elems, te)
		}
	}
	for _, ts := range t.sets {
		if slices.ContainsFunc(ts.elems, func(e telem) bool {
			return slices.ContainsFunc(e.key, func(k kval) bool { return k.kind == 'p' })
		}) {
			continue
		}
		ts.index = make(map[string]*telem, len(ts.elems))
		for i := range ts.elems {
			ts.index[indexKey(ts.elems[i].key)] = &ts.elems[i]
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.Chains)) {
		c := m.Chains[name]
		tc := &tchain{name: name, policy: "accept"}
		if c.Base != "" {
			if err := tc.parseBase(c.Base); err != nil {
				errs = append(errs, fmt.Errorf("chain %s: %w", name, err))
				continue
			}
			t.hooks[tc.hook] = append(t.hooks[tc.hook], tc)
		}
		for i, r := range c.Rules {
			items, err := t.parseRule(r)
			if err != nil {
				errs = append(errs, fmt.Errorf("chain %s rule %d (%s): %w", name, i+1, r, err))
				continue
			}
			tc.rules = append(tc.rules, &trule{text: r, num: i + 1, items: items})
		}
		t.chains[name] = tc
	}
	for _, hs := range t.hooks {
		slices.SortStableFunc(hs, func(a, b *tchain) int { return cmp.Compare(a.priority, b.priority) })
	}
	// References: every chain a rule or verdict element points at, every
	// set a rule reads.
	for _, c := range t.chains {
		for _, r := range c.rules {
			for _, it := range r.items {
				if err := t.checkRefs(it); err != nil {
					errs = append(errs, fmt.Errorf("chain %s rule %d (%s): %w", c.name, r.num, r.text, err))
				}
			}
		}
	}
	for _, s := range t.sets {
		for _, e := range s.elems {
			if e.verdict != nil && e.verdict.chain != "" && t.chains[e.verdict.chain] == nil {
				errs = append(errs, fmt.Errorf("map %s: element %s: no chain %s", s.name, e.text, e.verdict.chain))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return t, nil
}

func kindOf(s *Set) string {
	if s.IsMap {
		return "map"
	}
	return "set"
}

func (t *Tracer) parseElem(s *Set, e Element) (telem, error) {
	te := telem{text: strings.Join(e.Key, " . ")}
	for _, k := range e.Key {
		kv, err := parseKval(k)
		if err != nil {
			return te, err
		}
		te.key = append(te.key, kv)
	}
	if !s.IsMap {
		if e.Value != nil {
			return te, errors.New("a set element with a value")
		}
		return te, nil
	}
	val := strings.Join(e.Value, " . ")
	te.text += " : " + val
	if strings.Contains(s.Spec, ": verdict") {
		v, err := parseVerdict(strings.Fields(val))
		if err != nil {
			return te, err
		}
		te.verdict = v
		return te, nil
	}
	for _, p := range strings.Split(val, " . ") {
		kv, err := parseKval(p)
		if err != nil {
			return te, err
		}
		te.val = append(te.val, kv)
	}
	return te, nil
}

// parseBase reads "type nat hook prerouting priority -100 [; policy accept]".
func (c *tchain) parseBase(base string) error {
	parts := strings.Split(base, ";")
	f := strings.Fields(parts[0])
	if len(f) < 6 || f[0] != "type" || f[2] != "hook" || f[4] != "priority" {
		return fmt.Errorf("base chain %q: want \"type T hook H priority P\"", base)
	}
	c.typ, c.hook = f[1], f[3]
	switch c.hook {
	case "prerouting", "input", "forward", "output", "postrouting":
	default:
		return fmt.Errorf("hook %q not modelled", c.hook)
	}
	switch c.typ {
	case "nat", "filter":
	default:
		return fmt.Errorf("chain type %q not modelled", c.typ)
	}
	prio, err := parsePriority(f[5:])
	if err != nil {
		return err
	}
	c.priority = prio
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		switch p {
		case "", "policy accept":
		case "policy drop":
			c.policy = "drop"
		default:
			return fmt.Errorf("base chain option %q not modelled", p)
		}
	}
	return nil
}

var namedPriorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

func parsePriority(f []string) (int, error) {
	if len(f) == 0 {
		return 0, errors.New("no priority")
	}
	base, ok := namedPriorities[f[0]]
	if !ok {
		n, err := strconv.Atoi(f[0])
		if err != nil {
			return 0, fmt.Errorf("priority %q", strings.Join(f, " "))
		}
		base = n
	}
	switch {
	case len(f) == 1:
		return base, nil
	case len(f) == 3 && (f[1] == "+" || f[1] == "-"):
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return 0, fmt.Errorf("priority %q", strings.Join(f, " "))
		}
		if f[1] == "-" {
			n = -n
		}
		return base + n, nil
	}
	return 0, fmt.Errorf("priority %q", strings.Join(f, " "))
}

func (t *Tracer) checkRefs(it item) error {
	var chains, sets []string
	switch x := it.(type) {
	case *verdictItem:
		chains = append(chains, x.chain)
	case *vmapItem:
		sets = append(sets, x.set)
	case *dnatItem:
		if x.mapName != "" {
			sets = append(sets, x.mapName)
		}
	case *updateItem:
		sets = append(sets, x.set)
	case *cond:
		if x.set != "" {
			sets = append(sets, x.set)
		}
	}
	for _, c := range chains {
		if c != "" && t.chains[c] == nil {
			return fmt.Errorf("no chain %s", c)
		}
	}
	for _, s := range sets {
		if t.sets[s] == nil {
			return fmt.Errorf("no set or map %s", s)
		}
	}
	switch x := it.(type) {
	case *updateItem:
		if t.sets[x.set].isMap {
			return fmt.Errorf("update @%s: a map, not a set", x.set)
		}
	case *cond:
		if x.set != "" && t.sets[x.set].isMap {
			return fmt.Errorf("@%s: a map, not a set", x.set)
		}
	case *vmapItem:
		if !t.sets[x.set].isMap {
			return fmt.Errorf("vmap @%s: a set, not a map", x.set)
		}
	case *dnatItem:
		if x.mapName != "" && !t.sets[x.mapName].isMap {
			return fmt.Errorf("map @%s: a set, not a map", x.mapName)
		}
	}
	return nil
}

// ---- rule syntax ----

// item is one expression of a rule, evaluated in order: a match (cond), a
// statement (mark, update) or a terminal (verdict, vmap, dnat, masquerade,
// reject).
type item interface{ String() string }

// typ is the type of an expression's value.
type vtype uint8

const (
	tAddr vtype = iota
	tProto
	tPort
	tMark
	tIface
	tFibType
	tNum
	tCTState
	tCTStatus
)

// expr is one primary expression.
type expr struct {
	text string
	typ  vtype
	// what it reads
	kind string // "saddr", "daddr", "l4proto", "dport", "sport", "mark", "iifname", "oifname", "fib-saddr", "fib-daddr", "numgen", "jhash", "ctstate", "ctstatus"
	// proto: for "tcp dport" and the like, the protocol whose header is
	// read ("" for th).
	proto string
	// numgen and jhash
	gen      string // "random", "inc"
	mod, off uint64
	seed     uint32
	hashOf   *expr
}

// cond is a match: exprs (a concatenation) against a right-hand side.
type cond struct {
	text  string
	exprs []*expr
	op    string // "==", "!=", "<", "<=", ">", ">=", "flag" (the bits are set)
	mask  *uint64
	// the right-hand side: one of set (named), list (anonymous set or one
	// constant)
	set  string
	list [][]kval
}

func (c *cond) String() string { return c.text }

type verdictItem struct {
	kind  string // "jump", "goto", "return", "drop", "accept"
	chain string
}

func (v *verdictItem) String() string {
	if v.chain != "" {
		return v.kind + " " + v.chain
	}
	return v.kind
}

type vmapItem struct {
	text  string
	exprs []*expr
	set   string
}

func (v *vmapItem) String() string { return v.text }

type dnatItem struct {
	text string
	// constant target
	to     netip.Addr
	toPort uint16
	// or a data map lookup
	exprs   []*expr
	mapName string
}

func (d *dnatItem) String() string { return d.text }

type masqItem struct{ text string }

// opaqueItem is a rule that could not be read (see Opaque): a branch that
// reaches it ends there, its fate unknown.
type opaqueItem struct{ text string }

func (o *opaqueItem) String() string { return o.text }

func (m *masqItem) String() string { return m.text }

type rejectItem struct{ text, with string }

func (r *rejectItem) String() string { return r.text }

type markItem struct {
	text string
	op   string // "=", "|", "^", "&"
	val  uint32
}

func (m *markItem) String() string { return m.text }

type updateItem struct {
	text string
	set  string
	expr *expr
}

func (u *updateItem) String() string { return u.text }

// tokens splits a rule into words; "{ a, b }" gives "{", "a", "b", "}".
func tokens(s string) []string {
	var out []string
	for _, f := range strings.Fields(s) {
		f = strings.TrimSuffix(f, ",")
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

type parser struct {
	t    *Tracer
	toks []string
	pos  int
}

func (p *parser) peek() string {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return ""
}

func (p *parser) next() string {
	s := p.peek()
	if p.pos < len(p.toks) {
		p.pos++
	}
	return s
}

func (p *parser) expect(words ...string) error {
	for _, w := range words {
		if got := p.next(); got != w {
			return fmt.Errorf("want %q, got %q", w, got)
		}
	}
	return nil
}

func (p *parser) text(from int) string { return strings.Join(p.toks[from:p.pos], " ") }

func (t *Tracer) parseRule(rule string) ([]item, error) {
	if IsOpaque(rule) {
		return []item{&opaqueItem{text: rule}}, nil
	}
	p := &parser{t: t, toks: tokens(rule)}
	var items []item
	for p.pos < len(p.toks) {
		if n := len(items); n > 0 && isTerminal(items[n-1]) {
			return nil, fmt.Errorf("%q after the verdict %q", p.text(p.pos), items[n-1])
		}
		start := p.pos
		w := p.peek()
		switch w {
		case "jump", "goto":
			p.next()
			c := p.next()
			if c == "" {
				return nil, fmt.Errorf("%s without a chain", w)
			}
			items = append(items, &verdictItem{kind: w, chain: c})
		case "return", "drop", "accept":
			p.next()
			items = append(items, &verdictItem{kind: w})
		case "reject":
			p.next()
			r := &rejectItem{}
			if p.peek() == "with" {
				p.next()
				switch p.peek() {
				case "tcp":
					if err := p.expect("tcp", "reset"); err != nil {
						return nil, err
					}
					r.with = "tcp reset"
				case "icmp", "icmpv6", "icmpx":
					fam := p.next()
					if err := p.expect("type"); err != nil {
						return nil, err
					}
					r.with = fam + " type " + p.next()
				default:
					return nil, fmt.Errorf("reject with %q not modelled", p.peek())
				}
			}
			r.text = p.text(start)
			items = append(items, r)
		case "masquerade":
			p.next()
			for slices.Contains([]string{"fully-random", "random", "persistent"}, p.peek()) {
				p.next()
			}
			items = append(items, &masqItem{text: p.text(start)})
		case "dnat":
			d, err := p.dnat()
			if err != nil {
				return nil, err
			}
			d.text = p.text(start)
			items = append(items, d)
		case "update":
			p.next()
			s, ok := strings.CutPrefix(p.next(), "@")
			if !ok {
				return nil, errors.New("update: want @set")
			}
			if err := p.expect("{"); err != nil {
				return nil, err
			}
			e, err := p.primary()
			if err != nil {
				return nil, err
			}
			if e.typ != tAddr {
				return nil, fmt.Errorf("update @%s { %s }: only addresses modelled", s, e.text)
			}
			if err := p.expect("}"); err != nil {
				return nil, err
			}
			items = append(items, &updateItem{text: p.text(start), set: s, expr: e})
		default:
			if w == "meta" && p.pos+2 < len(p.toks) && p.toks[p.pos+1] == "mark" && p.toks[p.pos+2] == "set" {
				m, err := p.markSet()
				if err != nil {
					return nil, err
				}
				m.text = p.text(start)
				items = append(items, m)
				continue
			}
			it, err := p.match()
			if err != nil {
				return nil, err
			}
			items = append(items, it)
		}
	}
	if len(items) == 0 {
		return nil, errors.New("empty rule")
	}
	return items, nil
}

func isTerminal(it item) bool {
	switch it.(type) {
	case *verdictItem, *vmapItem, *dnatItem, *masqItem, *rejectItem, *opaqueItem:
		return true
	}
	return false
}

// markSet reads "meta mark set meta mark | 0x4000" (or ^, &) or "meta mark
// set 0x4000".
func (p *parser) markSet() (*markItem, error) {
	if err := p.expect("meta", "mark", "set"); err != nil {
		return nil, err
	}
	m := &markItem{op: "="}
	if p.peek() == "meta" {
		if err := p.expect("meta", "mark"); err != nil {
			return nil, err
		}
		m.op = p.next()
		if m.op != "|" && m.op != "^" && m.op != "&" {
			return nil, fmt.Errorf("meta mark set meta mark %q not modelled", m.op)
		}
	}
	n, err := strconv.ParseUint(p.next(), 0, 32)
	if err != nil {
		return nil, fmt.Errorf("mark value: %w", err)
	}
	m.val = uint32(n)
	return m, nil
}

// dnat reads "dnat ip to 10.0.0.1:80", "dnat ip6 to [fd00::1]:80" or
// "dnat ip to <concatenation> map @m".
func (p *parser) dnat() (*dnatItem, error) {
	p.next()
	if w := p.peek(); w == "ip" || w == "ip6" {
		if w != p.t.ip {
			return nil, fmt.Errorf("dnat %s in an %s table", w, p.t.ip)
		}
		p.next()
	}
	if err := p.expect("to"); err != nil {
		return nil, err
	}
	d := &dnatItem{}
	target := p.peek()
	if ap, err := netip.ParseAddrPort(target); err == nil {
		p.next()
		d.to, d.toPort = ap.Addr(), ap.Port()
	} else if a, err := netip.ParseAddr(target); err == nil {
		p.next()
		d.to = a
	} else {
		exprs, err := p.concat()
		if err != nil {
			return nil, err
		}
		if err := p.expect("map"); err != nil {
			return nil, err
		}
		s, ok := strings.CutPrefix(p.next(), "@")
		if !ok {
			return nil, errors.New("dnat map: want @map")
		}
		d.exprs, d.mapName = exprs, s
		return d, nil
	}
	if d.to.Is6() != (p.t.ip == "ip6") || d.to.Is4In6() {
		return nil, fmt.Errorf("dnat to %s in an %s table", d.to, p.t.ip)
	}
	return d, nil
}

// concat reads "expr [. expr]...".
func (p *parser) concat() ([]*expr, error) {
	var out []*expr
	for {
		e, err := p.primary()
		if err != nil {
			return nil, err
		}
		out = append(out, e)
		if p.peek() != "." {
			return out, nil
		}
		p.next()
	}
}

// primary reads one expression that yields a value.
func (p *parser) primary() (*expr, error) {
	start := p.pos
	e := &expr{}
	w := p.next()
	switch w {
	case "ip", "ip6":
		if w != p.t.ip {
			return nil, fmt.Errorf("%s expression in an %s table", w, p.t.ip)
		}
		switch f := p.next(); f {
		case "saddr", "daddr":
			e.kind, e.typ = f, tAddr
		default:
			return nil, fmt.Errorf("%s %s not modelled", w, f)
		}
	case "meta":
		switch f := p.next(); f {
		case "l4proto":
			e.kind, e.typ = "l4proto", tProto
		case "mark":
			e.kind, e.typ = "mark", tMark
		case "iifname":
			e.kind, e.typ = "iifname", tIface
		case "oifname":
			e.kind, e.typ = "oifname", tIface
		default:
			return nil, fmt.Errorf("meta %s not modelled", f)
		}
	case "iifname":
		e.kind, e.typ = "iifname", tIface
	case "oifname":
		e.kind, e.typ = "oifname", tIface
	case "th", "tcp", "udp", "sctp":
		switch f := p.next(); f {
		case "dport", "sport":
			e.kind, e.typ = f, tPort
			if w != "th" {
				e.proto = w
			}
		default:
			return nil, fmt.Errorf("%s %s not modelled", w, f)
		}
	case "fib":
		f := p.next()
		if f != "saddr" && f != "daddr" {
			return nil, fmt.Errorf("fib %s not modelled", f)
		}
		if err := p.expect("type"); err != nil {
			return nil, err
		}
		e.kind, e.typ = "fib-"+f, tFibType
	case "numgen":
		e.kind, e.typ = "numgen", tNum
		e.gen = p.next()
		if e.gen != "random" && e.gen != "inc" {
			return nil, fmt.Errorf("numgen %s not modelled", e.gen)
		}
		if err := p.expect("mod"); err != nil {
			return nil, err
		}
		n, err := strconv.ParseUint(p.next(), 0, 32)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("numgen modulus: %v", err)
		}
		e.mod = n
		if p.peek() == "offset" {
			p.next()
			if e.off, err = strconv.ParseUint(p.next(), 0, 32); err != nil {
				return nil, fmt.Errorf("numgen offset: %w", err)
			}
		}
	case "jhash":
		e.kind, e.typ = "jhash", tNum
		of, err := p.primary()
		if err != nil {
			return nil, err
		}
		if of.typ != tAddr {
			return nil, fmt.Errorf("jhash of %s: only an address is modelled", of.text)
		}
		e.hashOf = of
		if err := p.expect("mod"); err != nil {
			return nil, err
		}
		n, err := strconv.ParseUint(p.next(), 0, 32)
		if err != nil || n < 2 {
			return nil, fmt.Errorf("jhash modulus %d: %v", n, err)
		}
		e.mod = n
		if err := p.expect("seed"); err != nil {
			return nil, err
		}
		seed, err := strconv.ParseUint(p.next(), 0, 32)
		if err != nil {
			return nil, fmt.Errorf("jhash seed: %w", err)
		}
		e.seed = uint32(seed)
		if p.peek() == "offset" {
			p.next()
			if e.off, err = strconv.ParseUint(p.next(), 0, 32); err != nil {
				return nil, fmt.Errorf("jhash offset: %w", err)
			}
		}
	case "ct":
		switch f := p.next(); f {
		case "state":
			e.kind, e.typ = "ctstate", tCTState
		case "status":
			e.kind, e.typ = "ctstatus", tCTStatus
		default:
			return nil, fmt.Errorf("ct %s not modelled", f)
		}
	default:
		return nil, fmt.Errorf("expression %q not modelled", w)
	}
	e.text = p.text(start)
	return e, nil
}

// ct status bits (IPS_*).
var ctStatusBits = map[string]uint64{"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8, "snat": 0x10, "dnat": 0x20, "dying": 0x200}

var ctStates = []string{"invalid", "established", "related", "new", "untracked"}

var fibTypes = []string{"unspec", "unicast", "local", "broadcast", "anycast", "multicast", "blackhole", "unreachable", "prohibit", "throw", "nat", "xresolve"}

// constant reads one constant of type typ.
func (p *parser) constant(typ vtype) (kval, error) {
	w := p.next()
	if w == "" {
		return kval{}, errors.New("missing value")
	}
	switch typ {
	case tAddr:
		k, err := parseKval(w)
		if err != nil || (k.kind != 'a' && k.kind != 'p') {
			return kval{}, fmt.Errorf("address %q", w)
		}
		if addrOf(k).Is6() != (p.t.ip == "ip6") {
			return kval{}, fmt.Errorf("address %q in an %s table", w, p.t.ip)
		}
		return k, nil
	case tProto:
		if n, ok := protoNums[w]; ok {
			return kval{kind: 'n', num: n, str: w}, nil
		}
		n, err := strconv.ParseUint(w, 10, 8)
		if err != nil {
			return kval{}, fmt.Errorf("protocol %q", w)
		}
		return kval{kind: 'n', num: n}, nil
	case tPort, tMark, tNum:
		n, err := strconv.ParseUint(w, 0, 32)
		if err != nil {
			return kval{}, fmt.Errorf("number %q", w)
		}
		return kval{kind: 'n', num: n}, nil
	case tIface:
		s, err := strconv.Unquote(w)
		if err != nil {
			if strings.ContainsAny(w, `"\`) {
				return kval{}, fmt.Errorf("interface name %s", w)
			}
			s = w
		}
		return kval{kind: 's', str: s}, nil
	case tFibType:
		if !slices.Contains(fibTypes, w) {
			return kval{}, fmt.Errorf("fib type %q", w)
		}
		return kval{kind: 's', str: w}, nil
	case tCTState:
		if !slices.Contains(ctStates, w) {
			return kval{}, fmt.Errorf("ct state %q", w)
		}
		return kval{kind: 's', str: w}, nil
	case tCTStatus:
		if b, ok := ctStatusBits[w]; ok {
			return kval{kind: 'n', num: b}, nil
		}
		n, err := strconv.ParseUint(w, 0, 32)
		if err != nil {
			return kval{}, fmt.Errorf("ct status %q", w)
		}
		return kval{kind: 'n', num: n}, nil
	}
	return kval{}, fmt.Errorf("constant %q", w)
}

func addrOf(k kval) netip.Addr {
	if k.kind == 'p' {
		return k.pfx.Addr()
	}
	return k.addr
}

// match reads a match: a concatenation and its right-hand side, or a
// verdict map lookup.
func (p *parser) match() (item, error) {
	start := p.pos
	exprs, err := p.concat()
	if err != nil {
		return nil, err
	}
	c := &cond{exprs: exprs, op: "=="}
	if p.peek() == "vmap" {
		p.next()
		s, ok := strings.CutPrefix(p.next(), "@")
		if !ok {
			return nil, errors.New("vmap: only named maps (@name) are modelled")
		}
		return &vmapItem{text: p.text(start), exprs: exprs, set: s}, nil
	}
	if p.peek() == "&" {
		if len(exprs) != 1 || (exprs[0].typ != tMark && exprs[0].typ != tCTStatus && exprs[0].typ != tNum) {
			return nil, fmt.Errorf("%q: & on %s not modelled", p.text(start), exprs[0].text)
		}
		p.next()
		m, err := p.constant(exprs[0].typ)
		if err != nil {
			return nil, err
		}
		c.mask = &m.num
	}
	explicit := false
	switch w := p.peek(); w {
	case "==", "!=", "<", "<=", ">", ">=":
		p.next()
		c.op, explicit = w, true
	}
	if c.mask == nil && len(exprs) == 1 && exprs[0].typ == tCTStatus && c.op != "==" {
		return nil, fmt.Errorf("%q: ct status %s without a mask not modelled", p.text(start), c.op)
	}
	if (c.op != "==" && c.op != "!=") && (len(exprs) != 1 || exprs[0].typ == tAddr || exprs[0].typ == tIface || exprs[0].typ == tFibType || exprs[0].typ == tCTState) {
		return nil, fmt.Errorf("%q: %s on %s not modelled", p.text(start), c.op, exprs[0].text)
	}
	switch w := p.peek(); {
	case strings.HasPrefix(w, "@"):
		if c.op != "==" && c.op != "!=" {
			return nil, fmt.Errorf("%s @set not modelled", c.op)
		}
		p.next()
		c.set = w[1:]
	case w == "{":
		if c.op != "==" && c.op != "!=" {
			return nil, fmt.Errorf("%s { set } not modelled", c.op)
		}
		p.next()
		for p.peek() != "}" {
			if p.peek() == "" {
				return nil, errors.New("unterminated { set }")
			}
			v, err := p.constValue(exprs)
			if err != nil {
				return nil, err
			}
			c.list = append(c.list, v)
		}
		p.next()
		if len(c.list) == 0 {
			return nil, errors.New("empty { set }")
		}
	default:
		if w == "" {
			return nil, fmt.Errorf("%q: no value to compare with", p.text(start))
		}
		v, err := p.constValue(exprs)
		if err != nil {
			return nil, err
		}
		c.list = [][]kval{v}
		// A bare flag of a bitmask ("ct status dnat") tests the bit.
		if c.mask == nil && len(exprs) == 1 && exprs[0].typ == tCTStatus && !explicit {
			c.op = "flag"
		}
	}
	c.text = p.text(start)
	return c, nil
}

// constValue reads one constant per expression of a concatenation.
func (p *parser) constValue(exprs []*expr) ([]kval, error) {
	var out []kval
	for i, e := range exprs {
		if i > 0 {
			if err := p.expect("."); err != nil {
				return nil, err
			}
		}
		k, err := p.constant(e.typ)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

func parseVerdict(f []string) (*verdictItem, error) {
	switch {
	case len(f) == 2 && (f[0] == "goto" || f[0] == "jump"):
		return &verdictItem{kind: f[0], chain: f[1]}, nil
	case len(f) == 1 && (f[0] == "drop" || f[0] == "accept" || f[0] == "return"):
		return &verdictItem{kind: f[0]}, nil
	}
	return nil, fmt.Errorf("verdict %q not modelled", strings.Join(f, " "))
}

// ---- evaluation ----

// Trace follows p through the table and returns every possible outcome,
// most probable first (ties in a deterministic order).
func (t *Tracer) Trace(h trace.Host, p trace.Packet) ([]trace.Outcome, error) {
	if !p.Src.IsValid() || !p.Dst.IsValid() {
		return nil, fmt.Errorf("%s: source and destination are required", p)
	}
	if p.Src.Is6() != (t.ip == "ip6") || p.Dst.Is6() != (t.ip == "ip6") {
		return nil, fmt.Errorf("%s: not an %s packet (the table is of family %s)", p, t.ip, t.ip)
	}
	if _, ok := protoNums[p.Proto]; !ok || p.Proto == "icmp" || p.Proto == "icmpv6" {
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
					if c.policy == "drop" {
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
	if c.hook != "" {
		st.Note("%s: hook %s (type %s, priority %d)", c.name, c.hook, c.typ, c.priority)
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

// evalItems evaluates rule i of c from its item k. A match that fails sends
// the branch on to the next rule.
func (t *Tracer) evalItems(h trace.Host, c *tchain, i, k int, st trace.State, depth int) ([]trace.Branch, error) {
	r := c.rules[i]
	if k == 0 && t.visit != nil {
		t.visit(c.name, r.num)
	}
	if k == len(r.items) {
		// Matched, no verdict: the next rule.
		st.Note("%s: %s", t.ruleRef(c, i), r.text)
		return t.walkFrom(h, c, i+1, st, depth)
	}
	next := func(st trace.State) ([]trace.Branch, error) { return t.evalItems(h, c, i, k+1, st, depth) }
	fail := func(st trace.State) ([]trace.Branch, error) { return t.walkFrom(h, c, i+1, st, depth) }
	switch it := r.items[k].(type) {
	case *cond:
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
	case *markItem:
		switch it.op {
		case "=":
			st.Mark = it.val
		case "|":
			st.Mark |= it.val
		case "^":
			st.Mark ^= it.val
		case "&":
			st.Mark &= it.val
		}
		return next(st)
	case *updateItem:
		st.AddAffinity(it.set)
		return next(st)
	case *verdictItem:
		st.Note("%s: %s", t.ruleRef(c, i), r.text)
		return t.verdict(h, c, i, it, st, depth)
	case *vmapItem:
		alts, err := t.evalConcat(h, c, r, k, it.exprs, &st)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", t.ruleRef(c, i), r.text, err)
		}
		var out []trace.Branch
		for _, a := range alts {
			s := a.apply(st, len(alts) > 1)
			if a.absent {
				res, err := fail(s)
				if err != nil {
					return nil, err
				}
				out = append(out, res...)
				continue
			}
			e := t.sets[it.set].lookup(a.vals)
			if e == nil {
				s.Note("%s: %s: %s not in @%s, next rule", t.ruleRef(c, i), r.text, canon(a.vals), it.set)
				res, err := fail(s)
				if err != nil {
					return nil, err
				}
				out = append(out, res...)
				continue
			}
			s.Note("%s: %s: %s → %s", t.ruleRef(c, i), r.text, e.text[:strings.Index(e.text, " : ")], e.verdict)
			res, err := t.verdict(h, c, i, e.verdict, s, depth)
			if err != nil {
				return nil, err
			}
			out = append(out, res...)
		}
		return out, nil
	case *dnatItem:
		if it.mapName == "" {
			st.Dst, st.DNAT = it.to, true
			if it.toPort != 0 {
				st.DstPort = it.toPort
			}
			st.Note("%s: %s", t.ruleRef(c, i), r.text)
			return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
		}
		alts, err := t.evalConcat(h, c, r, k, it.exprs, &st)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", t.ruleRef(c, i), r.text, err)
		}
		var out []trace.Branch
		for _, a := range alts {
			s := a.apply(st, len(alts) > 1)
			if a.absent {
				res, err := fail(s)
				if err != nil {
					return nil, err
				}
				out = append(out, res...)
				continue
			}
			e := t.sets[it.mapName].lookup(a.vals)
			if e == nil {
				s.Note("%s: %s: %s not in @%s, next rule", t.ruleRef(c, i), r.text, canon(a.vals), it.mapName)
				res, err := fail(s)
				if err != nil {
					return nil, err
				}
				out = append(out, res...)
				continue
			}
			if len(e.val) < 1 || len(e.val) > 2 || e.val[0].kind != 'a' || (len(e.val) == 2 && e.val[1].kind != 'n') {
				return nil, fmt.Errorf("%s (%s): element %s: want address [. port]", t.ruleRef(c, i), r.text, e.text)
			}
			s.Dst, s.DNAT = e.val[0].addr, true
			if len(e.val) == 2 {
				s.DstPort = uint16(e.val[1].num)
			}
			s.Note("%s: %s: %s → %s", t.ruleRef(c, i), r.text, a.describe(), netip.AddrPortFrom(s.Dst, s.DstPort))
			out = append(out, trace.Branch{St: s, End: trace.EndAccept})
		}
		return out, nil
	case *masqItem:
		st.Masq = true
		st.Note("%s: %s", t.ruleRef(c, i), r.text)
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	case *opaqueItem:
		st.Note("%s: %s: not simulated: what the kernel does with the packet from here is not known", t.ruleRef(c, i), r.text)
		return []trace.Branch{{St: st, End: trace.EndUnknown}}, nil
	case *rejectItem:
		with := it.with
		if with == "" {
			with = "icmp port unreachable"
		}
		st.Note("%s: %s (%s)", t.ruleRef(c, i), r.text, with)
		return []trace.Branch{{St: st, End: trace.EndReject}}, nil
	}
	return nil, fmt.Errorf("%s: item %q not modelled", t.ruleRef(c, i), r.items[k])
}

// verdict applies a verdict taken in rule i of c.
func (t *Tracer) verdict(h trace.Host, c *tchain, i int, v *verdictItem, st trace.State, depth int) ([]trace.Branch, error) {
	switch v.kind {
	case "return":
		return []trace.Branch{{St: st}}, nil
	case "drop":
		return []trace.Branch{{St: st, End: trace.EndDrop}}, nil
	case "accept":
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	}
	sub := t.chains[v.chain]
	res, err := t.walk(h, sub, st, depth+1)
	if err != nil {
		return nil, err
	}
	if v.kind == "goto" {
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

func (s *tset) lookup(vals []kval) *telem {
	if s.index != nil {
		return s.index[indexKey(vals)]
	}
	for i := range s.elems {
		e := &s.elems[i]
		if len(e.key) != len(vals) {
			continue
		}
		ok := true
		for j := range vals {
			if !e.key[j].matches(vals[j]) {
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
	vals []kval
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
func (t *Tracer) evalConcat(h trace.Host, c *tchain, r *trule, k int, exprs []*expr, st *trace.State) ([]valAlt, error) {
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
	val    kval
	absent bool
	note   string
	ctr    string
	ctrVal uint32
}

// maxBranches bounds the values a numgen may branch into.
const maxBranches = 1 << 16

func (t *Tracer) evalExpr(h trace.Host, c *tchain, r *trule, k int, e *expr, st *trace.State, pending map[string]uint32) ([]exprVal, error) {
	p := st.Pkt
	one := func(v kval) []exprVal { return []exprVal{{p: 1, val: v}} }
	switch e.kind {
	case "saddr":
		return one(kval{kind: 'a', addr: p.Src}), nil
	case "daddr":
		return one(kval{kind: 'a', addr: st.Dst}), nil
	case "l4proto":
		return one(kval{kind: 'n', num: protoNums[p.Proto], str: p.Proto}), nil
	case "dport", "sport":
		if e.proto != "" && e.proto != p.Proto {
			return []exprVal{{p: 1, absent: true}}, nil
		}
		port := st.DstPort
		if e.kind == "sport" {
			port = p.SrcPort
		}
		return one(kval{kind: 'n', num: uint64(port)}), nil
	case "mark":
		return one(kval{kind: 'n', num: uint64(st.Mark)}), nil
	case "iifname":
		return one(kval{kind: 's', str: p.InIface}), nil
	case "oifname":
		// Only the output, forward and postrouting hooks know the output
		// interface (elsewhere the expression breaks: the rule does not
		// match). A local destination is reached through "lo"; any other
		// through an interface the model does not name.
		switch st.Hook {
		case "output", "forward", "postrouting":
		default:
			return []exprVal{{p: 1, absent: true}}, nil
		}
		if h.IsLocal(st.Dst) {
			return one(kval{kind: 's', str: "lo"}), nil
		}
		return one(kval{kind: 's', str: "(not lo)"}), nil
	case "fib-saddr", "fib-daddr":
		a := p.Src
		if e.kind == "fib-daddr" {
			a = st.Dst
		}
		typ := "unicast"
		switch {
		case h.IsLocal(a):
			typ = "local"
		case a.IsMulticast():
			typ = "multicast"
		}
		return one(kval{kind: 's', str: typ}), nil
	case "ctstate":
		return one(kval{kind: 's', str: "new"}), nil
	case "ctstatus":
		var s uint64
		if st.DNAT {
			s |= ctStatusBits["dnat"]
		}
		return one(kval{kind: 'n', num: s}), nil
	case "jhash":
		src := p.Src
		if e.hashOf.kind == "daddr" {
			src = st.Dst
		}
		slot := uint64(trace.ClusterSlot(src, e.seed, uint32(e.mod))) + e.off
		return []exprVal{{p: 1, val: kval{kind: 'n', num: slot}, note: fmt.Sprintf("jhash %s = %d", src, slot)}}, nil
	case "numgen":
		if key, ok := t.counterKey(c, r, k, e); ok && st.Counters != nil {
			v, next := t.incNext(st.Counters, pending, key, e.mod)
			return []exprVal{{p: 1, val: kval{kind: 'n', num: v + e.off}, note: fmt.Sprintf("numgen inc = %d (counter %s)", v+e.off, key), ctr: key, ctrVal: next}}, nil
		}
		if e.mod > maxBranches {
			return nil, fmt.Errorf("%s: %d values to branch into (at most %d modelled)", e.text, e.mod, maxBranches)
		}
		out := make([]exprVal, 0, e.mod)
		for v := range e.mod {
			note := fmt.Sprintf("slot %d of %d, p %s", v+e.off, e.mod, frac(1, e.mod))
			if e.gen == "inc" {
				note = fmt.Sprintf("slot %d of %d: round robin, 1 in %d connections", v+e.off, e.mod, e.mod)
			}
			out = append(out, exprVal{p: 1 / float64(e.mod), val: kval{kind: 'n', num: v + e.off}, note: note})
		}
		return out, nil
	}
	return nil, fmt.Errorf("expression %s not modelled", e.text)
}

// counterKey names e's counter when it is a numgen inc.
func (t *Tracer) counterKey(c *tchain, r *trule, k int, e *expr) (string, bool) {
	if e.kind != "numgen" || e.gen != "inc" {
		return "", false
	}
	nth := 0
	for j := 0; j <= k; j++ {
		switch x := r.items[j].(type) {
		case *cond:
			for _, y := range x.exprs {
				if y.kind == "numgen" && y.gen == "inc" {
					nth++
				}
				if y == e {
					return CounterKey(c.name, r.num, nth), true
				}
			}
		case *vmapItem:
			for _, y := range x.exprs {
				if y.kind == "numgen" && y.gen == "inc" {
					nth++
				}
				if y == e {
					return CounterKey(c.name, r.num, nth), true
				}
			}
		case *dnatItem:
			for _, y := range x.exprs {
				if y.kind == "numgen" && y.gen == "inc" {
					nth++
				}
				if y == e {
					return CounterKey(c.name, r.num, nth), true
				}
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

func (t *Tracer) evalCond(h trace.Host, c *tchain, r *trule, k int, m *cond, st *trace.State) ([]condAlt, error) {
	// A numgen compared with constants: split analytically (no branch per
	// value), unless its counter is tracked.
	if len(m.exprs) == 1 && m.exprs[0].kind == "numgen" && m.mask == nil && m.set == "" {
		e := m.exprs[0]
		if _, inc := t.counterKey(c, r, k, e); !inc || st.Counters == nil {
			n := countMatching(e, m)
			note := fmt.Sprintf("%s: p %s", m.text, frac(n, e.mod))
			if e.gen == "inc" {
				note = fmt.Sprintf("%s: round robin, %d in %d connections reaching the rule", m.text, n, e.mod)
			}
			var out []condAlt
			if n > 0 {
				out = append(out, condAlt{p: float64(n) / float64(e.mod), ok: true, note: note})
			}
			if n < e.mod {
				out = append(out, condAlt{p: float64(e.mod-n) / float64(e.mod), ok: false, note: note})
			}
			return out, nil
		}
	}
	alts, err := t.evalConcat(h, c, r, k, m.exprs, st)
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
			return nil, fmt.Errorf("%s: more than one numgen inc in a match", m.text)
		}
		if len(a.notes) > 0 {
			ca.note = m.text + ": " + strings.Join(a.notes, ", ")
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
func countMatching(e *expr, m *cond) uint64 {
	lo, hi := e.off, e.off+e.mod // [lo, hi)
	inRange := func(v uint64) bool { return v >= lo && v < hi }
	var n uint64
	switch m.op {
	case "==", "!=":
		seen := map[uint64]bool{}
		for _, v := range m.list {
			if inRange(v[0].num) && !seen[v[0].num] {
				seen[v[0].num] = true
				n++
			}
		}
		if m.op == "!=" {
			n = e.mod - n
		}
	default:
		x := m.list[0][0].num
		// Count v in [lo, hi) with v op x.
		count := func(a, b uint64) uint64 { // values in [a, b) ∩ [lo, hi)
			a, b = max(a, lo), min(b, hi)
			if b <= a {
				return 0
			}
			return b - a
		}
		switch m.op {
		case "<":
			n = count(0, x)
		case "<=":
			n = count(0, x+1)
		case ">":
			n = count(x+1, math.MaxUint64)
		case ">=":
			n = count(x, math.MaxUint64)
		}
	}
	return n
}

// holds evaluates match m on the values vals.
func (t *Tracer) holds(h trace.Host, m *cond, vals []kval, src netip.Addr) (bool, error) {
	if m.mask != nil {
		vals = []kval{{kind: 'n', num: vals[0].num & *m.mask}}
	}
	var in bool
	switch {
	case m.set != "":
		s := t.sets[m.set]
		if s.isMap {
			return false, fmt.Errorf("@%s is a map, not a set", m.set)
		}
		in = s.lookup(vals) != nil
		// An affinity set the caller says holds the source.
		if !in && len(vals) == 1 && vals[0].kind == 'a' && vals[0].addr == src && h.AffinityHit[m.set] {
			in = true
		}
	case m.op == "flag":
		return vals[0].num&m.list[0][0].num != 0, nil
	case m.op == "==" || m.op == "!=":
		for _, l := range m.list {
			if constMatches(m.exprs, l, vals) {
				in = true
				break
			}
		}
	default:
		v, x := vals[0].num, m.list[0][0].num
		switch m.op {
		case "<":
			return v < x, nil
		case "<=":
			return v <= x, nil
		case ">":
			return v > x, nil
		case ">=":
			return v >= x, nil
		}
		return false, fmt.Errorf("operator %s not modelled", m.op)
	}
	if m.op == "!=" {
		return !in, nil
	}
	return in, nil
}

// constMatches compares a packet's values with one constant of each part;
// interface names ending in "*" match by prefix.
func constMatches(exprs []*expr, c, vals []kval) bool {
	for i := range vals {
		if exprs[i].typ == tIface {
			if pfx, ok := strings.CutSuffix(c[i].str, "*"); ok {
				if !strings.HasPrefix(vals[i].str, pfx) {
					return false
				}
				continue
			}
		}
		if !c[i].matches(vals[i]) {
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
