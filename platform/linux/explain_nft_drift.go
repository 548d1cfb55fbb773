package linux

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// maxListed bounds the elements named per kind of difference and set.
const maxListed = 8

// portChainGen matches the generation a port's own chain carries in its
// name ("port-<key>-<role>-<gen>"): a fresh one per rendering whose rules
// changed, so a node that synced partially names the chain of the same
// content differently from a plan made from scratch.
var portChainGen = regexp.MustCompile(`^(port-\S+)-[0-9]+$`)

// withoutGenerations returns m with the generation left out of the names
// of the ports' own chains: the chains, and every rule's and verdict
// element's reference to them (a typed rename).
func withoutGenerations(m *nftmodel.Model) *nftmodel.Model {
	if m == nil {
		return nil
	}
	rename := map[string]string{}
	for n := range m.Chains {
		if sm := portChainGen.FindStringSubmatch(n); sm != nil {
			rename[n] = sm[1]
		}
	}
	return m.RenameChains(rename)
}

// NFTDrift compares kproxy's table read back from the kernel (live; nil:
// no table) with the planned one (kproxy's plan applied to an empty Fake)
// and returns one line per difference: the table missing, chains missing
// or stale, base chains missing or on another hook or priority, rules that
// differ, sets missing, elements missing, extra or with another value, and
// every rule the converter could not read.
func NFTDrift(fam knftables.Family, planned, live *nftmodel.Model, unread []nftmodel.Unreadable) []string {
	table := fmt.Sprintf("%s %s", fam, nftables.TableName)
	if live == nil {
		return []string{fmt.Sprintf("table %s does not exist: kproxy's rules are not installed (kproxy not running yet, in another mode, or removed by --cleanup or nft delete table)", table)}
	}
	var out []string
	for _, u := range unread {
		if u.Chain != "" {
			out = append(out, fmt.Sprintf("chain %s rule %d is not a rule kproxy writes (%s): %s", u.Chain, u.Rule, u.Reason, u.JSON))
		} else {
			out = append(out, fmt.Sprintf("%s in table %s: %s: %s", u.What, table, u.Reason, u.JSON))
		}
	}
	p, l := withoutGenerations(planned), withoutGenerations(live)
	for _, n := range slices.Sorted(maps.Keys(p.Chains)) {
		pc, lc := p.Chains[n], l.Chains[n]
		switch {
		case lc == nil && pc.Base != nil:
			out = append(out, fmt.Sprintf("missing base chain %s (%s): packets of that hook never reach kproxy's rules", n, pc.Base))
			continue
		case lc == nil:
			out = append(out, fmt.Sprintf("missing chain %s (in the plan, not in the kernel)", n))
			continue
		case pc.Base != nil && lc.Base == nil:
			out = append(out, fmt.Sprintf("chain %s is not a base chain (planned: %s): packets of that hook never reach kproxy's rules", n, pc.Base))
		case baseText(pc.Base) != baseText(lc.Base):
			out = append(out, fmt.Sprintf("base chain %s is %q, planned %q", n, baseText(lc.Base), baseText(pc.Base)))
		}
		if d := ruleDiff(pc.Rules, lc.Rules); d != "" {
			out = append(out, fmt.Sprintf("chain %s differs from the plan (%d rules live, %d planned): %s", n, len(lc.Rules), len(pc.Rules), d))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(l.Chains)) {
		if p.Chains[n] == nil {
			what := "stale chain"
			if b := l.Chains[n].Base; b != nil {
				what = "base chain not in the plan: " + b.String() + ":"
			}
			out = append(out, fmt.Sprintf("%s %s (in the kernel, not in the plan)", what, n))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(p.Sets)) {
		ps, ls := p.Sets[n], l.Sets[n]
		kind := setKind(ps)
		switch {
		case ls == nil:
			out = append(out, fmt.Sprintf("missing %s %s (in the plan, not in the kernel)", kind, n))
			continue
		case ps.IsMap != ls.IsMap || ps.IsVerdictMap() != ls.IsVerdictMap():
			out = append(out, fmt.Sprintf("%s %s is a %s in the kernel (%s)", kind, n, setKind(ls), ls.Spec))
			continue
		case strings.HasPrefix(n, "aff-"):
			// An affinity set's elements are the clients seen: state,
			// not programming.
			continue
		}
		out = append(out, elementDrift(kind, n, ps, ls)...)
	}
	for _, n := range slices.Sorted(maps.Keys(l.Sets)) {
		if p.Sets[n] == nil {
			out = append(out, fmt.Sprintf("stale %s %s (in the kernel, not in the plan)", setKind(l.Sets[n]), n))
		}
	}
	return out
}

func setKind(s *nftmodel.Set) string {
	if s.IsMap {
		return "map"
	}
	return "set"
}

// baseText writes a base chain's spec ("" for a regular chain).
func baseText(b *nft.BaseChain) string {
	if b == nil {
		return ""
	}
	return b.String()
}

// ruleDiff names the first rule two chains differ at ("" when the same;
// rules compared as values, see nftmodel.SameRule).
func ruleDiff(planned, live []nft.Rule) string {
	for i := 0; i < max(len(planned), len(live)); i++ {
		switch {
		case i >= len(live):
			return fmt.Sprintf("rule %d is missing: %s", i+1, planned[i])
		case i >= len(planned):
			return fmt.Sprintf("rule %d is not in the plan: %s", i+1, live[i])
		case !nftmodel.SameRule(planned[i], live[i]):
			return fmt.Sprintf("rule %d is %q, planned %q", i+1, live[i], planned[i])
		}
	}
	return ""
}

// elementDrift compares the elements of one set or map (an interval set's
// as the addresses they cover: nft merges them).
func elementDrift(kind, name string, p, l *nftmodel.Set) []string {
	if p.Spec.IsInterval() || l.Spec.IsInterval() {
		pw, pok := nftmodel.Coverage(p)
		lw, lok := nftmodel.Coverage(l)
		switch {
		case pok && lok && pw != lw:
			return []string{fmt.Sprintf("%s %s holds { %s }, planned { %s }", kind, name, lw, pw)}
		case pok && lok:
			return nil
		}
		// Not addresses: element by element.
	}
	var missing, extra, changed []string
	for _, id := range slices.Sorted(maps.Keys(p.Elements)) {
		pe := p.Elements[id]
		le, ok := l.Elements[id]
		switch {
		case !ok:
			missing = append(missing, pe.String())
		case !nftmodel.SameElem(pe, le):
			changed = append(changed, fmt.Sprintf("%s (planned %s)", le, valueText(pe)))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(l.Elements)) {
		if _, ok := p.Elements[id]; !ok {
			extra = append(extra, l.Elements[id].String())
		}
	}
	var out []string
	what := map[string]string{nftables.MapFrontends: "Service frontends", nftables.MapNodePorts: "NodePorts"}[name]
	if what == "" && (strings.Contains(name, "-ip-") || strings.Contains(name, "-np-")) {
		what = "endpoint slots"
	}
	list := func(n int, how string, items []string) {
		if n == 0 {
			return
		}
		shown := items[:min(len(items), maxListed)]
		s := fmt.Sprintf("%s %s: %d element(s) %s", kind, name, n, how)
		if what != "" {
			s = fmt.Sprintf("%s %s (%s): %d element(s) %s", kind, name, what, n, how)
		}
		s += ": " + strings.Join(shown, ", ")
		if len(items) > len(shown) {
			s += fmt.Sprintf(" and %d more", len(items)-len(shown))
		}
		out = append(out, s)
	}
	list(len(missing), "missing (in the plan, not in the kernel)", missing)
	list(len(extra), "not in the plan", extra)
	list(len(changed), "with another value", changed)
	return out
}

// valueText writes a map element's value.
func valueText(e nft.Elem) string {
	if e.Verdict != nil {
		return e.Verdict.String()
	}
	return e.Data.String()
}

// foreignNATHooks notes every base chain of type nat of another table that
// sees this family's new connections (a table of the family, or inet) on
// the prerouting or output hook no later than kproxy's: a DNAT or an
// accept there takes a connection before kproxy's rules see it.
func foreignNATHooks(fam knftables.Family, chains []nftmodel.ListedChain) []string {
	const kproxyPrio = -100 // dstnat, nat-prerouting and nat-output
	var out []string
	for _, c := range chains {
		if c.Type != "nat" || (c.Hook != "prerouting" && c.Hook != "output") {
			continue
		}
		if c.Family != string(fam) && c.Family != "inet" {
			continue
		}
		if c.Family == string(fam) && c.Table == nftables.TableName {
			continue
		}
		where := fmt.Sprintf("table %s %s chain %s (type nat hook %s priority %d)", c.Family, c.Table, c.Name, c.Hook, c.Priority)
		switch {
		case c.Priority < kproxyPrio:
			out = append(out, where+" runs before kproxy's: a DNAT or accept there takes the connection first")
		case c.Priority == kproxyPrio:
			out = append(out, where+" runs at kproxy's priority (which of the two sees a connection first is not defined): a DNAT or accept there may take it first")
		}
	}
	slices.Sort(out)
	return out
}
