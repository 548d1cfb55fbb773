package model

// The parser: the text of the rules, set elements and base chains of a
// Model, as the renderer writes them, into the items of items.go.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

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
