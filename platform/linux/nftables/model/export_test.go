package model

import "github.com/kproxy/kproxy/platform/linux/nftables/nft"

// SetVisit makes the tracer call f for every rule it evaluates (chain,
// rule number from 1), for the coverage test.
func (t *Tracer) SetVisit(f func(chain string, rule int)) { t.visit = f }

// Clone returns a deep copy of the model, for tests that break one.
func (m *Model) Clone() *Model { return m.clone() }

// ParseRule reads one rule of a table whose family is ip ("ip" or "ip6")
// as the tracer does.
func ParseRule(ip, rule string) (nft.Rule, error) { return (&Tracer{ip: ip}).parseRule(rule) }

// ParseElem reads one element of s as the tracer does.
func ParseElem(s *Set, e Element) (nft.Elem, error) {
	te, err := (&Tracer{}).parseElem(s, e)
	return te.Elem, err
}

// ParseBase reads a base chain's spec as the tracer does.
func ParseBase(base string) (nft.BaseChain, error) { return parseBase(base) }
