package model

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
)

// builtinChains lists each table's built-in chains in iptables-save order.
var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// Chain is one chain of a table.
type Chain struct {
	Name string
	// Policy is ACCEPT or DROP for a built-in chain, "-" for a user chain.
	Policy string
	Rules  []*Rule
}

// Builtin reports whether the chain is one of its table's built-in chains.
func (c *Chain) Builtin() bool { return c.Policy != "-" }

// Table is one iptables table.
type Table struct {
	Name   string
	chains map[string]*Chain
	// refs counts the rules that jump or go to each chain.
	refs map[string]int
}

func newTable(name string) *Table {
	t := &Table{Name: name, chains: map[string]*Chain{}, refs: map[string]int{}}
	for _, c := range builtinChains[name] {
		t.chains[c] = &Chain{Name: c, Policy: "ACCEPT"}
	}
	return t
}

// Chain returns a chain by name (nil when absent).
func (t *Table) Chain(name string) *Chain { return t.chains[name] }

// ChainNames returns the table's chains, built-in ones first in their usual
// order, then user chains sorted by name.
func (t *Table) ChainNames() []string {
	out := slices.Clone(builtinChains[t.Name])
	var user []string
	for n, c := range t.chains {
		if !c.Builtin() {
			user = append(user, n)
		}
	}
	sort.Strings(user)
	return append(out, user...)
}

// References returns the number of rules that jump or go to chain.
func (t *Table) References(chain string) int { return t.refs[chain] }

// NumRules returns the number of rules in the table.
func (t *Table) NumRules() int {
	n := 0
	for _, c := range t.chains {
		n += len(c.Rules)
	}
	return n
}

func (t *Table) clone() *Table {
	n := &Table{Name: t.Name, chains: make(map[string]*Chain, len(t.chains)), refs: make(map[string]int, len(t.refs))}
	for k, c := range t.chains {
		n.chains[k] = &Chain{Name: c.Name, Policy: c.Policy, Rules: slices.Clone(c.Rules)}
	}
	for k, v := range t.refs {
		n.refs[k] = v
	}
	return n
}

func (t *Table) addRule(chain string, pos int, r *Rule) error {
	c := t.chains[chain]
	if c == nil {
		return fmt.Errorf("chain %s does not exist in table %s", chain, t.Name)
	}
	if r.IsJump() {
		tc := t.chains[r.target.name]
		if tc == nil {
			return fmt.Errorf("chain %s does not exist in table %s (jump target)", r.target.name, t.Name)
		}
		if tc.Builtin() {
			return fmt.Errorf("cannot jump to built-in chain %s", tc.Name)
		}
	}
	if err := checkTable(t.Name, chain, r); err != nil {
		return err
	}
	if pos < 0 || pos > len(c.Rules) {
		return fmt.Errorf("index of insertion too big for chain %s", chain)
	}
	c.Rules = slices.Insert(c.Rules, pos, r)
	if r.IsJump() {
		t.refs[r.target.name]++
	}
	return nil
}

// checkTable rejects targets a table does not allow, as the kernel does.
func checkTable(table, chain string, r *Rule) error {
	switch r.target.name {
	case "DNAT", "SNAT", "MASQUERADE":
		if table != "nat" {
			return fmt.Errorf("target %s is only valid in the nat table", r.target.name)
		}
	case "REJECT":
		if table != "filter" && table != "mangle" && table != "raw" {
			return fmt.Errorf("target REJECT is not valid in the %s table", table)
		}
	case "DROP":
		if table == "nat" {
			return errors.New("the nat table is not intended for filtering: DROP is not allowed")
		}
	}
	if table == "nat" {
		switch {
		case r.target.name == "DNAT" && (chain == "POSTROUTING" || chain == "INPUT"):
			return fmt.Errorf("DNAT is not valid in nat %s", chain)
		case (r.target.name == "SNAT" || r.target.name == "MASQUERADE") && (chain == "PREROUTING" || chain == "OUTPUT"):
			return fmt.Errorf("%s is not valid in nat %s", r.target.name, chain)
		}
	}
	return nil
}

func (t *Table) removeRuleAt(c *Chain, i int) {
	r := c.Rules[i]
	if r.IsJump() {
		t.refs[r.target.name]--
	}
	c.Rules = slices.Delete(c.Rules, i, i+1)
}

func (t *Table) flush(c *Chain) {
	for i := len(c.Rules) - 1; i >= 0; i-- {
		t.removeRuleAt(c, i)
	}
}

func (t *Table) deleteChain(name string) error {
	c := t.chains[name]
	switch {
	case c == nil:
		return fmt.Errorf("chain %s does not exist in table %s", name, t.Name)
	case c.Builtin():
		return fmt.Errorf("cannot delete built-in chain %s", name)
	case t.refs[name] > 0:
		return fmt.Errorf("chain %s is still referenced by %d rules (device or resource busy)", name, t.refs[name])
	case len(c.Rules) > 0:
		return fmt.Errorf("chain %s is not empty", name)
	}
	delete(t.chains, name)
	delete(t.refs, name)
	return nil
}

// Ruleset is a set of tables of one IP family.
type Ruleset struct {
	tables map[string]*Table
}

// New returns an empty ruleset: every table with its built-in chains, empty,
// with ACCEPT policies.
func New() *Ruleset {
	rs := &Ruleset{tables: map[string]*Table{}}
	for name := range builtinChains {
		rs.tables[name] = newTable(name)
	}
	return rs
}

// Table returns a table by name (nil for an unknown table).
func (rs *Ruleset) Table(name string) *Table { return rs.tables[name] }

// Clone returns a deep copy (rules are immutable and shared).
func (rs *Ruleset) Clone() *Ruleset {
	n := &Ruleset{tables: make(map[string]*Table, len(rs.tables))}
	for k, t := range rs.tables {
		n.tables[k] = t.clone()
	}
	return n
}

func (rs *Ruleset) table(name string) (*Table, error) {
	t := rs.tables[name]
	if t == nil {
		return nil, fmt.Errorf("table %q does not exist", name)
	}
	return t, nil
}

// Restore applies iptables-restore input atomically: on any error nothing
// changes. With noflush (iptables-restore --noflush) only the chains the input
// declares are flushed; without it every table the input names is flushed and
// its user chains deleted first.
func (rs *Ruleset) Restore(data []byte, noflush bool) error {
	work := rs.Clone()
	if err := work.restore(data, noflush); err != nil {
		return err
	}
	rs.tables = work.tables
	return nil
}

func (rs *Ruleset) restore(data []byte, noflush bool) error {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	var t *Table
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fail := func(err error) error { return fmt.Errorf("line %d (%q): %w", lineNo, line, err) }
		switch {
		case line[0] == '*':
			if t != nil {
				return fail(errors.New("COMMIT expected before a new table"))
			}
			var err error
			if t, err = rs.table(line[1:]); err != nil {
				return fail(err)
			}
			if !noflush {
				for _, c := range t.chains {
					t.flush(c)
				}
				for n, c := range t.chains {
					if !c.Builtin() {
						delete(t.chains, n)
					}
				}
				t.refs = map[string]int{}
			}
		case line == "COMMIT":
			if t == nil {
				return fail(errors.New("COMMIT outside a table"))
			}
			t = nil
		case line[0] == ':':
			if t == nil {
				return fail(errors.New("chain declaration outside a table"))
			}
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return fail(errors.New("bad chain declaration"))
			}
			if err := rs.declare(t, f[0], f[1]); err != nil {
				return fail(err)
			}
		default:
			if t == nil {
				return fail(errors.New("rule outside a table"))
			}
			args, err := syntax.Split(line)
			if err != nil {
				return fail(err)
			}
			if err := t.command(args); err != nil {
				return fail(err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if t != nil {
		return fmt.Errorf("table %s: COMMIT expected at end of input", t.Name)
	}
	return nil
}

func (rs *Ruleset) declare(t *Table, name, policy string) error {
	if len(name) > 28 {
		return fmt.Errorf("chain name %q is longer than 28 characters", name)
	}
	c := t.chains[name]
	if slices.Contains(builtinChains[t.Name], name) {
		if policy != "ACCEPT" && policy != "DROP" && policy != "-" {
			return fmt.Errorf("bad policy %q for built-in chain %s", policy, name)
		}
		if policy != "-" {
			c.Policy = policy
		}
		return nil
	}
	if policy != "-" {
		return fmt.Errorf("user chain %s cannot have a policy", name)
	}
	if c == nil {
		t.chains[name] = &Chain{Name: name, Policy: "-"}
		return nil
	}
	t.flush(c)
	return nil
}

// command applies one rule command (-A, -I, -D, -F, -X, -N, -P, -Z) to t.
func (t *Table) command(args []string) error {
	if len(args) == 0 {
		return nil
	}
	op, rest := args[0], args[1:]
	chainArg := func() (string, error) {
		if len(rest) == 0 {
			return "", fmt.Errorf("%s needs a chain", op)
		}
		return rest[0], nil
	}
	switch op {
	case "-A", "--append", "-I", "--insert":
		chain, err := chainArg()
		if err != nil {
			return err
		}
		spec := rest[1:]
		pos := -1
		if op == "-I" || op == "--insert" {
			pos = 0
			if len(spec) > 0 {
				if n, err := strconv.Atoi(spec[0]); err == nil {
					pos, spec = n-1, spec[1:]
				}
			}
		}
		r, err := ParseRule(spec)
		if err != nil {
			return err
		}
		if pos < 0 {
			if c := t.chains[chain]; c != nil {
				pos = len(c.Rules)
			}
		}
		return t.addRule(chain, pos, r)
	case "-D", "--delete":
		chain, err := chainArg()
		if err != nil {
			return err
		}
		return t.deleteRule(chain, rest[1:])
	case "-F", "--flush":
		if len(rest) == 0 {
			for _, c := range t.chains {
				t.flush(c)
			}
			return nil
		}
		c := t.chains[rest[0]]
		if c == nil {
			return fmt.Errorf("chain %s does not exist", rest[0])
		}
		t.flush(c)
		return nil
	case "-X", "--delete-chain":
		if len(rest) == 0 {
			for _, n := range t.ChainNames() {
				if !t.chains[n].Builtin() {
					if err := t.deleteChain(n); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return t.deleteChain(rest[0])
	case "-N", "--new-chain":
		chain, err := chainArg()
		if err != nil {
			return err
		}
		if t.chains[chain] != nil {
			return fmt.Errorf("chain %s already exists", chain)
		}
		if len(chain) > 28 {
			return fmt.Errorf("chain name %q is longer than 28 characters", chain)
		}
		t.chains[chain] = &Chain{Name: chain, Policy: "-"}
		return nil
	case "-P", "--policy":
		if len(rest) != 2 {
			return errors.New("-P needs a chain and a policy")
		}
		c := t.chains[rest[0]]
		if c == nil || !c.Builtin() || (rest[1] != "ACCEPT" && rest[1] != "DROP") {
			return fmt.Errorf("bad policy %q for chain %s", rest[1], rest[0])
		}
		c.Policy = rest[1]
		return nil
	case "-Z", "--zero":
		return nil
	}
	return fmt.Errorf("unknown command %q", op)
}

func (t *Table) deleteRule(chain string, spec []string) error {
	c := t.chains[chain]
	if c == nil {
		return fmt.Errorf("chain %s does not exist", chain)
	}
	if len(spec) == 1 {
		if n, err := strconv.Atoi(spec[0]); err == nil {
			if n < 1 || n > len(c.Rules) {
				return fmt.Errorf("index of deletion too big for chain %s", chain)
			}
			t.removeRuleAt(c, n-1)
			return nil
		}
	}
	i, err := t.find(c, spec)
	if err != nil {
		return err
	}
	if i < 0 {
		return fmt.Errorf("bad rule (does a matching rule exist in chain %s?)", chain)
	}
	t.removeRuleAt(c, i)
	return nil
}

func (t *Table) find(c *Chain, spec []string) (int, error) {
	r, err := ParseRule(spec)
	if err != nil {
		return -1, err
	}
	for i, have := range c.Rules {
		if have.Spec == r.Spec {
			return i, nil
		}
	}
	return -1, nil
}

// Insert inserts a rule at position pos (1-based), like iptables -I.
func (rs *Ruleset) Insert(table, chain string, pos int, spec ...string) error {
	return rs.apply(table, append([]string{"-I", chain, strconv.Itoa(pos)}, spec...))
}

// Append appends a rule, like iptables -A.
func (rs *Ruleset) Append(table, chain string, spec ...string) error {
	return rs.apply(table, append([]string{"-A", chain}, spec...))
}

// Delete deletes the first rule equal to spec, like iptables -D.
func (rs *Ruleset) Delete(table, chain string, spec ...string) error {
	return rs.apply(table, append([]string{"-D", chain}, spec...))
}

// Exists reports whether chain holds a rule equal to spec, like iptables -C.
// Rules compare by their text, so spec must use the same spelling.
func (rs *Ruleset) Exists(table, chain string, spec ...string) (bool, error) {
	t, err := rs.table(table)
	if err != nil {
		return false, err
	}
	c := t.chains[chain]
	if c == nil {
		return false, fmt.Errorf("chain %s does not exist in table %s", chain, table)
	}
	i, err := t.find(c, spec)
	return i >= 0, err
}

// List returns a chain in iptables -S form: "-N CHAIN" (or "-P CHAIN
// POLICY") followed by one "-A CHAIN ..." line per rule.
func (rs *Ruleset) List(table, chain string) ([]string, error) {
	t, err := rs.table(table)
	if err != nil {
		return nil, err
	}
	c := t.chains[chain]
	if c == nil {
		return nil, fmt.Errorf("chain %s does not exist in table %s", chain, table)
	}
	var out []string
	if c.Builtin() {
		out = append(out, "-P "+c.Name+" "+c.Policy)
	} else {
		out = append(out, "-N "+c.Name)
	}
	for _, r := range c.Rules {
		out = append(out, "-A "+c.Name+" "+r.Spec)
	}
	return out, nil
}

func (rs *Ruleset) apply(table string, args []string) error {
	t, err := rs.table(table)
	if err != nil {
		return err
	}
	work := t.clone()
	if err := work.command(args); err != nil {
		return err
	}
	rs.tables[table] = work
	return nil
}

// Save renders one table as iptables-save would (without counters and
// comments): built-in chains first, then user chains sorted by name, then the
// rules chain by chain.
func (rs *Ruleset) Save(table string) string {
	t := rs.tables[table]
	if t == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	names := t.ChainNames()
	for _, n := range names {
		c := t.chains[n]
		b.WriteString(":" + n + " " + c.Policy + " [0:0]\n")
	}
	for _, n := range names {
		for _, r := range t.chains[n].Rules {
			b.WriteString("-A " + n + " " + r.Spec + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// Parse builds a ruleset from iptables-save output (any number of tables).
// Tables the output does not mention stay empty.
func Parse(save []byte) (*Ruleset, error) {
	rs := New()
	if err := rs.Restore(save, false); err != nil {
		return nil, err
	}
	return rs, nil
}
