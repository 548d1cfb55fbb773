package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// normalizeSave puts iptables-save output in a form two saves of the same
// rules share whatever the history of the tables: comments dropped,
// counters (see counters) zeroed, chains sorted by name within each table (iptables-nft
// lists them in creation order), each chain's rules kept in their order.
func normalizeSave(save string) string {
	type chain struct {
		decl  string
		rules []string
	}
	tables := map[string]map[string]*chain{}
	table := ""
	get := func(name string) *chain {
		if tables[table] == nil {
			tables[table] = map[string]*chain{}
		}
		c := tables[table][name]
		if c == nil {
			c = &chain{}
			tables[table][name] = c
		}
		return c
	}
	for _, l := range strings.Split(save, "\n") {
		switch {
		case l == "" || strings.HasPrefix(l, "#") || l == "COMMIT":
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			get(name).decl = counters.ReplaceAllString(l, "[0:0]")
		case strings.HasPrefix(l, "-A "):
			name, _, _ := strings.Cut(l[3:], " ")
			c := get(name)
			c.rules = append(c.rules, l)
		default:
			c := get("?")
			c.rules = append(c.rules, l)
		}
	}
	var b strings.Builder
	for _, t := range slices.Sorted(maps.Keys(tables)) {
		fmt.Fprintf(&b, "*%s\n", t)
		for _, name := range slices.Sorted(maps.Keys(tables[t])) {
			c := tables[t][name]
			if c.decl != "" {
				b.WriteString(c.decl + "\n")
			}
			for _, r := range c.rules {
				b.WriteString(r + "\n")
			}
		}
	}
	return b.String()
}

// tables returns node1's nat and filter tables of both families, normalized.
func (e *env) tables() string {
	e.t.Helper()
	var b strings.Builder
	if nftMode() {
		for _, fam := range families() {
			fmt.Fprintf(&b, "# %s\n%s", fam, normalizeNFT(e.nftTable(fam)))
		}
		return b.String()
	}
	for _, fam := range families() {
		for _, t := range []string{"nat", "filter"} {
			fmt.Fprintf(&b, "# %s %s\n%s", fam, t, normalizeSave(e.save(fam, t)))
		}
	}
	return b.String()
}

// normalizeNFT is normalizeSave for "nft list table": the elements of a
// set or map are one per line and sorted (nft lists them in the order of
// its hash table), everything else keeps its order.
func normalizeNFT(table string) string {
	var b strings.Builder
	var elems []string
	in := false
	flush := func() {
		slices.Sort(elems)
		for _, e := range elems {
			b.WriteString("\t\telement " + e + "\n")
		}
		elems, in = elems[:0], false
	}
	for _, l := range strings.Split(table, "\n") {
		t := strings.TrimSpace(l)
		if !in && strings.HasPrefix(t, "elements = {") {
			in = true
			t = strings.TrimPrefix(t, "elements = {")
		}
		if !in {
			if t != "" {
				b.WriteString(l + "\n")
			}
			continue
		}
		end := strings.HasSuffix(t, "}")
		t = strings.TrimSuffix(t, "}")
		for _, e := range strings.Split(t, ",") {
			if e = strings.TrimSpace(e); e != "" {
				elems = append(elems, e)
			}
		}
		if end {
			flush()
		}
	}
	return b.String()
}

// stableTables waits until two reads of the tables 2 s apart agree (kproxy
// has applied what it was told) and returns them.
func (e *env) stableTables(ctx context.Context, limit time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	last := e.tables()
	for {
		select {
		case <-ctx.Done():
			e.t.Fatalf("tables never settled: %v", ctx.Err())
		case <-time.After(2 * time.Second):
		}
		cur := e.tables()
		if cur == last {
			return cur
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the tables kept changing for %v", limit)
		}
		last = cur
	}
}

// lineDiff lists up to max lines of a missing from b (as a multiset, kept
// in a's order).
func lineDiff(a, b string, max int) []string {
	count := map[string]int{}
	for _, l := range strings.Split(b, "\n") {
		count[l]++
	}
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if l == "" {
			continue
		}
		if count[l] > 0 {
			count[l]--
			continue
		}
		out = append(out, l)
		if len(out) == max {
			break
		}
	}
	return out
}

// checkRulesLikeFresh is the "rules consistent" proof after restarts: the
// nat and filter tables of both families (kproxy's chains and rules, its
// jumps in the built-in chains, counters aside) must be exactly what a
// fresh kproxy programs for the same objects on empty tables. It stops
// kproxy, removes its rules with --cleanup, starts a new run and compares
// the tables once each run has settled. The objects must not change
// meanwhile.
func (e *env) checkRulesLikeFresh(ctx context.Context) {
	e.t.Helper()
	settle := 2 * time.Minute
	restarted := e.stableTables(ctx, settle)
	if err := e.p.Stop(30 * time.Second); err != nil {
		e.t.Fatalf("stopping kproxy: %v", err)
	}
	if out, err := e.p.Cleanup(ctx); err != nil {
		e.t.Fatalf("kproxy --cleanup: %v\n%s", err, LastLines(string(out), 20))
	}
	if t := e.tables(); strings.Contains(t, "KPROXY-") {
		e.t.Fatalf("kproxy rules left after --cleanup:\n%s", LastLines(t, 40))
	}
	t0 := time.Now()
	e.start()
	fresh := e.stableTables(ctx, settle)
	e.t.Logf("a fresh kproxy on empty tables: programmed and settled in %v", time.Since(t0).Round(time.Millisecond))
	if restarted == fresh {
		e.t.Logf("the restarted kproxy's tables equal a fresh kproxy's (%d lines)", strings.Count(fresh, "\n"))
		return
	}
	e.t.Errorf("the tables after the restarts differ from a fresh kproxy's:\nonly after the restarts:\n  %s\nonly fresh:\n  %s",
		strings.Join(lineDiff(restarted, fresh, 20), "\n  "), strings.Join(lineDiff(fresh, restarted, 20), "\n  "))
}

// TestNormalizeSave: counters, comments and the order of chains do not
// matter; the order of a chain's rules and any rule more do.
func TestNormalizeSave(t *testing.T) {
	a := "# Generated\n*nat\n:PREROUTING ACCEPT [10:600]\n:KPROXY-B - [0:0]\n:KPROXY-A - [0:0]\n-A PREROUTING -j KPROXY-A\n-A KPROXY-A -j RETURN\n-A KPROXY-A -j ACCEPT\nCOMMIT\n"
	b := "*nat\n:KPROXY-A - [0:0]\n:PREROUTING ACCEPT [0:0]\n:KPROXY-B - [3:4]\n-A KPROXY-A -j RETURN\n-A KPROXY-A -j ACCEPT\n-A PREROUTING -j KPROXY-A\nCOMMIT\n# Completed\n"
	if normalizeSave(a) != normalizeSave(b) {
		t.Errorf("same rules differ:\n%s\n%s", normalizeSave(a), normalizeSave(b))
	}
	for name, c := range map[string]string{
		"rules reordered":  strings.Replace(b, "-A KPROXY-A -j RETURN\n-A KPROXY-A -j ACCEPT\n", "-A KPROXY-A -j ACCEPT\n-A KPROXY-A -j RETURN\n", 1),
		"a duplicate jump": strings.Replace(b, "-A PREROUTING -j KPROXY-A\n", "-A PREROUTING -j KPROXY-A\n-A PREROUTING -j KPROXY-A\n", 1),
		"a chain more":     strings.Replace(b, "COMMIT", ":KPROXY-C - [0:0]\nCOMMIT", 1),
	} {
		if normalizeSave(a) == normalizeSave(c) {
			t.Errorf("%s: not seen", name)
		}
	}
}
