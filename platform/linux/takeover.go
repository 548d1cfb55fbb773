package linux

import (
	"bufio"
	"bytes"
	"sort"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
)

// Upstream kube-proxy's iptables chains: fixed names per table, plus the
// per-service prefixes. Chains kubelet owns (KUBE-KUBELET-CANARY,
// KUBE-FIREWALL) are not kube-proxy's and are left alone, as is anything
// still referenced from a chain that is not being removed.
var (
	upstreamChains = map[string][]string{
		"nat": {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ",
			"KUBE-MARK-DROP", "KUBE-PROXY-CANARY", "KUBE-LOAD-BALANCER", "KUBE-NODE-PORT"},
		"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
			"KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY",
			// ipvs mode's filter chains.
			"KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
		"mangle": {"KUBE-PROXY-CANARY"},
	}
	upstreamPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "KUBE-XLB-"}
)

// TakeoverTables are the tables a take-over looks at.
var TakeoverTables = []string{"nat", "filter", "mangle"}

func isUpstream(table, chain string) bool {
	for _, c := range upstreamChains[table] {
		if c == chain {
			return true
		}
	}
	if table != "nat" {
		return false
	}
	for _, p := range upstreamPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// saveRule is one "-A" line of iptables-save output.
type saveRule struct {
	chain, target, spec string
}

// parseSave extracts chains and rules from iptables-save output of one
// table, without interpreting matches (the output may hold rules of other
// tools the model does not understand).
func parseSave(data []byte) (chains []string, rules []saveRule) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				chains = append(chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			args, err := syntax.Split(line)
			if err != nil || len(args) < 2 {
				continue
			}
			r := saveRule{chain: args[1], spec: strings.TrimSpace(strings.TrimPrefix(line, "-A "+args[1]))}
			for i := 2; i+1 < len(args); i++ {
				if args[i] == "-j" || args[i] == "-g" || args[i] == "--jump" || args[i] == "--goto" {
					r.target = args[i+1]
				}
			}
			rules = append(rules, r)
		}
	}
	return chains, rules
}

// ChainNames returns the chains declared in iptables-save output.
func ChainNames(save []byte) []string {
	c, _ := parseSave(save)
	return c
}

// takeover is the plan to remove upstream kube-proxy's rules from one table.
type takeover struct {
	table string
	// remove are the chains to flush and delete.
	remove []string
	// unlink are rules of other chains that jump to a removed chain.
	unlink []saveRule
	// kept are upstream chains left in place because a chain that is not
	// removed still jumps to them.
	kept []string
}

// planTakeover decides what to remove from one table: every upstream chain
// whose only references come from other removed chains or from built-in
// chains (those jump rules are deleted).
func planTakeover(table string, save []byte) takeover {
	chains, rules := parseSave(save)
	remove := map[string]bool{}
	for _, c := range chains {
		if isUpstream(table, c) {
			remove[c] = true
		}
	}
	builtin := map[string]bool{}
	for _, c := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
		builtin[c] = true
	}
	// A chain referenced from a chain that stays must stay, and so must
	// what it references in turn: iterate to a fixed point.
	t := takeover{table: table}
	for changed := true; changed; {
		changed = false
		for _, r := range rules {
			if remove[r.target] && !remove[r.chain] && !builtin[r.chain] {
				delete(remove, r.target)
				t.kept = append(t.kept, r.target)
				changed = true
			}
		}
	}
	for c := range remove {
		t.remove = append(t.remove, c)
	}
	sort.Strings(t.remove)
	sort.Strings(t.kept)
	for _, r := range rules {
		if remove[r.target] && builtin[r.chain] {
			t.unlink = append(t.unlink, r)
		}
	}
	return t
}

// lines renders the take-over as restore lines of its table: flush the
// chains, delete the jump rules to them, delete the chains.
func (t takeover) lines() []string {
	var out []string
	for _, c := range t.remove {
		out = append(out, ":"+c+" - [0:0]")
	}
	for _, r := range t.unlink {
		out = append(out, "-D "+r.chain+" "+r.spec)
	}
	for _, c := range t.remove {
		out = append(out, "-X "+c)
	}
	return out
}

// takeoverPlan is the take-over of every table.
type takeoverPlan struct {
	lines   map[string][]string
	removed []string
	kept    []string
}

// planTakeovers plans the take-over from iptables-save output per table.
func planTakeovers(saves map[string][]byte) *takeoverPlan {
	p := &takeoverPlan{lines: map[string][]string{}}
	for _, table := range TakeoverTables {
		t := planTakeover(table, saves[table])
		if l := t.lines(); len(l) > 0 {
			p.lines[table] = l
		}
		for _, c := range t.remove {
			p.removed = append(p.removed, table+"/"+c)
		}
		for _, c := range t.kept {
			p.kept = append(p.kept, table+"/"+c)
		}
	}
	return p
}

func (p *takeoverPlan) empty() bool { return len(p.lines) == 0 }

func (p *takeoverPlan) chains() []string { return p.removed }
