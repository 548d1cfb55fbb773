package model

// Reading a table back from the kernel: `nft -j list table ip kproxy`
// prints the table as JSON (libnftables' schema), and ParseJSON turns it
// into the Model the tracer reads, built as the typed values of package nft
// (no text in between). The converter knows exactly the expression
// shapes kproxy's rules are made of (matches on addresses, ports,
// protocols, interfaces, fib types, the mark, ct state and status, numgen
// and jhash, concatenations, named and anonymous sets; verdicts, vmaps,
// dnat to a constant or through a map, masquerade, reject, meta mark set,
// set update). A rule with anything else (a counter, a log, a comment, a
// limit, another statement or expression) is not guessed at: it becomes
// an opaque rule (Opaque), which the tracer never goes past, and is listed
// in Unreadable, so a rule kproxy did not write is reported, never traced
// as something else.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"sigs.k8s.io/knftables"
)

// Unreadable is one object of a listed table the converter did not read:
// a rule (Rule from 1) or another object kind kproxy never creates.
type Unreadable struct {
	// Chain and Rule locate a rule ("" and 0 for another object).
	Chain string
	Rule  int
	// What names the object when it is not a rule ("flowtable f").
	What   string
	Reason string
	// JSON is the object as nft printed it.
	JSON string
}

func (u Unreadable) String() string {
	if u.Chain != "" {
		return fmt.Sprintf("chain %s rule %d: %s: %s", u.Chain, u.Rule, u.Reason, u.JSON)
	}
	return fmt.Sprintf("%s: %s: %s", u.What, u.Reason, u.JSON)
}

// Listing is a table read back from nft.
type Listing struct {
	// Model is the table (nil when the listing holds no table of that
	// name).
	Model *Model
	// Unreadable lists the rules kept as opaque rules, and the objects
	// left out.
	Unreadable []Unreadable
}

type jsonDoc struct {
	Nftables []map[string]json.RawMessage `json:"nftables"`
}

// jsonObject is a table, chain, rule, set or map of the listing: the
// fields of all of them.
type jsonObject struct {
	Family, Table, Name string
	Comment             *string
	// A chain's; Type is a set's key type(s) too.
	Type   any
	Hook   string
	Prio   *int
	Policy string
	Dev    any
	// A rule's.
	Chain string
	Expr  []json.RawMessage
	// A set's or map's.
	Map     any
	Flags   []string
	Timeout *int
	Elem    []json.RawMessage
}

// ParseJSON reads the output of `nft -j list table FAMILY NAME` (or of
// `nft -j list ruleset`: only that table is read) into a Model of typed
// rules and elements. They are the values the Fake reads from the
// renderer's text for the same table, with one exception: nft lists the
// members of an anonymous set of addresses sorted and merged (SameRule
// compares them as the addresses they cover). An element or set the
// converter cannot read is an error: they hold data the tracer needs.
func ParseJSON(fam knftables.Family, table string, data []byte) (*Listing, error) {
	var doc jsonDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("reading nft's JSON: %w", err)
	}
	c := &conv{ip: "ip"}
	if fam == knftables.IPv6Family {
		c.ip = "ip6"
	} else if fam != knftables.IPv4Family {
		return nil, fmt.Errorf("family %q: only ip and ip6 tables are read", fam)
	}
	out := &Listing{}
	var m *Model
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			if kind == "metainfo" {
				continue
			}
			var o jsonObject
			if err := json.Unmarshal(raw, &o); err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
			if kind == "table" {
				if o.Family == string(fam) && o.Name == table {
					m = &Model{Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
					if o.Comment != nil {
						m.Comment = *o.Comment
					}
				}
				continue
			}
			if o.Family != string(fam) || o.Table != table {
				continue
			}
			if m == nil {
				return nil, fmt.Errorf("%s %s listed before its table", kind, o.Name)
			}
			switch kind {
			case "chain":
				base, err := o.base()
				if err != nil {
					return nil, fmt.Errorf("chain %s: %w", o.Name, err)
				}
				m.Chains[o.Name] = &Chain{Name: o.Name, Base: base}
			case "rule":
				ch := m.Chains[o.Chain]
				if ch == nil {
					return nil, fmt.Errorf("rule of chain %s listed before its chain", o.Chain)
				}
				rule, err := c.rule(o)
				if err != nil {
					out.Unreadable = append(out.Unreadable, Unreadable{Chain: o.Chain, Rule: len(ch.Rules) + 1,
						Reason: err.Error(), JSON: compact(raw)})
					rule = Opaque("not read: " + err.Error())
				}
				ch.Rules = append(ch.Rules, rule)
			case "set", "map":
				set, err := c.set(kind == "map", o)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", kind, o.Name, err)
				}
				m.Sets[o.Name] = set
			default:
				// Objects kproxy never creates (counters, quotas,
				// flowtables, ct helpers...): reported, not read.
				out.Unreadable = append(out.Unreadable, Unreadable{What: kind + " " + o.Name,
					Reason: "an object kproxy does not create", JSON: compact(raw)})
			}
		}
	}
	out.Model = m
	return out, nil
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// base reads a base chain's spec (nil for a regular chain).
func (o jsonObject) base() (*nft.BaseChain, error) {
	typ, _ := o.Type.(string)
	if o.Hook == "" && o.Type == nil {
		return nil, nil
	}
	if o.Dev != nil {
		return nil, errors.New("a chain bound to a device is not read")
	}
	if typ == "" || o.Hook == "" || o.Prio == nil {
		return nil, fmt.Errorf("base chain with type %v hook %q: want a type, a hook and a priority", o.Type, o.Hook)
	}
	b := &nft.BaseChain{Type: typ, Hook: o.Hook, Priority: *o.Prio}
	if o.Policy != "accept" {
		b.Policy = o.Policy
	}
	return b, nil
}

// conv converts the expressions of one family's table.
type conv struct {
	ip string // "ip" or "ip6"
}

// rule converts one rule's expression list, then checks it as the tracer
// does (a shape converted but not modelled is unreadable too).
func (c *conv) rule(r jsonObject) (nft.Rule, error) {
	if r.Comment != nil {
		return nil, errors.New("a rule with a comment (kproxy writes none)")
	}
	var rule nft.Rule
	for _, raw := range r.Expr {
		sts, err := c.stmt(raw)
		if err != nil {
			return nil, err
		}
		rule = append(rule, sts...)
	}
	if err := checkRule(c.ip, rule); err != nil {
		return nil, fmt.Errorf("read as %q, which the tracer does not model: %w", rule, err)
	}
	return rule, nil
}

// one splits a JSON object of one key.
func one(raw json.RawMessage) (string, json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", nil, fmt.Errorf("want an object, got %s", compact(raw))
	}
	if len(obj) != 1 {
		return "", nil, fmt.Errorf("want an object of one key, got %s", compact(raw))
	}
	for k, v := range obj {
		return k, v, nil
	}
	return "", nil, nil
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// strictUnmarshal decodes, refusing unknown fields.
func strictUnmarshal(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	return dec.Decode(v)
}

// stmt converts one statement of a rule (a tcp reset into two: nft lists
// it without the protocol match it depends on).
func (c *conv) stmt(raw json.RawMessage) ([]nft.Stmt, error) {
	k, v, err := one(raw)
	if err != nil {
		return nil, err
	}
	switch k {
	case "match":
		m, err := c.match(v)
		return []nft.Stmt{m}, err
	case "accept", "drop", "return", "jump", "goto":
		vd, err := verdict(k, v)
		return []nft.Stmt{vd}, err
	case "vmap":
		var vm struct{ Key, Data json.RawMessage }
		if err := json.Unmarshal(v, &vm); err != nil {
			return nil, err
		}
		key, err := c.exprs(vm.Key)
		if err != nil {
			return nil, err
		}
		m, err := namedSet(vm.Data)
		if err != nil {
			return nil, fmt.Errorf("vmap: %w (only named maps are read)", err)
		}
		return []nft.Stmt{&nft.VMap{Key: key, Map: m}}, nil
	case "mangle":
		var mg struct{ Key, Value json.RawMessage }
		if err := json.Unmarshal(v, &mg); err != nil {
			return nil, err
		}
		if !c.isMark(mg.Key) {
			return nil, fmt.Errorf("setting %s (kproxy sets only the mark)", compact(mg.Key))
		}
		ms, err := c.markSet(mg.Value)
		return []nft.Stmt{ms}, err
	case "set":
		var su struct {
			Op        string
			Elem, Set json.RawMessage
		}
		if err := json.Unmarshal(v, &su); err != nil {
			return nil, err
		}
		if su.Op != "update" {
			return nil, fmt.Errorf("set %s (kproxy only updates)", su.Op)
		}
		key, err := c.expr(su.Elem)
		if err != nil {
			return nil, err
		}
		s, err := namedSet(su.Set)
		return []nft.Stmt{&nft.Update{Set: s, Key: key}}, err
	case "masquerade":
		var mq struct {
			Flags any `json:"flags"`
		}
		if !isNull(v) {
			if err := strictUnmarshal(v, &mq); err != nil {
				return nil, fmt.Errorf("masquerade %s: %w", compact(v), err)
			}
		}
		flags, err := names(mq.Flags)
		if err != nil {
			return nil, err
		}
		if len(flags) > 0 && !slices.Equal(flags, []string{"fully-random"}) {
			return nil, fmt.Errorf("masquerade flags %v (kproxy writes fully-random only)", flags)
		}
		return []nft.Stmt{&nft.Masquerade{Flags: flags}}, nil
	case "reject":
		var rj struct {
			Type string `json:"type"`
			Expr string `json:"expr"`
		}
		if !isNull(v) {
			if err := strictUnmarshal(v, &rj); err != nil {
				return nil, fmt.Errorf("reject %s: %w", compact(v), err)
			}
		}
		switch {
		case isNull(v), rj.Expr == "port-unreachable" && (rj.Type == "icmp" && c.ip == "ip" || rj.Type == "icmpv6" && c.ip == "ip6" || rj.Type == "icmpx"):
			// The default of a plain "reject" in this family.
			return []nft.Stmt{&nft.Reject{}}, nil
		case rj.Type == "tcp reset" && rj.Expr == "":
			// nft leaves out the "meta l4proto tcp" match the reset
			// needs (and the renderer writes).
			tcp, _ := nft.Proto("tcp")
			return []nft.Stmt{&nft.Match{Left: []nft.Expr{&nft.Meta{Key: "l4proto"}}, Right: []nft.Key{{tcp}}},
				&nft.Reject{With: "tcp reset"}}, nil
		}
		return nil, fmt.Errorf("reject %s (kproxy rejects with tcp reset or the default)", compact(v))
	case "dnat":
		d, err := c.dnat(v)
		return []nft.Stmt{d}, err
	}
	return nil, fmt.Errorf("statement %q is not one kproxy writes", k)
}

// verdict reads a verdict of kind k ("jump" and "goto" with a target).
func verdict(k string, v json.RawMessage) (*nft.Verdict, error) {
	switch k {
	case "accept", "drop", "return":
		if !isNull(v) {
			return nil, fmt.Errorf("verdict %s with arguments", k)
		}
		return &nft.Verdict{Kind: k}, nil
	case "jump", "goto":
		var t struct {
			Target string `json:"target"`
		}
		if err := json.Unmarshal(v, &t); err != nil || t.Target == "" {
			return nil, fmt.Errorf("%s %s: want a target", k, compact(v))
		}
		return &nft.Verdict{Kind: k, Chain: t.Target}, nil
	}
	return nil, fmt.Errorf("verdict %s is not one kproxy writes", k)
}

// namedSet reads "@name".
func namedSet(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || !strings.HasPrefix(s, "@") || len(s) == 1 {
		return "", fmt.Errorf("%s: want a named set (@name)", compact(raw))
	}
	return s[1:], nil
}

func (c *conv) isMark(raw json.RawMessage) bool {
	e, err := c.expr(raw)
	m, ok := e.(*nft.Meta)
	return err == nil && ok && m.Key == "mark"
}

// markSet reads the value the mark is set to: "meta mark | 0x4000" (or ^,
// &) or a constant.
func (c *conv) markSet(raw json.RawMessage) (*nft.MarkSet, error) {
	if n, ok := number(raw); ok {
		return &nft.MarkSet{Val: nft.Hex32(uint32(n))}, nil
	}
	k, v, err := one(raw)
	if err != nil {
		return nil, err
	}
	var args []json.RawMessage
	if k != "|" && k != "^" && k != "&" {
		return nil, fmt.Errorf("meta mark set %s: not a form kproxy writes", compact(raw))
	}
	if err := json.Unmarshal(v, &args); err != nil || len(args) != 2 {
		return nil, fmt.Errorf("%s %s: want two operands", k, compact(v))
	}
	n, ok := number(args[1])
	if !c.isMark(args[0]) || !ok {
		return nil, fmt.Errorf("meta mark set %s: kproxy combines the mark with a constant", compact(raw))
	}
	return &nft.MarkSet{Op: k, Val: nft.Hex32(uint32(n))}, nil
}

// number reads a number. nft prints 32-bit values of bit 31 set as signed
// ("numgen random mod 2147483648" lists as mod -2147483648): those are read
// back as the unsigned value they are.
func number(raw json.RawMessage) (uint64, bool) {
	s := strings.TrimSpace(string(raw))
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return n, true
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n < 0 && n >= math.MinInt32 {
		return uint64(uint32(int32(n))), true
	}
	return 0, false
}

// u32 is a json.Number field read with number.
type u32 uint64

func (u *u32) UnmarshalJSON(b []byte) error {
	n, ok := number(b)
	if !ok {
		return fmt.Errorf("%s: want a number", b)
	}
	*u = u32(n)
	return nil
}

// dnat reads "dnat ip to ADDR[:PORT]" and "dnat ip to KEY map @m".
func (c *conv) dnat(raw json.RawMessage) (*nft.DNAT, error) {
	var d struct {
		Family string          `json:"family"`
		Addr   json.RawMessage `json:"addr"`
		Port   json.RawMessage `json:"port"`
	}
	if err := strictUnmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("dnat %s: %w", compact(raw), err)
	}
	if d.Family != "" && d.Family != c.ip {
		return nil, fmt.Errorf("dnat %s in an %s table", d.Family, c.ip)
	}
	out := &nft.DNAT{Family: c.ip}
	var a string
	if err := json.Unmarshal(d.Addr, &a); err == nil {
		if out.Addr, err = netip.ParseAddr(a); err != nil {
			return nil, fmt.Errorf("dnat to %q: %w", a, err)
		}
		if isNull(d.Port) {
			return out, nil
		}
		port, ok := number(d.Port)
		if !ok || port == 0 || port > 65535 {
			return nil, fmt.Errorf("dnat port %s: want a number", compact(d.Port))
		}
		out.Port = uint16(port)
		return out, nil
	}
	if !isNull(d.Port) {
		return nil, errors.New("dnat through a map with a port: not a form kproxy writes")
	}
	k, v, err := one(d.Addr)
	if err != nil || k != "map" {
		return nil, fmt.Errorf("dnat to %s: want an address or a map lookup", compact(d.Addr))
	}
	var mp struct {
		Key  json.RawMessage `json:"key"`
		Data json.RawMessage `json:"data"`
	}
	if err := strictUnmarshal(v, &mp); err != nil {
		return nil, err
	}
	if out.Key, err = c.exprs(mp.Key); err != nil {
		return nil, err
	}
	if out.Map, err = namedSet(mp.Data); err != nil {
		return nil, fmt.Errorf("dnat map: %w", err)
	}
	return out, nil
}

// match reads one comparison.
func (c *conv) match(raw json.RawMessage) (*nft.Match, error) {
	var m struct {
		Op    string          `json:"op"`
		Left  json.RawMessage `json:"left"`
		Right json.RawMessage `json:"right"`
	}
	if err := strictUnmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("match %s: %w", compact(raw), err)
	}
	out := &nft.Match{}
	left := m.Left
	if k, v, err := one(m.Left); err == nil && k == "&" {
		// A masked expression ("meta mark & 0x4000").
		var args []json.RawMessage
		if err := json.Unmarshal(v, &args); err != nil || len(args) != 2 {
			return nil, fmt.Errorf("& %s: want two operands", compact(v))
		}
		left = args[0]
		e, err := c.expr(left)
		if err != nil {
			return nil, err
		}
		mask, err := c.value(e.Type(), args[1])
		if err != nil {
			return nil, err
		}
		out.Mask = &mask
	}
	var err error
	if out.Left, err = c.exprs(left); err != nil {
		return nil, err
	}
	typ := out.Left[0].Type()
	if err := c.right(out, typ, m.Right); err != nil {
		return nil, fmt.Errorf("%s: %w", nft.Concat(out.Left), err)
	}
	switch m.Op {
	case "==":
		if out.Mask != nil {
			out.Op = nft.OpEq
		}
	case "in":
		// A flag of a bitmask (ct state, ct status), as nft prints it.
		if typ != nft.TypeCTState && typ != nft.TypeCTStatus {
			return nil, fmt.Errorf("%s in ...: not a form kproxy writes", nft.Concat(out.Left))
		}
	case "!":
		// "ct status & dnat == 0", which nft prints as "ct status ! dnat".
		if typ != nft.TypeCTStatus || out.Mask != nil || out.Anon || out.Set != "" {
			return nil, fmt.Errorf("%s ! ...: not a form kproxy writes", nft.Concat(out.Left))
		}
		out.Mask, out.Op, out.Right = &out.Right[0][0], nft.OpEq, []nft.Key{{nft.Num(0)}}
	case "!=", "<", "<=", ">", ">=":
		out.Op = nft.Op(m.Op)
	default:
		return nil, fmt.Errorf("operator %q is not one kproxy writes", m.Op)
	}
	return out, nil
}

// right reads the right side of match m, whose expression yields typ: a
// named set, an anonymous set, or one constant.
func (c *conv) right(m *nft.Match, typ nft.Type, raw json.RawMessage) error {
	var s string
	if json.Unmarshal(raw, &s) == nil && strings.HasPrefix(s, "@") {
		var err error
		m.Set, err = namedSet(raw)
		return err
	}
	var members []json.RawMessage
	if k, v, err := one(raw); err == nil && k == "set" {
		if err := json.Unmarshal(v, &members); err != nil || len(members) == 0 {
			return fmt.Errorf("set %s: want elements", compact(v))
		}
		m.Anon = true
	} else {
		members = []json.RawMessage{raw}
	}
	if len(m.Left) > 1 {
		return fmt.Errorf("%s: a concatenation compared with constants is not read", compact(raw))
	}
	for _, e := range members {
		if k, v, err := one(e); err == nil && (k == "prefix" || k == "range") {
			if typ != nft.TypeAddr {
				return fmt.Errorf("%s of %s: only addresses", k, compact(e))
			}
			ps, err := prefixes(k, v)
			if err != nil {
				return err
			}
			for _, p := range ps {
				m.Right = append(m.Right, nft.Key{p})
			}
			continue
		}
		v, err := c.value(typ, e)
		if err != nil {
			return err
		}
		m.Right = append(m.Right, nft.Key{v})
	}
	// A range or several prefixes for one constant: nft's set of them.
	if !m.Anon && len(m.Right) > 1 {
		m.Anon = true
	}
	return nil
}

// exprs reads an expression or a concatenation.
func (c *conv) exprs(raw json.RawMessage) ([]nft.Expr, error) {
	k, v, err := one(raw)
	if err != nil || k != "concat" {
		e, err := c.expr(raw)
		if err != nil {
			return nil, err
		}
		return []nft.Expr{e}, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(v, &parts); err != nil || len(parts) < 2 {
		return nil, fmt.Errorf("concat %s: want two parts or more", compact(v))
	}
	out := make([]nft.Expr, len(parts))
	for i, p := range parts {
		if out[i], err = c.expr(p); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// expr converts one expression that yields a value.
func (c *conv) expr(raw json.RawMessage) (nft.Expr, error) {
	k, v, err := one(raw)
	if err != nil {
		return nil, err
	}
	var e nft.Expr
	switch k {
	case "payload":
		var p struct {
			Protocol string `json:"protocol"`
			Field    string `json:"field"`
		}
		err = strictUnmarshal(v, &p)
		e = &nft.Payload{Base: p.Protocol, Field: p.Field}
	case "meta":
		var mt struct {
			Key string `json:"key"`
		}
		err = strictUnmarshal(v, &mt)
		e = &nft.Meta{Key: mt.Key}
	case "ct":
		var ct struct {
			Key string `json:"key"`
		}
		err = strictUnmarshal(v, &ct)
		e = &nft.CT{Key: ct.Key}
	case "fib":
		var f struct {
			Result string   `json:"result"`
			Flags  []string `json:"flags"`
		}
		err = strictUnmarshal(v, &f)
		if err == nil && (f.Result != "type" || len(f.Flags) != 1) {
			err = errors.New("kproxy reads only the type of saddr or daddr")
		}
		e = &nft.Fib{Addr: strings.Join(f.Flags, ",")}
	case "numgen":
		var n struct {
			Mode        string `json:"mode"`
			Mod, Offset u32
		}
		err = strictUnmarshal(v, &n)
		e = &nft.Numgen{Mode: n.Mode, Mod: uint64(n.Mod), Offset: uint64(n.Offset)}
	case "jhash":
		var j struct {
			Mod, Seed, Offset u32
			Expr              json.RawMessage `json:"expr"`
		}
		if err = strictUnmarshal(v, &j); err == nil {
			jh := &nft.Jhash{Mod: uint64(j.Mod), Seed: uint32(j.Seed), Offset: uint64(j.Offset)}
			if jh.Of, err = c.expr(j.Expr); err != nil {
				return nil, err
			}
			e = jh
		}
	default:
		return nil, fmt.Errorf("expression %q is not one kproxy reads", k)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", k, compact(v), err)
	}
	if err := checkExpr(c.ip, e); err != nil {
		if p, ok := e.(*nft.Payload); ok && (p.Field != "saddr" && p.Field != "daddr" || p.Base != "ip" && p.Base != "ip6") {
			return nil, fmt.Errorf("%s: not a header field kproxy reads", p)
		}
		return nil, err
	}
	return e, nil
}

// value converts one constant compared with an expression yielding typ.
func (c *conv) value(typ nft.Type, raw json.RawMessage) (nft.Value, error) {
	if n, ok := number(raw); ok {
		switch {
		case typ == nft.TypeMark && n != 0:
			// Masks and marks are written in hex, comparisons with 0 as 0.
			return nft.Hex32(uint32(n)), nil
		case typ == nft.TypeAddr || typ == nft.TypeIface || typ == nft.TypeFibType || typ == nft.TypeCTState:
			return nft.Value{}, fmt.Errorf("number %d: want a name or an address", n)
		}
		return nft.Num(n), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nft.Value{}, fmt.Errorf("value %s is not one kproxy writes", compact(raw))
	}
	switch typ {
	case nft.TypeIface:
		return nft.Quoted(s), nil
	case nft.TypeAddr:
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nft.Value{}, fmt.Errorf("address %q: %w", s, err)
		}
		return nft.Addr(a), nil
	case nft.TypeProto:
		if v, ok := nft.Proto(s); ok {
			return v, nil
		}
	case nft.TypeCTStatus:
		if v, ok := nft.CTStatus(s); ok {
			return v, nil
		}
	case nft.TypeFibType:
		if slices.Contains(nft.FibTypes, s) {
			return nft.Name(s), nil
		}
	case nft.TypeCTState:
		if slices.Contains(nft.CTStates, s) {
			return nft.Name(s), nil
		}
	}
	return nft.Value{}, fmt.Errorf("value %q is not one kproxy writes", s)
}

// prefixes reads {"prefix": {"addr", "len"}} or {"range": [a, b]} as
// prefixes (a range as the fewest prefixes covering exactly it, a one
// address prefix of a range as the address: nft merges the elements of
// interval sets into ranges).
func prefixes(kind string, raw json.RawMessage) ([]nft.Value, error) {
	if kind == "prefix" {
		var p struct {
			Addr string `json:"addr"`
			Len  int    `json:"len"`
		}
		if err := strictUnmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("prefix %s: %w", compact(raw), err)
		}
		a, err := netip.ParseAddr(p.Addr)
		if err != nil {
			return nil, err
		}
		pfx, err := a.Prefix(p.Len)
		if err != nil {
			return nil, err
		}
		return []nft.Value{nft.Prefix(pfx)}, nil
	}
	var r []string
	if err := json.Unmarshal(raw, &r); err != nil || len(r) != 2 {
		return nil, fmt.Errorf("range %s: want two addresses", compact(raw))
	}
	lo, err1 := netip.ParseAddr(r[0])
	hi, err2 := netip.ParseAddr(r[1])
	if err1 != nil || err2 != nil || lo.Is4() != hi.Is4() || hi.Less(lo) {
		return nil, fmt.Errorf("range %s", compact(raw))
	}
	var out []nft.Value
	for _, p := range RangePrefixes(lo, hi) {
		out = append(out, prefixValue(p))
	}
	return out, nil
}

// prefixValue is p as nft lists it: an address for a prefix of one.
func prefixValue(p netip.Prefix) nft.Value {
	if p.IsSingleIP() {
		return nft.Addr(p.Addr())
	}
	return nft.Prefix(p)
}

// set converts a set or map with its elements. A map declared with typeof
// lists its types in the kernel, so its Spec is not the renderer's.
func (c *conv) set(isMap bool, s jsonObject) (*Set, error) {
	if s.Comment != nil {
		return nil, errors.New("a set with a comment (kproxy writes none)")
	}
	var spec SetSpec
	var err error
	if spec.Key, err = names(s.Type); err != nil || spec.Key == nil {
		return nil, fmt.Errorf("type %v: want a name or a list of names", s.Type)
	}
	if isMap {
		if spec.Data, err = names(s.Map); err != nil || spec.Data == nil {
			return nil, fmt.Errorf("map type %v: want a name or a list of names", s.Map)
		}
	}
	spec.Flags = s.Flags
	if s.Timeout != nil {
		spec.Timeout = fmt.Sprintf("%ds", *s.Timeout)
	}
	out := &Set{Name: s.Name, IsMap: isMap, Spec: spec, Elements: map[string]nft.Elem{}}
	for _, raw := range s.Elem {
		var es []nft.Elem
		keyRaw := raw
		var pair []json.RawMessage
		if isMap {
			if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
				return nil, fmt.Errorf("element %s: want [key, value]", compact(raw))
			}
			keyRaw = pair[0]
		}
		keys, err := elemKey(keyRaw)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			es = append(es, nft.Elem{Key: k})
		}
		if isMap {
			for i := range es {
				if err := elemValue(&es[i], pair[1], spec.IsVerdict()); err != nil {
					return nil, fmt.Errorf("element %s: %w", compact(raw), err)
				}
			}
		}
		for _, e := range es {
			id := ElemID(e.Key)
			if _, dup := out.Elements[id]; dup {
				return nil, fmt.Errorf("element %s listed twice", id)
			}
			out.Elements[id] = e
		}
	}
	return out, nil
}

// names reads a name or a list of names (types: "ipv4_addr . inet_service"
// is two; flags).
func names(v any) ([]string, error) {
	var out []string
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return strings.Split(x, " . "), nil
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("%v: want names", v)
			}
			out = append(out, strings.Split(s, " . ")...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%v: want a name or a list of names (typeof with expressions is not read)", v)
}

// elemKey reads an element's key: one value, a concatenation, or a timed
// element ({"elem": {"val": ...}}). A range becomes one key per prefix.
func elemKey(raw json.RawMessage) ([]nft.Key, error) {
	if k, v, err := one(raw); err == nil {
		switch k {
		case "elem":
			var el struct {
				Val     json.RawMessage `json:"val"`
				Timeout json.RawMessage `json:"timeout"`
				Expires json.RawMessage `json:"expires"`
			}
			if err := strictUnmarshal(v, &el); err != nil {
				return nil, fmt.Errorf("element %s: %w", compact(raw), err)
			}
			return elemKey(el.Val)
		case "concat":
			var parts []json.RawMessage
			if err := json.Unmarshal(v, &parts); err != nil {
				return nil, err
			}
			var key nft.Key
			for _, p := range parts {
				s, err := elemPart(p)
				if err != nil {
					return nil, fmt.Errorf("element %s: %w", compact(raw), err)
				}
				key = append(key, s)
			}
			return []nft.Key{key}, nil
		case "range":
			ps, err := prefixes(k, v)
			if err != nil {
				return nil, err
			}
			var out []nft.Key
			for _, p := range ps {
				out = append(out, nft.Key{p})
			}
			return out, nil
		}
	}
	s, err := elemPart(raw)
	if err != nil {
		return nil, fmt.Errorf("element %s: %w", compact(raw), err)
	}
	return []nft.Key{{s}}, nil
}

// elemPart reads one part of a key or value: an address, a prefix, a
// protocol or a number.
func elemPart(raw json.RawMessage) (nft.Value, error) {
	if n, ok := number(raw); ok {
		return nft.Num(n), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if a, err := netip.ParseAddr(s); err == nil {
			return nft.Addr(a), nil
		}
		if v, ok := nft.Proto(s); ok {
			return v, nil
		}
	}
	if k, v, err := one(raw); err == nil && k == "prefix" {
		if ps, err := prefixes(k, v); err == nil {
			return ps[0], nil
		}
	}
	return nft.Value{}, fmt.Errorf("part %s: want an address, a prefix, a protocol or a number", compact(raw))
}

// elemValue reads a map element's value into e: a verdict, or data.
func elemValue(e *nft.Elem, raw json.RawMessage, isVerdict bool) error {
	if isVerdict {
		k, v, err := one(raw)
		if err != nil {
			return err
		}
		e.Verdict, err = verdict(k, v)
		return err
	}
	keys, err := elemKey(raw)
	if err != nil {
		return err
	}
	if len(keys) != 1 {
		return errors.New("a range as a map's value")
	}
	e.Data = keys[0]
	return nil
}

// ListedChain is a base chain of any table, as `nft -j list chains` lists
// it.
type ListedChain struct {
	Family, Table, Name string
	Type, Hook          string
	Priority            int
}

// ParseChains reads the base chains of `nft -j list chains` (every table
// of every family; regular chains are left out).
func ParseChains(data []byte) ([]ListedChain, error) {
	var doc jsonDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("reading nft's JSON: %w", err)
	}
	var out []ListedChain
	for _, obj := range doc.Nftables {
		raw, ok := obj["chain"]
		if !ok {
			continue
		}
		var ch jsonObject
		if err := json.Unmarshal(raw, &ch); err != nil {
			return nil, fmt.Errorf("chain: %w", err)
		}
		typ, _ := ch.Type.(string)
		if ch.Hook == "" || ch.Prio == nil {
			continue
		}
		out = append(out, ListedChain{Family: ch.Family, Table: ch.Table, Name: ch.Name, Type: typ, Hook: ch.Hook, Priority: *ch.Prio})
	}
	return out, nil
}
