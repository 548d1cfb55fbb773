package model

import "github.com/kproxy/kproxy/platform/linux/nftables/nft"

// SetVisit makes the tracer call f for every rule it evaluates (chain,
// rule number from 1), for the coverage test.
func (t *Tracer) SetVisit(f func(chain string, rule int)) { t.visit = f }

// Clone returns a deep copy of the model, for tests that break one.
func (m *Model) Clone() *Model { return m.clone() }

// ParseRule reads one rule of a table whose family is ip ("ip" or "ip6")
// as the Fake does.
func ParseRule(ip, rule string) (nft.Rule, error) { return parseRule(ip, rule) }

// ParseElem reads one element of s as the Fake does.
func ParseElem(s *Set, text string) (nft.Elem, error) {
	e, _, err := parseElem(s, text)
	return e, err
}

// ParseBase reads a base chain's spec as the Fake does.
func ParseBase(base string) (nft.BaseChain, error) { return parseBase(base) }

// ParseSpec reads a set's definition as the Fake does.
func ParseSpec(text string) (SetSpec, error) { return parseSpec(text) }
