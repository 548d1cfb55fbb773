package linux

import (
	"fmt"
	"slices"

	"github.com/kproxy/kproxy/platform/linux/iptables"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
)

// terminal targets end a packet's walk through a built-in chain (or send it
// elsewhere): such a rule in front of kproxy's jump can keep packets from it.
var terminal = map[string]bool{"ACCEPT": true, "DROP": true, "REJECT": true, "RETURN": true, "DNAT": true, "SNAT": true, "MASQUERADE": true}

// IptablesDrift compares live tables with planned ones (kproxy's plan applied
// to empty tables, with its jumps) and returns one line per difference:
// kproxy chains missing, stale or different, a missing jump, a rule of
// someone else in front of a jump.
func IptablesDrift(planned, live *iptmodel.Ruleset, jumps []iptables.Jump) []string {
	var out []string
	for _, table := range []string{iptables.TableNAT, iptables.TableFilter} {
		pt, lt := planned.Table(table), live.Table(table)
		want, have := ownedChains(pt), ownedChains(lt)
		if len(have) == 0 && len(want) > 0 {
			out = append(out, fmt.Sprintf("table %s has no KPROXY chain: kproxy's rules are not installed (kproxy not running yet, or removed by --cleanup)", table))
		}
		for _, name := range want {
			lc := lt.Chain(name)
			if lc == nil {
				if len(have) > 0 {
					out = append(out, fmt.Sprintf("missing chain %s/%s (in the plan, not in the kernel)", table, name))
				}
				continue
			}
			if !sameRules(pt.Chain(name), lc) {
				out = append(out, fmt.Sprintf("chain %s/%s differs from the plan (%d rules live, %d planned)", table, name, len(lc.Rules), len(pt.Chain(name).Rules)))
			}
		}
		for _, name := range have {
			if pt.Chain(name) == nil {
				out = append(out, fmt.Sprintf("stale chain %s/%s (in the kernel, not in the plan)", table, name))
			}
		}
		for _, j := range jumps {
			if j.Table != table {
				continue
			}
			out = append(out, jumpDrift(live, j)...)
		}
	}
	return out
}

func jumpDrift(live *iptmodel.Ruleset, j iptables.Jump) []string {
	want, err := iptmodel.ParseRule(j.Spec)
	if err != nil {
		return []string{fmt.Sprintf("cannot read the planned jump %s/%s %v: %v", j.Table, j.Chain, j.Spec, err)}
	}
	c := live.Table(j.Table).Chain(j.Chain)
	if c == nil {
		return []string{fmt.Sprintf("built-in chain %s/%s is missing", j.Table, j.Chain)}
	}
	at := -1
	if ok, err := live.Exists(j.Table, j.Chain, j.Spec...); err == nil && ok {
		for i, r := range c.Rules {
			if r.Target() == want.Target() {
				at = i
				break
			}
		}
	}
	if at < 0 {
		return []string{fmt.Sprintf("missing jump in %s/%s: -A %s %s (packets there never reach kproxy's rules)", j.Table, j.Chain, j.Chain, want.Spec)}
	}
	var out []string
	for _, r := range c.Rules[:at] {
		if iptables.Owned(r.Target()) {
			continue
		}
		if terminal[r.Target()] || r.IsJump() {
			out = append(out, fmt.Sprintf("foreign rule in front of kproxy's jump to %s in %s/%s: -A %s %s", want.Target(), j.Table, j.Chain, j.Chain, r.Spec))
		}
	}
	return out
}

func ownedChains(t *iptmodel.Table) []string {
	var out []string
	for _, n := range t.ChainNames() {
		if iptables.Owned(n) {
			out = append(out, n)
		}
	}
	return out
}

func sameRules(a, b *iptmodel.Chain) bool {
	return slices.EqualFunc(a.Rules, b.Rules, func(x, y *iptmodel.Rule) bool { return x.Spec == y.Spec })
}
