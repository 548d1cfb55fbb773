package nft

import (
	"net/netip"
	"strings"
)

// Stmt is one statement of a rule: a match, or an action. Its dynamic type
// is one of the pointer types below.
type Stmt interface{ String() string }

// Op is a match's operator.
type Op string

const (
	// OpImplicit is written as nothing: equality, or for a flag type
	// (ct status) with no mask, "any of these bits is set".
	OpImplicit Op = ""
	OpEq       Op = "=="
	OpNe       Op = "!="
	OpLt       Op = "<"
	OpLe       Op = "<="
	OpGt       Op = ">"
	OpGe       Op = ">="
)

// Match compares a concatenation of expressions with a named set, an
// anonymous set or one constant.
type Match struct {
	Left []Expr
	// Mask, when set, is and-ed with the (one) expression's value first
	// ("meta mark & 0x00004000").
	Mask *Value
	Op   Op
	// Set names a set ("@name"); otherwise Right holds the constants: one
	// (Anon false), or the members of an anonymous set ("{ a, b }").
	Set   string
	Right []Key
	Anon  bool
}

func (m *Match) String() string {
	var b strings.Builder
	b.WriteString(Concat(m.Left))
	if m.Mask != nil {
		b.WriteString(" & ")
		b.WriteString(m.Mask.String())
	}
	if m.Op != OpImplicit {
		b.WriteString(" ")
		b.WriteString(string(m.Op))
	}
	b.WriteString(" ")
	switch {
	case m.Set != "":
		b.WriteString("@" + m.Set)
	case m.Anon:
		b.WriteString("{ ")
		for i, k := range m.Right {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(k.String())
		}
		b.WriteString(" }")
	case len(m.Right) > 0:
		b.WriteString(m.Right[0].String())
	}
	return b.String()
}

// Verdict ends a rule's evaluation: Kind "accept", "drop", "return", or
// "jump" and "goto" to Chain. It is also a verdict map element's value.
type Verdict struct {
	Kind  string
	Chain string
}

func (v *Verdict) String() string {
	if v.Chain != "" {
		return v.Kind + " " + v.Chain
	}
	return v.Kind
}

// Append appends the verdict's text (what String returns) to b.
func (v *Verdict) Append(b []byte) []byte {
	b = append(b, v.Kind...)
	if v.Chain != "" {
		b = append(b, ' ')
		b = append(b, v.Chain...)
	}
	return b
}

// Jump returns the verdict "jump chain".
func Jump(chain string) *Verdict { return &Verdict{Kind: "jump", Chain: chain} }

// Goto returns the verdict "goto chain".
func Goto(chain string) *Verdict { return &Verdict{Kind: "goto", Chain: chain} }

// VMap looks the concatenation Key up in the verdict map Map and applies
// the verdict found (none found: the rule does not match).
type VMap struct {
	Key []Expr
	Map string
}

func (v *VMap) String() string { return Concat(v.Key) + " vmap @" + v.Map }

// DNAT rewrites the destination: to Addr (and Port, when not 0), or to
// the value found at Key in the data map Map. Family ("ip", "ip6") is
// written when set.
type DNAT struct {
	Family string
	Addr   netip.Addr
	Port   uint16
	Key    []Expr
	Map    string
}

func (d *DNAT) String() string {
	s := "dnat"
	if d.Family != "" {
		s += " " + d.Family
	}
	s += " to "
	switch {
	case d.Map != "":
		return s + Concat(d.Key) + " map @" + d.Map
	case d.Port != 0:
		return s + netip.AddrPortFrom(d.Addr, d.Port).String()
	}
	return s + d.Addr.String()
}

// Masquerade rewrites the source to the output interface's address, with
// Flags ("fully-random", "random", "persistent").
type Masquerade struct{ Flags []string }

func (m *Masquerade) String() string {
	return strings.Join(append([]string{"masquerade"}, m.Flags...), " ")
}

// Reject refuses the packet, With "tcp reset" or "icmp type T" (and icmpv6,
// icmpx); "" is the family's ICMP port unreachable.
type Reject struct{ With string }

func (r *Reject) String() string {
	if r.With == "" {
		return "reject"
	}
	return "reject with " + r.With
}

// MarkSet sets the packet mark: to Val (Op ""), or to the mark combined
// with Val by Op ("|", "^", "&").
type MarkSet struct {
	Op  string
	Val Value
}

func (m *MarkSet) String() string {
	if m.Op == "" {
		return "meta mark set " + m.Val.String()
	}
	return "meta mark set meta mark " + m.Op + " " + m.Val.String()
}

// Update adds the value of Key to the set Set (or refreshes its timeout).
type Update struct {
	Set string
	Key Expr
}

func (u *Update) String() string { return "update @" + u.Set + " { " + u.Key.String() + " }" }

// Opaque stands for a rule that could not be read (its Text says why): a
// branch that reaches it ends there, its fate unknown.
type Opaque struct{ Text string }

func (o *Opaque) String() string { return o.Text }

// Rule is a rule's statements, in order.
type Rule []Stmt

// String writes the statements separated by spaces: the rule's text.
func (r Rule) String() string {
	parts := make([]string, len(r))
	for i, s := range r {
		parts[i] = s.String()
	}
	return strings.Join(parts, " ")
}

// Terminal reports whether s ends a rule (no statement may follow it).
func Terminal(s Stmt) bool {
	switch s.(type) {
	case *Verdict, *VMap, *DNAT, *Masquerade, *Reject, *Opaque:
		return true
	}
	return false
}
