package model

import (
	"maps"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// Model is the state of one table as typed values: the Fake's table (its
// transactions' text read once, as nft reads it), or a table read back
// from the kernel (ParseJSON). Rules and elements are values: a Model is
// changed by replacing them, never by changing a statement, an element's
// verdict or a base chain in place (a clone shares them).
type Model struct {
	Comment string
	Chains  map[string]*Chain
	Sets    map[string]*Set
}

// Chain is one chain of a Model.
type Chain struct {
	Name string
	// Base is a base chain's spec (nil for a regular chain).
	Base  *nft.BaseChain
	Rules []nft.Rule
}

// Set is one set or map of a Model.
type Set struct {
	Name  string
	IsMap bool
	Spec  SetSpec
	// Elements by key, as the key's String writes it.
	Elements map[string]nft.Elem
}

// ElemID is the key a Set files an element under.
func ElemID(k nft.Key) string { return k.String() }

func (m *Model) clone() *Model {
	if m == nil {
		return nil
	}
	out := &Model{Comment: m.Comment, Chains: make(map[string]*Chain, len(m.Chains)), Sets: make(map[string]*Set, len(m.Sets))}
	for n, c := range m.Chains {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		out.Chains[n] = &cc
	}
	for n, s := range m.Sets {
		cs := *s
		cs.Elements = maps.Clone(s.Elements)
		out.Sets[n] = &cs
	}
	return out
}

// IsVerdictMap reports whether s is a map whose values are verdicts.
func (s *Set) IsVerdictMap() bool { return s.IsMap && s.Spec.IsVerdict() }

// Opaque returns the rule standing for one that could not be read, for
// reason: a branch of the tracer that reaches it ends there, its fate
// unknown. Its text starts with OpaquePrefix.
func Opaque(reason string) nft.Rule { return nft.Rule{&nft.Opaque{Text: OpaquePrefix + reason}} }

// OpaquePrefix starts the text of an opaque rule (nft would read the rest
// of the line as a comment; kproxy never writes one).
const OpaquePrefix = "# "

// IsOpaque reports whether r stands for a rule that could not be read.
func IsOpaque(r nft.Rule) bool {
	if len(r) != 1 {
		return false
	}
	_, ok := r[0].(*nft.Opaque)
	return ok
}

// RenameChains returns a copy of m with the chains rename names renamed:
// the chains themselves, and every rule's and verdict element's reference
// to them. A rename to a name already taken is the caller's to avoid.
func (m *Model) RenameChains(rename map[string]string) *Model {
	if m == nil {
		return nil
	}
	verdict := func(v *nft.Verdict) *nft.Verdict {
		if n, ok := rename[v.Chain]; ok && v.Chain != "" {
			return &nft.Verdict{Kind: v.Kind, Chain: n}
		}
		return v
	}
	out := &Model{Comment: m.Comment, Chains: make(map[string]*Chain, len(m.Chains)), Sets: make(map[string]*Set, len(m.Sets))}
	for n, s := range m.Sets {
		cs := *s
		cs.Elements = maps.Clone(s.Elements)
		out.Sets[n] = &cs
	}
	for n, c := range m.Chains {
		cc := &Chain{Name: n, Base: c.Base, Rules: make([]nft.Rule, len(c.Rules))}
		if r, ok := rename[n]; ok {
			cc.Name = r
		}
		for i, r := range c.Rules {
			cc.Rules[i] = renameRule(r, verdict)
		}
		out.Chains[cc.Name] = cc
	}
	for _, s := range out.Sets {
		for id, e := range s.Elements {
			if e.Verdict != nil {
				e.Verdict = verdict(e.Verdict)
				s.Elements[id] = e
			}
		}
	}
	return out
}

// renameRule returns r with every verdict f renames replaced (r itself
// when none is).
func renameRule(r nft.Rule, f func(*nft.Verdict) *nft.Verdict) nft.Rule {
	var out nft.Rule
	for j, st := range r {
		if v, ok := st.(*nft.Verdict); ok {
			if nv := f(v); nv != v {
				if out == nil {
					out = slices.Clone(r)
				}
				out[j] = nv
			}
		}
	}
	if out == nil {
		return r
	}
	return out
}

// refs returns the chains and the sets a rule names.
func refs(r nft.Rule) (chains, sets []string) {
	for _, st := range r {
		switch x := st.(type) {
		case *nft.Verdict:
			if x.Chain != "" {
				chains = append(chains, x.Chain)
			}
		case *nft.VMap:
			sets = append(sets, x.Map)
		case *nft.DNAT:
			if x.Map != "" {
				sets = append(sets, x.Map)
			}
		case *nft.Update:
			sets = append(sets, x.Set)
		case *nft.Match:
			if x.Set != "" {
				sets = append(sets, x.Set)
			}
		}
	}
	return chains, sets
}

// SetSpec is what a set's or map's definition says: its key's types (or,
// with Typeof, expressions), a map's value's, its flags, timeout and
// auto-merge.
type SetSpec struct {
	Typeof    bool
	Key       []string
	Data      []string
	Flags     []string
	Timeout   string
	AutoMerge bool
}

// IsVerdict reports whether the spec's values are verdicts.
func (s SetSpec) IsVerdict() bool { return len(s.Data) == 1 && s.Data[0] == "verdict" }

// IsInterval reports whether the set holds intervals (prefixes, ranges).
func (s SetSpec) IsInterval() bool { return slices.Contains(s.Flags, "interval") }

// String writes the definition as nft reads it ("{ type ipv4_addr ;
// flags interval ; }").
func (s SetSpec) String() string {
	var b strings.Builder
	b.WriteString("{ type")
	if s.Typeof {
		b.WriteString("of")
	}
	b.WriteString(" " + strings.Join(s.Key, " . "))
	if s.Data != nil {
		b.WriteString(" : " + strings.Join(s.Data, " . "))
	}
	b.WriteString(" ;")
	if len(s.Flags) > 0 {
		b.WriteString(" flags " + strings.Join(s.Flags, ",") + " ;")
	}
	if s.Timeout != "" {
		b.WriteString(" timeout " + s.Timeout + " ;")
	}
	if s.AutoMerge {
		b.WriteString(" auto-merge ;")
	}
	b.WriteString(" }")
	return b.String()
}
