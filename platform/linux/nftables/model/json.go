package model

// Reading a table back from the kernel: `nft -j list table ip kproxy`
// prints the table as JSON (libnftables' schema), and ParseJSON turns it
// into the Model the tracer reads, with every rule written back in the text
// form the renderer emits. The converter knows exactly the expression
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

	"github.com/kproxy/kproxy/platform/linux/nftables"
	"sigs.k8s.io/knftables"
)

// OpaquePrefix starts the text of a rule the converter could not read (nft
// would take the rest of the line as a comment; kproxy never writes one).
const OpaquePrefix = "# "

// Opaque returns the text standing for a rule that cannot be read.
func Opaque(reason string) string { return OpaquePrefix + reason }

// IsOpaque reports whether a rule's text stands for a rule that could not
// be read.
func IsOpaque(rule string) bool { return strings.HasPrefix(rule, OpaquePrefix) }

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

type jsonTable struct {
	Family  string `json:"family"`
	Name    string `json:"name"`
	Comment string `json:"comment"`
}

type jsonChain struct {
	Family  string  `json:"family"`
	Table   string  `json:"table"`
	Name    string  `json:"name"`
	Type    string  `json:"type"`
	Hook    string  `json:"hook"`
	Prio    *int    `json:"prio"`
	Policy  string  `json:"policy"`
	Dev     any     `json:"dev"`
	Comment *string `json:"comment"`
}

type jsonRule struct {
	Family  string            `json:"family"`
	Table   string            `json:"table"`
	Chain   string            `json:"chain"`
	Expr    []json.RawMessage `json:"expr"`
	Comment *string           `json:"comment"`
}

type jsonSet struct {
	Family  string            `json:"family"`
	Table   string            `json:"table"`
	Name    string            `json:"name"`
	Type    any               `json:"type"`
	Map     any               `json:"map"`
	Flags   []string          `json:"flags"`
	Timeout *int              `json:"timeout"`
	Elem    []json.RawMessage `json:"elem"`
	Comment *string           `json:"comment"`
}

// ParseJSON reads the output of `nft -j list table FAMILY NAME` (or of
// `nft -j list ruleset`: only that table is read) into a Model. Rules are
// written back as the renderer writes them (Dump and the tracer read the
// same text for a table the Fake holds and the same table read back), with
// one exception: nft lists the elements of an anonymous set of addresses
// sorted and merged, so such a set's text may differ from the renderer's
// while matching the same addresses (SameRule compares them so). An
// element or set the converter cannot read is an error: they hold data the
// tracer needs.
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
	mine := func(f, t string) bool { return f == string(fam) && t == table }
	var m *Model
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			switch kind {
			case "metainfo":
			case "table":
				var t jsonTable
				if err := json.Unmarshal(raw, &t); err != nil {
					return nil, fmt.Errorf("table: %w", err)
				}
				if mine(t.Family, t.Name) {
					m = &Model{Comment: t.Comment, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
				}
			case "chain":
				var ch jsonChain
				if err := json.Unmarshal(raw, &ch); err != nil {
					return nil, fmt.Errorf("chain: %w", err)
				}
				if !mine(ch.Family, ch.Table) {
					continue
				}
				if m == nil {
					return nil, fmt.Errorf("chain %s listed before its table", ch.Name)
				}
				base, err := ch.base()
				if err != nil {
					return nil, fmt.Errorf("chain %s: %w", ch.Name, err)
				}
				m.Chains[ch.Name] = &Chain{Name: ch.Name, Base: base}
			case "rule":
				var r jsonRule
				if err := json.Unmarshal(raw, &r); err != nil {
					return nil, fmt.Errorf("rule: %w", err)
				}
				if !mine(r.Family, r.Table) {
					continue
				}
				ch := m.chain(r.Chain)
				if ch == nil {
					return nil, fmt.Errorf("rule of chain %s listed before its chain", r.Chain)
				}
				text, err := c.rule(r)
				if err != nil {
					out.Unreadable = append(out.Unreadable, Unreadable{Chain: r.Chain, Rule: len(ch.Rules) + 1,
						Reason: err.Error(), JSON: compact(raw)})
					text = Opaque("not read: " + err.Error())
				}
				ch.Rules = append(ch.Rules, text)
			case "set", "map":
				var s jsonSet
				if err := json.Unmarshal(raw, &s); err != nil {
					return nil, fmt.Errorf("%s: %w", kind, err)
				}
				if !mine(s.Family, s.Table) {
					continue
				}
				if m == nil {
					return nil, fmt.Errorf("%s %s listed before its table", kind, s.Name)
				}
				set, err := c.set(kind == "map", s)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", kind, s.Name, err)
				}
				m.Sets[s.Name] = set
			default:
				// Objects kproxy never creates (counters, quotas,
				// flowtables, ct helpers...): reported, not read.
				var hdr struct{ Family, Table, Name string }
				_ = json.Unmarshal(raw, &hdr)
				if mine(hdr.Family, hdr.Table) {
					out.Unreadable = append(out.Unreadable, Unreadable{What: kind + " " + hdr.Name,
						Reason: "an object kproxy does not create", JSON: compact(raw)})
				}
			}
		}
	}
	out.Model = m
	return out, nil
}

func (m *Model) chain(name string) *Chain {
	if m == nil {
		return nil
	}
	return m.Chains[name]
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// base renders a base chain's spec as the Fake records it ("type nat hook
// prerouting priority -100"; "; policy drop" when not accept).
func (ch jsonChain) base() (string, error) {
	if ch.Hook == "" && ch.Type == "" {
		return "", nil
	}
	if ch.Dev != nil {
		return "", errors.New("a chain bound to a device is not read")
	}
	if ch.Type == "" || ch.Hook == "" || ch.Prio == nil {
		return "", fmt.Errorf("base chain with type %q hook %q: want a type, a hook and a priority", ch.Type, ch.Hook)
	}
	s := fmt.Sprintf("type %s hook %s priority %d", ch.Type, ch.Hook, *ch.Prio)
	switch ch.Policy {
	case "", "accept":
	default:
		s += " ; policy " + ch.Policy
	}
	return s, nil
}

// conv converts expressions of one family's table.
type conv struct {
	ip string // "ip" or "ip6"
}

// rule converts one rule's expression list, then checks that the tracer
// reads the text back (a shape converted but not modelled is unreadable
// too).
func (c *conv) rule(r jsonRule) (string, error) {
	if r.Comment != nil {
		return "", errors.New("a rule with a comment (kproxy writes none)")
	}
	var parts []string
	for _, raw := range r.Expr {
		s, err := c.stmt(raw)
		if err != nil {
			return "", err
		}
		if s != "" {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "", errors.New("an empty rule")
	}
	text := strings.Join(parts, " ")
	if _, err := (&Tracer{ip: c.ip}).parseRule(text); err != nil {
		return "", fmt.Errorf("read as %q, which the tracer does not model: %w", text, err)
	}
	return text, nil
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

// stmt converts one statement of a rule.
func (c *conv) stmt(raw json.RawMessage) (string, error) {
	k, v, err := one(raw)
	if err != nil {
		return "", err
	}
	switch k {
	case "match":
		return c.match(v)
	case "accept", "drop", "return", "continue":
		if !isNull(v) {
			return "", fmt.Errorf("verdict %s with arguments", k)
		}
		if k == "continue" {
			return "", errors.New("verdict continue is not one kproxy writes")
		}
		return k, nil
	case "jump", "goto":
		var t struct {
			Target string `json:"target"`
		}
		if err := json.Unmarshal(v, &t); err != nil || t.Target == "" {
			return "", fmt.Errorf("%s %s: want a target", k, compact(v))
		}
		return k + " " + t.Target, nil
	case "vmap":
		var vm struct {
			Key  json.RawMessage `json:"key"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(v, &vm); err != nil {
			return "", err
		}
		key, err := c.expr(vm.Key)
		if err != nil {
			return "", err
		}
		data, err := namedSet(vm.Data)
		if err != nil {
			return "", fmt.Errorf("vmap: %w (only named maps are read)", err)
		}
		return key + " vmap " + data, nil
	case "mangle":
		var mg struct {
			Key   json.RawMessage `json:"key"`
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(v, &mg); err != nil {
			return "", err
		}
		key, err := c.expr(mg.Key)
		if err != nil {
			return "", err
		}
		if key != "meta mark" {
			return "", fmt.Errorf("setting %s (kproxy sets only the mark)", key)
		}
		val, err := c.markValue(mg.Value)
		if err != nil {
			return "", err
		}
		return "meta mark set " + val, nil
	case "set":
		var su struct {
			Op   string          `json:"op"`
			Elem json.RawMessage `json:"elem"`
			Set  json.RawMessage `json:"set"`
		}
		if err := json.Unmarshal(v, &su); err != nil {
			return "", err
		}
		if su.Op != "update" {
			return "", fmt.Errorf("set %s (kproxy only updates)", su.Op)
		}
		el, err := c.expr(su.Elem)
		if err != nil {
			return "", err
		}
		s, err := namedSet(su.Set)
		if err != nil {
			return "", err
		}
		return "update " + s + " { " + el + " }", nil
	case "masquerade":
		if isNull(v) {
			return "masquerade", nil
		}
		var mq struct {
			Flags any `json:"flags"`
		}
		if err := strictUnmarshal(v, &mq); err != nil {
			return "", fmt.Errorf("masquerade %s: %w", compact(v), err)
		}
		flags, err := stringList(mq.Flags)
		if err != nil {
			return "", err
		}
		if !slices.Equal(flags, []string{"fully-random"}) && len(flags) > 0 {
			return "", fmt.Errorf("masquerade flags %v (kproxy writes fully-random only)", flags)
		}
		return strings.Join(append([]string{"masquerade"}, flags...), " "), nil
	case "reject":
		if isNull(v) {
			return "reject", nil
		}
		var rj struct {
			Type string `json:"type"`
			Expr string `json:"expr"`
		}
		if err := strictUnmarshal(v, &rj); err != nil {
			return "", fmt.Errorf("reject %s: %w", compact(v), err)
		}
		switch {
		case rj.Type == "tcp reset" && rj.Expr == "":
			// nft leaves out the "meta l4proto tcp" match the reset
			// needs (and the renderer writes).
			return "meta l4proto tcp reject with tcp reset", nil
		case rj.Expr == "port-unreachable" && (rj.Type == "icmp" && c.ip == "ip" || rj.Type == "icmpv6" && c.ip == "ip6" || rj.Type == "icmpx"):
			// The default of a plain "reject" in this family.
			return "reject", nil
		}
		return "", fmt.Errorf("reject %s (kproxy rejects with tcp reset or the default)", compact(v))
	case "dnat":
		return c.dnat(v)
	}
	return "", fmt.Errorf("statement %q is not one kproxy writes", k)
}

// strictUnmarshal decodes, refusing unknown fields.
func strictUnmarshal(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	return dec.Decode(v)
}

func stringList(v any) ([]string, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{x}, nil
	case []any:
		var out []string
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("flag %v: want a string", e)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("flags %v: want strings", v)
}

func namedSet(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || !strings.HasPrefix(s, "@") {
		return "", fmt.Errorf("%s: want a named set (@name)", compact(raw))
	}
	return s, nil
}

// markValue reads "meta mark | 0x4000" (or ^, &) or a constant.
func (c *conv) markValue(raw json.RawMessage) (string, error) {
	if n, ok := number(raw); ok {
		return hex32(n), nil
	}
	k, v, err := one(raw)
	if err != nil {
		return "", err
	}
	switch k {
	case "|", "^", "&":
		var args []json.RawMessage
		if err := json.Unmarshal(v, &args); err != nil || len(args) != 2 {
			return "", fmt.Errorf("%s %s: want two operands", k, compact(v))
		}
		left, err := c.expr(args[0])
		if err != nil {
			return "", err
		}
		n, ok := number(args[1])
		if left != "meta mark" || !ok {
			return "", fmt.Errorf("meta mark set %s %s %s: kproxy combines the mark with a constant", left, k, compact(args[1]))
		}
		return "meta mark " + k + " " + hex32(n), nil
	}
	return "", fmt.Errorf("meta mark set %s: not a form kproxy writes", compact(raw))
}

func hex32(n uint64) string { return fmt.Sprintf("0x%08x", n) }

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
func (c *conv) dnat(raw json.RawMessage) (string, error) {
	var d struct {
		Family string          `json:"family"`
		Addr   json.RawMessage `json:"addr"`
		Port   json.RawMessage `json:"port"`
	}
	if err := strictUnmarshal(raw, &d); err != nil {
		return "", fmt.Errorf("dnat %s: %w", compact(raw), err)
	}
	if d.Family != "" && d.Family != c.ip {
		return "", fmt.Errorf("dnat %s in an %s table", d.Family, c.ip)
	}
	var a string
	if err := json.Unmarshal(d.Addr, &a); err == nil {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			return "", fmt.Errorf("dnat to %q: %w", a, err)
		}
		if isNull(d.Port) {
			return "dnat " + c.ip + " to " + addr.String(), nil
		}
		port, ok := number(d.Port)
		if !ok || port > 65535 {
			return "", fmt.Errorf("dnat port %s: want a number", compact(d.Port))
		}
		return "dnat " + c.ip + " to " + netip.AddrPortFrom(addr, uint16(port)).String(), nil
	}
	if !isNull(d.Port) {
		return "", errors.New("dnat through a map with a port: not a form kproxy writes")
	}
	k, v, err := one(d.Addr)
	if err != nil || k != "map" {
		return "", fmt.Errorf("dnat to %s: want an address or a map lookup", compact(d.Addr))
	}
	var mp struct {
		Key  json.RawMessage `json:"key"`
		Data json.RawMessage `json:"data"`
	}
	if err := strictUnmarshal(v, &mp); err != nil {
		return "", err
	}
	key, err := c.expr(mp.Key)
	if err != nil {
		return "", err
	}
	m, err := namedSet(mp.Data)
	if err != nil {
		return "", fmt.Errorf("dnat map: %w", err)
	}
	return "dnat " + c.ip + " to " + key + " map " + m, nil
}

// match reads one comparison.
func (c *conv) match(raw json.RawMessage) (string, error) {
	var m struct {
		Op    string          `json:"op"`
		Left  json.RawMessage `json:"left"`
		Right json.RawMessage `json:"right"`
	}
	if err := strictUnmarshal(raw, &m); err != nil {
		return "", fmt.Errorf("match %s: %w", compact(raw), err)
	}
	kind, left, masked, err := c.left(m.Left)
	if err != nil {
		return "", err
	}
	right, err := c.value(kind, m.Right)
	if err != nil {
		return "", fmt.Errorf("%s: %w", left, err)
	}
	switch m.Op {
	case "==":
		if masked {
			return left + " == " + right, nil
		}
		return left + " " + right, nil
	case "in":
		// A flag of a bitmask (ct state, ct status), as nft prints it.
		if kind != "ctstate" && kind != "ctstatus" {
			return "", fmt.Errorf("%s in %s: not a form kproxy writes", left, right)
		}
		return left + " " + right, nil
	case "!":
		// "ct status & dnat == 0", which nft prints as "ct status ! dnat".
		if kind != "ctstatus" {
			return "", fmt.Errorf("%s ! %s: not a form kproxy writes", left, right)
		}
		return left + " & " + right + " == 0", nil
	case "!=", "<", "<=", ">", ">=":
		return left + " " + m.Op + " " + right, nil
	}
	return "", fmt.Errorf("operator %q is not one kproxy writes", m.Op)
}

// left reads the left side of a match: an expression, or one masked with
// & ("meta mark & 0x4000"). kind says how its constants are written.
func (c *conv) left(raw json.RawMessage) (kind, text string, masked bool, err error) {
	k, v, err := one(raw)
	if err != nil {
		return "", "", false, err
	}
	if k == "&" {
		var args []json.RawMessage
		if err := json.Unmarshal(v, &args); err != nil || len(args) != 2 {
			return "", "", false, fmt.Errorf("& %s: want two operands", compact(v))
		}
		kind, text, _, err := c.left(args[0])
		if err != nil {
			return "", "", false, err
		}
		if kind != "mark" && kind != "ctstatus" {
			return "", "", false, fmt.Errorf("%s & ...: kproxy masks only the mark", text)
		}
		mask, err := c.value(kind, args[1])
		if err != nil {
			return "", "", false, err
		}
		return kind, text + " & " + mask, true, nil
	}
	text, err = c.expr(raw)
	if err != nil {
		return "", "", false, err
	}
	return c.kindOf(raw), text, false, nil
}

// kindOf names the kind of values an expression yields, for writing the
// constants it is compared with.
func (c *conv) kindOf(raw json.RawMessage) string {
	k, v, err := one(raw)
	if err != nil {
		return ""
	}
	switch k {
	case "meta":
		var mt struct{ Key string }
		_ = json.Unmarshal(v, &mt)
		return mt.Key // l4proto, mark, iifname
	case "ct":
		var ct struct{ Key string }
		_ = json.Unmarshal(v, &ct)
		return "ct" + ct.Key
	case "fib":
		return "fib"
	case "payload":
		var p struct{ Protocol, Field string }
		_ = json.Unmarshal(v, &p)
		if p.Field == "saddr" || p.Field == "daddr" {
			return "addr"
		}
		return "num"
	case "concat":
		return "concat"
	}
	return "num"
}

// expr converts one expression that yields a value.
func (c *conv) expr(raw json.RawMessage) (string, error) {
	k, v, err := one(raw)
	if err != nil {
		return "", err
	}
	switch k {
	case "payload":
		var p struct {
			Protocol string `json:"protocol"`
			Field    string `json:"field"`
		}
		if err := strictUnmarshal(v, &p); err != nil {
			return "", fmt.Errorf("payload %s: %w", compact(v), err)
		}
		switch {
		case (p.Protocol == "ip" || p.Protocol == "ip6") && (p.Field == "saddr" || p.Field == "daddr"):
			if p.Protocol != c.ip {
				return "", fmt.Errorf("%s %s in an %s table", p.Protocol, p.Field, c.ip)
			}
		case slices.Contains([]string{"th", "tcp", "udp", "sctp"}, p.Protocol) && (p.Field == "dport" || p.Field == "sport"):
		default:
			return "", fmt.Errorf("%s %s: not a header field kproxy reads", p.Protocol, p.Field)
		}
		return p.Protocol + " " + p.Field, nil
	case "meta":
		var mt struct {
			Key string `json:"key"`
		}
		if err := strictUnmarshal(v, &mt); err != nil {
			return "", fmt.Errorf("meta %s: %w", compact(v), err)
		}
		switch mt.Key {
		case "l4proto", "mark":
			return "meta " + mt.Key, nil
		case "iifname":
			return "iifname", nil
		}
		return "", fmt.Errorf("meta %s: not one kproxy reads", mt.Key)
	case "ct":
		var ct struct {
			Key string `json:"key"`
		}
		if err := strictUnmarshal(v, &ct); err != nil {
			return "", fmt.Errorf("ct %s: %w", compact(v), err)
		}
		if ct.Key != "state" && ct.Key != "status" {
			return "", fmt.Errorf("ct %s: not one kproxy reads", ct.Key)
		}
		return "ct " + ct.Key, nil
	case "fib":
		var f struct {
			Result string   `json:"result"`
			Flags  []string `json:"flags"`
		}
		if err := strictUnmarshal(v, &f); err != nil {
			return "", fmt.Errorf("fib %s: %w", compact(v), err)
		}
		if f.Result != "type" || len(f.Flags) != 1 || (f.Flags[0] != "saddr" && f.Flags[0] != "daddr") {
			return "", fmt.Errorf("fib %s: kproxy reads only the type of saddr or daddr", compact(v))
		}
		return "fib " + f.Flags[0] + " type", nil
	case "numgen":
		var n struct {
			Mode   string `json:"mode"`
			Mod    u32    `json:"mod"`
			Offset u32    `json:"offset"`
		}
		if err := strictUnmarshal(v, &n); err != nil {
			return "", fmt.Errorf("numgen %s: %w", compact(v), err)
		}
		if n.Mode != "random" && n.Mode != "inc" {
			return "", fmt.Errorf("numgen %s", n.Mode)
		}
		s := fmt.Sprintf("numgen %s mod %d", n.Mode, n.Mod)
		if n.Offset != 0 {
			s += fmt.Sprintf(" offset %d", n.Offset)
		}
		return s, nil
	case "jhash":
		var j struct {
			Mod    u32             `json:"mod"`
			Seed   u32             `json:"seed"`
			Offset u32             `json:"offset"`
			Expr   json.RawMessage `json:"expr"`
		}
		if err := strictUnmarshal(v, &j); err != nil {
			return "", fmt.Errorf("jhash %s: %w", compact(v), err)
		}
		of, err := c.expr(j.Expr)
		if err != nil {
			return "", err
		}
		s := fmt.Sprintf("jhash %s mod %d seed %s", of, j.Mod, hex32(uint64(j.Seed)))
		if j.Offset != 0 {
			s += fmt.Sprintf(" offset %d", j.Offset)
		}
		return s, nil
	case "concat":
		var parts []json.RawMessage
		if err := json.Unmarshal(v, &parts); err != nil || len(parts) < 2 {
			return "", fmt.Errorf("concat %s: want two parts or more", compact(v))
		}
		var out []string
		for _, p := range parts {
			s, err := c.expr(p)
			if err != nil {
				return "", err
			}
			out = append(out, s)
		}
		return strings.Join(out, " . "), nil
	}
	return "", fmt.Errorf("expression %q is not one kproxy reads", k)
}

// value converts the right side of a match of a left side of kind.
func (c *conv) value(kind string, raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch {
		case strings.HasPrefix(s, "@"):
			return s, nil
		case kind == "iifname":
			return strconv.Quote(s), nil
		case kind == "addr":
			a, err := netip.ParseAddr(s)
			if err != nil {
				return "", fmt.Errorf("address %q: %w", s, err)
			}
			return a.String(), nil
		case kind == "mark":
			return "", fmt.Errorf("mark %q: want a number", s)
		}
		// Protocols, fib types, ct states and status flags: names.
		if s == "" || strings.ContainsAny(s, " \t\"{}") {
			return "", fmt.Errorf("value %q", s)
		}
		return s, nil
	}
	if n, ok := number(raw); ok {
		if kind == "mark" {
			// Masks are written in hex, comparisons with 0 as 0.
			if n == 0 {
				return "0", nil
			}
			return hex32(n), nil
		}
		return strconv.FormatUint(n, 10), nil
	}
	k, v, err := one(raw)
	if err != nil {
		return "", err
	}
	switch k {
	case "prefix", "range":
		if kind != "addr" {
			return "", fmt.Errorf("%s of %s: only addresses", k, kind)
		}
		ps, err := prefixes(k, v)
		if err != nil {
			return "", err
		}
		if len(ps) == 1 {
			return ps[0], nil
		}
		return "{ " + strings.Join(ps, ", ") + " }", nil
	case "set":
		var elems []json.RawMessage
		if err := json.Unmarshal(v, &elems); err != nil || len(elems) == 0 {
			return "", fmt.Errorf("set %s: want elements", compact(v))
		}
		var out []string
		for _, e := range elems {
			if kk, vv, err := one(e); err == nil && (kk == "prefix" || kk == "range") && kind == "addr" {
				ps, err := prefixes(kk, vv)
				if err != nil {
					return "", err
				}
				out = append(out, ps...)
				continue
			}
			s, err := c.value(kind, e)
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(s, "@") || strings.HasPrefix(s, "{") {
				return "", fmt.Errorf("set element %s", s)
			}
			out = append(out, s)
		}
		return "{ " + strings.Join(out, ", ") + " }", nil
	}
	return "", fmt.Errorf("value %s is not one kproxy writes", compact(raw))
}

// prefixes reads {"prefix": {"addr", "len"}} or {"range": [a, b]} as
// prefixes (a range as the fewest prefixes covering exactly it: nft merges
// the elements of interval sets into ranges).
func prefixes(kind string, raw json.RawMessage) ([]string, error) {
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
		return []string{pfx.String()}, nil
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
	var out []string
	for _, p := range nftables.RangePrefixes(lo, hi) {
		if p.IsSingleIP() {
			out = append(out, p.Addr().String()) // as nft lists one address
		} else {
			out = append(out, p.String())
		}
	}
	return out, nil
}

// set converts a set or map with its elements. The Spec records the
// types and flags ("{ type ipv4_addr . inet_service : verdict ; }"); a
// map declared with typeof lists its types in the kernel, so its Spec is
// not the renderer's (SameSet compares what matters).
func (c *conv) set(isMap bool, s jsonSet) (*Set, error) {
	if s.Comment != nil {
		return nil, errors.New("a set with a comment (kproxy writes none)")
	}
	keyTypes, err := typeList(s.Type)
	if err != nil {
		return nil, err
	}
	spec := "{ type " + strings.Join(keyTypes, " . ")
	verdictMap := false
	if isMap {
		vt, err := typeList(s.Map)
		if err != nil {
			return nil, err
		}
		spec += " : " + strings.Join(vt, " . ")
		verdictMap = slices.Equal(vt, []string{"verdict"})
	}
	spec += " ;"
	if len(s.Flags) > 0 {
		spec += " flags " + strings.Join(s.Flags, ",") + " ;"
	}
	if s.Timeout != nil {
		spec += fmt.Sprintf(" timeout %ds ;", *s.Timeout)
	}
	spec += " }"
	out := &Set{Name: s.Name, IsMap: isMap, Spec: spec, Elements: map[string]Element{}}
	for _, raw := range s.Elem {
		var es []Element
		if isMap {
			var pair []json.RawMessage
			if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
				return nil, fmt.Errorf("element %s: want [key, value]", compact(raw))
			}
			keys, err := c.elemKey(pair[0])
			if err != nil {
				return nil, err
			}
			val, err := c.elemValue(pair[1], verdictMap)
			if err != nil {
				return nil, fmt.Errorf("element %s: %w", compact(raw), err)
			}
			for _, k := range keys {
				es = append(es, Element{Key: k, Value: val})
			}
		} else {
			keys, err := c.elemKey(raw)
			if err != nil {
				return nil, err
			}
			for _, k := range keys {
				es = append(es, Element{Key: k})
			}
		}
		for _, e := range es {
			id := strings.Join(e.Key, " . ")
			if _, dup := out.Elements[id]; dup {
				return nil, fmt.Errorf("element %s listed twice", id)
			}
			out.Elements[id] = e
		}
	}
	return out, nil
}

func typeList(v any) ([]string, error) {
	switch x := v.(type) {
	case string:
		return []string{x}, nil
	case []any:
		var out []string
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("type %v: want names", v)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("type %v: want a name or a list of names (typeof with expressions is not read)", v)
}

// elemKey reads an element's key: one value, a concatenation, or a timed
// element ({"elem": {"val": ...}}). A range becomes one key per prefix.
func (c *conv) elemKey(raw json.RawMessage) ([][]string, error) {
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
			return c.elemKey(el.Val)
		case "concat":
			var parts []json.RawMessage
			if err := json.Unmarshal(v, &parts); err != nil {
				return nil, err
			}
			var key []string
			for _, p := range parts {
				s, err := elemPart(p)
				if err != nil {
					return nil, fmt.Errorf("element %s: %w", compact(raw), err)
				}
				key = append(key, s)
			}
			return [][]string{key}, nil
		case "prefix", "range":
			ps, err := prefixes(k, v)
			if err != nil {
				return nil, err
			}
			var out [][]string
			for _, p := range ps {
				out = append(out, []string{p})
			}
			return out, nil
		}
	}
	s, err := elemPart(raw)
	if err != nil {
		return nil, fmt.Errorf("element %s: %w", compact(raw), err)
	}
	return [][]string{{s}}, nil
}

// elemPart reads one part of a key or value: an address, a name or a
// number.
func elemPart(raw json.RawMessage) (string, error) {
	if n, ok := number(raw); ok {
		return strconv.FormatUint(n, 10), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && s != "" && !strings.ContainsAny(s, " \t\"{}") {
		if a, err := netip.ParseAddr(s); err == nil {
			return a.String(), nil
		}
		return s, nil
	}
	if k, v, err := one(raw); err == nil && k == "prefix" {
		ps, err := prefixes(k, v)
		if err == nil && len(ps) == 1 {
			return ps[0], nil
		}
	}
	return "", fmt.Errorf("part %s: want an address, a name or a number", compact(raw))
}

// elemValue reads a map element's value: a verdict, or data.
func (c *conv) elemValue(raw json.RawMessage, verdict bool) ([]string, error) {
	if verdict {
		k, v, err := one(raw)
		if err != nil {
			return nil, err
		}
		switch k {
		case "accept", "drop", "return":
			return []string{k}, nil
		case "jump", "goto":
			var t struct {
				Target string `json:"target"`
			}
			if err := json.Unmarshal(v, &t); err != nil || t.Target == "" {
				return nil, fmt.Errorf("%s %s: want a target", k, compact(v))
			}
			return []string{k + " " + t.Target}, nil
		}
		return nil, fmt.Errorf("verdict %s", compact(raw))
	}
	keys, err := c.elemKey(raw)
	if err != nil {
		return nil, err
	}
	if len(keys) != 1 {
		return nil, errors.New("a range as a map's value")
	}
	return keys[0], nil
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
		var ch jsonChain
		if err := json.Unmarshal(raw, &ch); err != nil {
			return nil, fmt.Errorf("chain: %w", err)
		}
		if ch.Hook == "" || ch.Prio == nil {
			continue
		}
		out = append(out, ListedChain{Family: ch.Family, Table: ch.Table, Name: ch.Name, Type: ch.Type, Hook: ch.Hook, Priority: *ch.Prio})
	}
	return out, nil
}
