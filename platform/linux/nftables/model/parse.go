package model

// The parser: the text of the rules, set elements and base chains of a
// Model, as the renderer writes them, into the typed values of package nft
// (whose String methods write the same text back).

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// parseElem reads one element of s ("key", or "key : value" for a map's;
// a verdict map's value is a verdict); hasVal says whether it had a value.
func parseElem(s *Set, text string) (e nft.Elem, hasVal bool, err error) {
	k, v, hasVal := strings.Cut(text, " : ")
	if e.Key, err = parseKey(k); err != nil {
		return e, hasVal, err
	}
	switch {
	case !hasVal || !s.IsMap:
	case s.Spec.IsVerdict():
		e.Verdict, err = parseVerdict(strings.Fields(v))
	default:
		e.Data, err = parseKey(v)
	}
	return e, hasVal, err
}

// parseKey reads "a . b": the parts of an element's key or data value.
func parseKey(text string) (nft.Key, error) {
	out := make(nft.Key, 0, strings.Count(text, " . ")+1)
	for more := true; more; {
		var p string
		p, text, more = strings.Cut(text, " . ")
		v, err := parseKeyPart(p)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// parseSpec reads a set's or map's definition ("{ type ipv4_addr ; flags
// interval ; }"), clause by clause; it must write back as it was read.
func parseSpec(text string) (SetSpec, error) {
	var s SetSpec
	body, ok := strings.CutPrefix(text, "{ ")
	if ok {
		body, ok = strings.CutSuffix(body, " }")
	}
	if !ok {
		return s, fmt.Errorf("definition %q: want { ... }", text)
	}
	for _, cl := range strings.Split(body, ";") {
		cl = strings.TrimSpace(cl)
		w, rest, _ := strings.Cut(cl, " ")
		switch w {
		case "":
		case "type", "typeof":
			s.Typeof = w == "typeof"
			k, d, isMap := strings.Cut(rest, " : ")
			s.Key = strings.Split(k, " . ")
			if isMap {
				s.Data = strings.Split(d, " . ")
			}
		case "flags":
			s.Flags = strings.Split(rest, ",")
		case "timeout":
			s.Timeout = rest
		case "auto-merge":
			s.AutoMerge = true
		default:
			return s, fmt.Errorf("definition %q: clause %q not modelled", text, cl)
		}
	}
	if len(s.Key) == 0 {
		return s, fmt.Errorf("definition %q: no type", text)
	}
	if s.String() != text {
		return s, fmt.Errorf("definition %q: not in the form kproxy writes (%s)", text, s)
	}
	return s, nil
}

// parseBase reads "type nat hook prerouting priority -100 [; policy accept]".
func parseBase(base string) (nft.BaseChain, error) {
	var c nft.BaseChain
	parts := strings.Split(base, ";")
	f := strings.Fields(parts[0])
	if len(f) < 6 || f[0] != "type" || f[2] != "hook" || f[4] != "priority" {
		return c, fmt.Errorf("base chain %q: want \"type T hook H priority P\"", base)
	}
	c.Type, c.Hook = f[1], f[3]
	prio, err := parsePriority(f[5:])
	if err != nil {
		return c, err
	}
	c.Priority = prio
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		switch p {
		case "", "policy accept":
		case "policy drop":
			c.Policy = "drop"
		default:
			return c, fmt.Errorf("base chain option %q not modelled", p)
		}
	}
	return c, checkBase(c)
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
	ip   string // "ip" or "ip6"
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

// parseRule reads the text of a rule of a table of family ip ("ip" or
// "ip6"), then checks it as the tracer does (checkRule).
func parseRule(ip, rule string) (nft.Rule, error) {
	p := &parser{ip: ip, toks: tokens(rule)}
	var stmts nft.Rule
	for p.pos < len(p.toks) {
		w := p.peek()
		switch w {
		case "jump", "goto":
			p.next()
			c := p.next()
			if c == "" {
				return nil, fmt.Errorf("%s without a chain", w)
			}
			stmts = append(stmts, &nft.Verdict{Kind: w, Chain: c})
		case "return", "drop", "accept":
			p.next()
			stmts = append(stmts, &nft.Verdict{Kind: w})
		case "reject":
			p.next()
			r := &nft.Reject{}
			if p.peek() == "with" {
				p.next()
				switch p.peek() {
				case "tcp":
					if err := p.expect("tcp", "reset"); err != nil {
						return nil, err
					}
					r.With = "tcp reset"
				case "icmp", "icmpv6", "icmpx":
					fam := p.next()
					if err := p.expect("type"); err != nil {
						return nil, err
					}
					r.With = fam + " type " + p.next()
				default:
					return nil, fmt.Errorf("reject with %q not modelled", p.peek())
				}
			}
			stmts = append(stmts, r)
		case "masquerade":
			p.next()
			m := &nft.Masquerade{}
			for slices.Contains([]string{"fully-random", "random", "persistent"}, p.peek()) {
				m.Flags = append(m.Flags, p.next())
			}
			stmts = append(stmts, m)
		case "dnat":
			d, err := p.dnat()
			if err != nil {
				return nil, err
			}
			stmts = append(stmts, d)
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
			if err := p.expect("}"); err != nil {
				return nil, err
			}
			stmts = append(stmts, &nft.Update{Set: s, Key: e})
		default:
			if w == "meta" && p.pos+2 < len(p.toks) && p.toks[p.pos+1] == "mark" && p.toks[p.pos+2] == "set" {
				m, err := p.markSet()
				if err != nil {
					return nil, err
				}
				stmts = append(stmts, m)
				continue
			}
			st, err := p.match()
			if err != nil {
				return nil, err
			}
			stmts = append(stmts, st)
		}
	}
	if err := checkRule(ip, stmts); err != nil {
		return nil, err
	}
	return stmts, nil
}

// markSet reads "meta mark set meta mark | 0x4000" (or ^, &) or "meta mark
// set 0x4000".
func (p *parser) markSet() (*nft.MarkSet, error) {
	if err := p.expect("meta", "mark", "set"); err != nil {
		return nil, err
	}
	m := &nft.MarkSet{}
	if p.peek() == "meta" {
		if err := p.expect("meta", "mark"); err != nil {
			return nil, err
		}
		m.Op = p.next()
		if m.Op != "|" && m.Op != "^" && m.Op != "&" {
			return nil, fmt.Errorf("meta mark set meta mark %q not modelled", m.Op)
		}
	}
	v, err := parseNum(p.next(), 32)
	if err != nil {
		return nil, fmt.Errorf("mark value: %w", err)
	}
	m.Val = v
	return m, nil
}

// dnat reads "dnat ip to 10.0.0.1:80", "dnat ip6 to [fd00::1]:80" or
// "dnat ip to <concatenation> map @m".
func (p *parser) dnat() (*nft.DNAT, error) {
	p.next()
	d := &nft.DNAT{}
	if w := p.peek(); w == "ip" || w == "ip6" {
		d.Family = p.next()
	}
	if err := p.expect("to"); err != nil {
		return nil, err
	}
	target := p.peek()
	if ap, err := netip.ParseAddrPort(target); err == nil {
		p.next()
		d.Addr, d.Port = ap.Addr(), ap.Port()
	} else if a, err := netip.ParseAddr(target); err == nil {
		p.next()
		d.Addr = a
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
		d.Key, d.Map = exprs, s
	}
	return d, nil
}

// concat reads "expr [. expr]...".
func (p *parser) concat() ([]nft.Expr, error) {
	var out []nft.Expr
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

// primary reads one expression that yields a value (checkExpr says
// whether the tracer models it).
func (p *parser) primary() (nft.Expr, error) {
	w := p.next()
	switch w {
	case "ip", "ip6", "th", "tcp", "udp", "sctp":
		return &nft.Payload{Base: w, Field: p.next()}, nil
	case "meta":
		return &nft.Meta{Key: p.next()}, nil
	case "iifname", "oifname":
		return &nft.Meta{Key: w}, nil
	case "ct":
		return &nft.CT{Key: p.next()}, nil
	case "fib":
		f := &nft.Fib{Addr: p.next()}
		return f, p.expect("type")
	case "numgen":
		e := &nft.Numgen{Mode: p.next()}
		err := p.number("mod", &e.Mod)
		if err == nil && p.peek() == "offset" {
			err = p.number("offset", &e.Offset)
		}
		return e, err
	case "jhash":
		of, err := p.primary()
		if err != nil {
			return nil, err
		}
		e := &nft.Jhash{Of: of}
		var seed uint64
		if err := p.number("mod", &e.Mod); err != nil {
			return nil, err
		}
		if err := p.number("seed", &seed); err != nil {
			return nil, err
		}
		e.Seed = uint32(seed)
		if p.peek() == "offset" {
			err = p.number("offset", &e.Offset)
		}
		return e, err
	}
	return nil, fmt.Errorf("expression %q not modelled", w)
}

// number reads "word N", N a 32-bit number.
func (p *parser) number(word string, n *uint64) error {
	if err := p.expect(word); err != nil {
		return err
	}
	v, err := strconv.ParseUint(p.next(), 0, 32)
	if err != nil {
		return fmt.Errorf("%s: %w", word, err)
	}
	*n = v
	return nil
}

// constant reads one constant of type typ.
func (p *parser) constant(typ nft.Type) (nft.Value, error) {
	w := p.next()
	if w == "" {
		return nft.Value{}, errors.New("missing value")
	}
	switch typ {
	case nft.TypeAddr:
		k, err := parseKeyPart(w)
		if err != nil || (k.Kind != nft.KindAddr && k.Kind != nft.KindPrefix) {
			return nft.Value{}, fmt.Errorf("address %q", w)
		}
		return k, nil
	case nft.TypeProto:
		if v, ok := nft.Proto(w); ok {
			return v, nil
		}
		n, err := strconv.ParseUint(w, 10, 8)
		if err != nil {
			return nft.Value{}, fmt.Errorf("protocol %q", w)
		}
		return nft.Num(n), nil
	case nft.TypePort, nft.TypeMark, nft.TypeNum:
		v, err := parseNum(w, 32)
		if err != nil {
			return nft.Value{}, fmt.Errorf("number %q", w)
		}
		return v, nil
	case nft.TypeIface:
		s, err := strconv.Unquote(w)
		if err != nil {
			if strings.ContainsAny(w, `"\`) {
				return nft.Value{}, fmt.Errorf("interface name %s", w)
			}
			s = w
		}
		return nft.Quoted(s), nil
	case nft.TypeFibType:
		if !slices.Contains(nft.FibTypes, w) {
			return nft.Value{}, fmt.Errorf("fib type %q", w)
		}
		return nft.Name(w), nil
	case nft.TypeCTState:
		if !slices.Contains(nft.CTStates, w) {
			return nft.Value{}, fmt.Errorf("ct state %q", w)
		}
		return nft.Name(w), nil
	case nft.TypeCTStatus:
		if v, ok := nft.CTStatus(w); ok {
			return v, nil
		}
		v, err := parseNum(w, 32)
		if err != nil {
			return nft.Value{}, fmt.Errorf("ct status %q", w)
		}
		return v, nil
	}
	return nft.Value{}, fmt.Errorf("constant %q", w)
}

func addrOf(k nft.Value) netip.Addr {
	if k.Kind == nft.KindPrefix {
		return k.Prefix.Addr()
	}
	return k.Addr
}

// match reads a match: a concatenation and its right-hand side, or a
// verdict map lookup.
func (p *parser) match() (nft.Stmt, error) {
	start := p.pos
	exprs, err := p.concat()
	if err != nil {
		return nil, err
	}
	if p.peek() == "vmap" {
		p.next()
		s, ok := strings.CutPrefix(p.next(), "@")
		if !ok {
			return nil, errors.New("vmap: only named maps (@name) are modelled")
		}
		return &nft.VMap{Key: exprs, Map: s}, nil
	}
	c := &nft.Match{Left: exprs}
	typ := exprs[0].Type()
	if p.peek() == "&" {
		p.next()
		m, err := p.constant(typ)
		if err != nil {
			return nil, err
		}
		c.Mask = &m
	}
	switch w := nft.Op(p.peek()); w {
	case nft.OpEq, nft.OpNe, nft.OpLt, nft.OpLe, nft.OpGt, nft.OpGe:
		p.next()
		c.Op = w
	}
	switch w := p.peek(); {
	case strings.HasPrefix(w, "@"):
		p.next()
		c.Set = w[1:]
	case w == "{":
		p.next()
		c.Anon = true
		for p.peek() != "}" {
			if p.peek() == "" {
				return nil, errors.New("unterminated { set }")
			}
			v, err := p.constValue(exprs)
			if err != nil {
				return nil, err
			}
			c.Right = append(c.Right, v)
		}
		p.next()
	default:
		if w == "" {
			return nil, fmt.Errorf("%q: no value to compare with", p.text(start))
		}
		v, err := p.constValue(exprs)
		if err != nil {
			return nil, err
		}
		c.Right = []nft.Key{v}
	}
	return c, nil
}

// constValue reads one constant per expression of a concatenation.
func (p *parser) constValue(exprs []nft.Expr) (nft.Key, error) {
	var out nft.Key
	for i, e := range exprs {
		if i > 0 {
			if err := p.expect("."); err != nil {
				return nil, err
			}
		}
		k, err := p.constant(e.Type())
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

func parseVerdict(f []string) (*nft.Verdict, error) {
	switch {
	case len(f) == 2 && (f[0] == "goto" || f[0] == "jump"):
		return &nft.Verdict{Kind: f[0], Chain: f[1]}, nil
	case len(f) == 1 && (f[0] == "drop" || f[0] == "accept" || f[0] == "return"):
		return &nft.Verdict{Kind: f[0]}, nil
	}
	return nil, fmt.Errorf("verdict %q not modelled", strings.Join(f, " "))
}
