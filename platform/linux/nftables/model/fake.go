package model

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/platform/linux/nftables"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"sigs.k8s.io/knftables"
)

// Fake is an in-memory nftables table that applies transactions the way
// the kernel does, for tests: atomically (a failing transaction changes
// nothing), with the kernel's refusals — an element whose key exists with
// another value (EEXIST), a chain or set still referenced by a rule or an
// element (EBUSY), a rule or element naming a missing chain or set, a
// missing object deleted or flushed (ENOENT), a base chain added again with
// another hook or priority. It reads the transaction as nft would, from
// its text (one command per line, elements batched as "{ a, b }"), so what
// it accepts is what the real nft receives; it reads every rule, element,
// base chain and set definition into the typed values of package nft once,
// when the transaction is applied (a form the reader does not know is
// refused, as ErrNotSupp), and holds those. Model exposes the state for the
// packet tracer; Dump a sorted, deterministic listing.
//
// It implements nftables.Interface for one family and table; ListRules returns rules
// with their text filled in (the real nft's does not).
type Fake struct {
	family knftables.Family
	table  string

	mu sync.Mutex
	m  *Model
	// Fail, when set, is called with each transaction's text before it
	// runs; an error fails the transaction (fault injection).
	Fail func(text string) error
	// Runs counts the transactions run (successful or not).
	Runs int
}

var _ nftables.Interface = (*Fake)(nil)

// NewFake returns an empty Fake (no table) for family and table.
func NewFake(family knftables.Family, table string) *Fake {
	return &Fake{family: family, table: table}
}

// Model returns a copy of the table's state (nil when there is no table).
func (f *Fake) Model() *Model {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.clone()
}

// Run applies tx atomically.
func (f *Fake) Run(_ context.Context, tx *nftables.Tx) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Runs++
	text := tx.String()
	if f.Fail != nil {
		if err := f.Fail(text); err != nil {
			return err
		}
	}
	next, err := f.apply(f.m.clone(), text)
	if err != nil {
		return err
	}
	f.m = next
	return nil
}

// Check applies tx to a copy and reports whether it would succeed.
func (f *Fake) Check(_ context.Context, tx *nftables.Tx) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := f.apply(f.m.clone(), tx.String())
	return err
}

type fakeErr struct {
	line string
	err  error
}

func (e *fakeErr) Error() string {
	return fmt.Sprintf("Error: Could not process rule: %v\n%s", e.err, e.line)
}
func (e *fakeErr) Unwrap() error { return e.err }

func (f *Fake) apply(m *Model, text string) (*Model, error) {
	prefix := func(kind string) string { return kind + " " + string(f.family) + " " + f.table }
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			continue
		}
		fail := func(err error) (*Model, error) { return nil, &fakeErr{line: line, err: err} }
		verb, rest, _ := strings.Cut(line, " ")
		kind, rest, _ := strings.Cut(rest, " ")
		head := prefix("")[1:]
		if !strings.HasPrefix(rest, head) {
			return fail(fmt.Errorf("%w: not table %s", nftables.ErrNotFound, head))
		}
		rest = strings.TrimPrefix(strings.TrimPrefix(rest, head), " ")
		if kind == "table" {
			switch verb {
			case "add", "create":
				if m == nil {
					m = &Model{Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
				} else if verb == "create" {
					return fail(nftables.ErrExists)
				}
				if c, ok := strings.CutPrefix(rest, "{ comment "); ok {
					m.Comment = strings.Trim(strings.TrimSuffix(c, " ; }"), `"`)
				}
			case "delete", "destroy":
				if m == nil && verb == "delete" {
					return fail(nftables.ErrNotFound)
				}
				m = nil
			case "flush":
				if m == nil {
					return fail(nftables.ErrNotFound)
				}
				for _, c := range m.Chains {
					c.Rules = nil
				}
				for _, s := range m.Sets {
					clear(s.Elements)
				}
			default:
				return fail(fmt.Errorf("%w: %s table", nftables.ErrNotSupp, verb))
			}
			continue
		}
		if m == nil {
			return fail(fmt.Errorf("%w: no table", nftables.ErrNotFound))
		}
		name, spec, _ := strings.Cut(rest, " ")
		var err error
		switch kind {
		case "chain":
			err = m.chainOp(verb, name, spec)
		case "rule":
			err = m.ruleOp(f.ip(), verb, name, spec)
		case "set", "map":
			err = m.setOp(verb, kind == "map", name, spec)
		case "element":
			err = m.elementOp(verb, name, spec)
		default:
			err = fmt.Errorf("%w: %s %s", nftables.ErrNotSupp, verb, kind)
		}
		if err != nil {
			return fail(err)
		}
	}
	return m, nil
}

func (f *Fake) ip() string {
	if f.family == knftables.IPv6Family {
		return "ip6"
	}
	return "ip"
}

func (m *Model) chainOp(verb, name, spec string) error {
	c := m.Chains[name]
	var base *nft.BaseChain
	if spec != "" {
		text, ok := strings.CutPrefix(spec, "{ ")
		if ok {
			text, ok = strings.CutSuffix(text, " }")
		}
		if !ok {
			return fmt.Errorf("%w: chain %s %s", nftables.ErrNotSupp, name, spec)
		}
		b, err := parseBase(strings.TrimSuffix(text, " ;"))
		if err != nil {
			return fmt.Errorf("%w: chain %s: %w", nftables.ErrNotSupp, name, err)
		}
		base = &b
	}
	switch verb {
	case "add", "create":
		if c != nil {
			if verb == "create" {
				return nftables.ErrExists
			}
			if base != nil && (c.Base == nil || *c.Base != *base) {
				return fmt.Errorf("%w: chain %s exists as %v", nftables.ErrNotSupp, name, c.Base)
			}
			return nil
		}
		m.Chains[name] = &Chain{Name: name, Base: base}
	case "flush":
		if c == nil {
			return fmt.Errorf("%w: chain %s", nftables.ErrNotFound, name)
		}
		c.Rules = nil
	case "delete", "destroy":
		if c == nil {
			if verb == "destroy" {
				return nil
			}
			return fmt.Errorf("%w: chain %s", nftables.ErrNotFound, name)
		}
		if who := m.referrers("chain", name); who != "" {
			return fmt.Errorf("%w: chain %s is referenced by %s", nftables.ErrBusy, name, who)
		}
		delete(m.Chains, name)
	default:
		return fmt.Errorf("%w: %s chain", nftables.ErrNotSupp, verb)
	}
	return nil
}

func (m *Model) ruleOp(ip, verb, chain, text string) error {
	c := m.Chains[chain]
	if c == nil {
		return fmt.Errorf("%w: chain %s", nftables.ErrNotFound, chain)
	}
	if verb != "add" {
		return fmt.Errorf("%w: %s rule (kproxy only appends rules)", nftables.ErrNotSupp, verb)
	}
	rule, err := parseRule(ip, text)
	if err != nil {
		return fmt.Errorf("%w: rule %q: %w", nftables.ErrNotSupp, text, err)
	}
	if err := m.checkRefs(rule); err != nil {
		return err
	}
	c.Rules = append(c.Rules, rule)
	return nil
}

func (m *Model) setOp(verb string, isMap bool, name, text string) error {
	s := m.Sets[name]
	var spec SetSpec
	if text != "" {
		var err error
		if spec, err = parseSpec(text); err != nil {
			return fmt.Errorf("%w: %s %s: %w", nftables.ErrNotSupp, name, text, err)
		}
	}
	switch verb {
	case "add", "create":
		if s != nil {
			if verb == "create" {
				return nftables.ErrExists
			}
			if s.IsMap != isMap || (text != "" && s.Spec.String() != spec.String()) {
				return fmt.Errorf("%w: %s exists with another definition", nftables.ErrExists, name)
			}
			return nil
		}
		if text == "" {
			return fmt.Errorf("%w: %s %s without a definition", nftables.ErrNotSupp, kindName(isMap), name)
		}
		m.Sets[name] = &Set{Name: name, IsMap: isMap, Spec: spec, Elements: map[string]nft.Elem{}}
	case "flush":
		if s == nil || s.IsMap != isMap {
			return fmt.Errorf("%w: %s", nftables.ErrNotFound, name)
		}
		clear(s.Elements)
	case "delete", "destroy":
		if s == nil {
			if verb == "destroy" {
				return nil
			}
			return fmt.Errorf("%w: %s", nftables.ErrNotFound, name)
		}
		if who := m.referrers("set", name); who != "" {
			return fmt.Errorf("%w: %s is referenced by %s", nftables.ErrBusy, name, who)
		}
		delete(m.Sets, name)
	default:
		return fmt.Errorf("%w: %s set", nftables.ErrNotSupp, verb)
	}
	return nil
}

func kindName(isMap bool) string {
	if isMap {
		return "map"
	}
	return "set"
}

func (m *Model) elementOp(verb, set, spec string) error {
	s := m.Sets[set]
	if s == nil {
		return fmt.Errorf("%w: set %s", nftables.ErrNotFound, set)
	}
	body, ok := strings.CutPrefix(spec, "{ ")
	if ok {
		body, ok = strings.CutSuffix(body, " }")
	}
	if !ok {
		return fmt.Errorf("%w: element %q", nftables.ErrNotSupp, spec)
	}
	for _, one := range strings.Split(body, ", ") {
		if err := m.oneElement(s, verb, one); err != nil {
			return err
		}
	}
	return nil
}

func (m *Model) oneElement(s *Set, verb, text string) error {
	set := s.Name
	e, hasVal, err := parseElem(s, text)
	if err != nil {
		return fmt.Errorf("%w: element %q of %s: %w", nftables.ErrNotSupp, text, set, err)
	}
	id := ElemID(e.Key)
	old, exists := s.Elements[id]
	switch verb {
	case "add", "create":
		if s.IsMap != hasVal {
			return fmt.Errorf("%w: element %q of %s: a map's elements have values, a set's none", nftables.ErrNotSupp, text, set)
		}
		if exists {
			if verb == "create" || old.String() != e.String() {
				return fmt.Errorf("%w: element %s of %s", nftables.ErrExists, id, set)
			}
			return nil
		}
		if e.Verdict != nil && e.Verdict.Chain != "" && m.Chains[e.Verdict.Chain] == nil {
			return fmt.Errorf("%w: chain %s", nftables.ErrNotFound, e.Verdict.Chain)
		}
		s.Elements[id] = e
	case "delete", "destroy":
		if !exists {
			if verb == "destroy" {
				return nil
			}
			return fmt.Errorf("%w: element %s of %s", nftables.ErrNotFound, id, set)
		}
		delete(s.Elements, id)
	default:
		return fmt.Errorf("%w: %s element", nftables.ErrNotSupp, verb)
	}
	return nil
}

func (m *Model) checkRefs(r nft.Rule) error {
	chains, sets := refs(r)
	for _, c := range chains {
		if m.Chains[c] == nil {
			return fmt.Errorf("%w: chain %s", nftables.ErrNotFound, c)
		}
	}
	for _, s := range sets {
		if m.Sets[s] == nil {
			return fmt.Errorf("%w: set %s", nftables.ErrNotFound, s)
		}
	}
	return nil
}

// referrers names one rule or element that references the chain or set
// name ("" when none does).
func (m *Model) referrers(kind, name string) string {
	for _, c := range m.Chains {
		for _, r := range c.Rules {
			chains, sets := refs(r)
			if (kind == "chain" && slices.Contains(chains, name)) || (kind == "set" && slices.Contains(sets, name)) {
				return "a rule of chain " + c.Name
			}
		}
	}
	if kind != "chain" {
		return ""
	}
	for _, s := range m.Sets {
		for id, e := range s.Elements {
			if e.Verdict != nil && e.Verdict.Chain == name {
				return "element " + id + " of " + s.Name
			}
		}
	}
	return ""
}

// ListAll implements nftables.Interface: the names of the chains, sets and maps
// (under "chain", "set", "map").
func (f *Fake) ListAll(context.Context) (map[string][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		return nil, notFound("no such table")
	}
	out := map[string][]string{}
	for _, c := range slices.Sorted(maps.Keys(f.m.Chains)) {
		out["chain"] = append(out["chain"], c)
	}
	for _, n := range slices.Sorted(maps.Keys(f.m.Sets)) {
		kind := "set"
		if f.m.Sets[n].IsMap {
			kind = "map"
		}
		out[kind] = append(out[kind], n)
	}
	return out, nil
}

// List returns the names of one kind of object ("chains", "sets", "maps").
func (f *Fake) List(ctx context.Context, objectType string) ([]string, error) {
	all, err := f.ListAll(ctx)
	if err != nil {
		return nil, err
	}
	return all[strings.TrimSuffix(objectType, "s")], nil
}

// CountRules implements nftables.Interface.
func (f *Fake) CountRules(ctx context.Context, chain string) (int, error) {
	rs, err := f.ListRules(ctx, chain)
	if nftables.IsNotFound(err) {
		return 0, nil
	}
	return len(rs), err
}

// ListRules implements nftables.Interface (with the rule text).
func (f *Fake) ListRules(_ context.Context, chain string) ([]*knftables.Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		return nil, notFound("no such table")
	}
	c := f.m.Chains[chain]
	if c == nil {
		return nil, notFound("no such chain %q", chain)
	}
	var out []*knftables.Rule
	for i, r := range c.Rules {
		out = append(out, &knftables.Rule{Chain: chain, Rule: r.String(), Handle: knftables.PtrTo(i + 1)})
	}
	return out, nil
}

// ListElements returns the elements of a set or map.
func (f *Fake) ListElements(_ context.Context, _, name string) ([]*knftables.Element, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil || f.m.Sets[name] == nil {
		return nil, notFound("no such set %q", name)
	}
	s := f.m.Sets[name]
	var out []*knftables.Element
	for _, id := range slices.Sorted(maps.Keys(s.Elements)) {
		e := s.Elements[id]
		el := &knftables.Element{Key: parts(e.Key)}
		switch {
		case e.Verdict != nil:
			el.Value = []string{e.Verdict.String()}
		case e.Data != nil:
			el.Value = parts(e.Data)
		}
		if s.IsMap {
			el.Map = name
		} else {
			el.Set = name
		}
		out = append(out, el)
	}
	return out, nil
}

// parts writes each value of k.
func parts(k nft.Key) []string {
	out := make([]string, len(k))
	for i, v := range k {
		out[i] = v.String()
	}
	return out
}

// notFound makes an error knftables.IsNotFound recognises (it looks for the
// ENOENT text nft prints).
func notFound(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{nftables.ErrNotFound}, args...)...)
}

// Dump lists the table deterministically: the comment, every set with its
// sorted elements, every chain with its rules, in name order ("" when there
// is no table).
func (f *Fake) Dump() string {
	m := f.Model()
	if m == nil {
		return ""
	}
	return m.Dump()
}

// Dump lists the model deterministically.
func (m *Model) Dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table comment %q\n", m.Comment)
	for _, n := range slices.Sorted(maps.Keys(m.Sets)) {
		s := m.Sets[n]
		kind := "set"
		if s.IsMap {
			kind = "map"
		}
		fmt.Fprintf(&b, "%s %s %s\n", kind, n, s.Spec)
		for _, id := range slices.Sorted(maps.Keys(s.Elements)) {
			fmt.Fprintf(&b, "\t%s\n", s.Elements[id])
		}
	}
	for _, n := range slices.Sorted(maps.Keys(m.Chains)) {
		c := m.Chains[n]
		fmt.Fprintf(&b, "chain %s", n)
		if c.Base != nil {
			fmt.Fprintf(&b, " { %s }", c.Base)
		}
		b.WriteString("\n")
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t%s\n", r)
		}
	}
	return b.String()
}
