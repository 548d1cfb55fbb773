package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/trace"
)

// Trace follows p through the nat and filter tables and returns every
// possible outcome with its probability, in a deterministic order (by
// verdict, a DNAT counting as an accept, then by destination). It errors on
// a jump loop, a jump to a missing chain or a rule the model cannot
// evaluate.
func (rs *Ruleset) Trace(h trace.Host, p trace.Packet) ([]trace.Outcome, error) {
	start := trace.NewState(trace.Host{}, p)
	natHook := "PREROUTING"
	if p.Local {
		natHook = "OUTPUT"
	}
	var out []trace.Outcome
	natRes, err := rs.walkHook(h, "nat", natHook, start)
	if err != nil {
		return nil, err
	}
	for _, nb := range natRes {
		// The stages after the nat hook, in netfilter order: the rest of
		// hook output (its filter chain) for a packet the node sends, then
		// the hooks after the routing decision.
		delivered, hooks := trace.Route(h, p, nb.St.Dst)
		var stages [][2]string
		if p.Local {
			stages = append(stages, [2]string{"filter", "OUTPUT"})
		}
		for _, hk := range hooks {
			stages = append(stages, hookStage[hk])
		}
		cur := []trace.Branch{{St: nb.St}}
		for _, stage := range stages {
			var next []trace.Branch
			for _, b := range cur {
				if b.End.Final() {
					next = append(next, b)
					continue
				}
				res, err := rs.walkHook(h, stage[0], stage[1], b.St)
				if err != nil {
					return nil, err
				}
				next = append(next, res...)
			}
			cur = next
		}
		for _, b := range cur {
			out = append(out, b.Outcome(delivered))
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if ri, rj := verdictRank(out[i].Verdict), verdictRank(out[j].Verdict); ri != rj {
			return ri < rj
		}
		return out[i].Dst.String() < out[j].Dst.String()
	})
	return out, nil
}

// hookStage is the table and built-in chain of a hook after the routing
// decision.
var hookStage = map[string][2]string{
	"forward":     {"filter", "FORWARD"},
	"postrouting": {"nat", "POSTROUTING"},
	"input":       {"filter", "INPUT"},
}

// verdictRank orders outcomes: accepted (DNATed or not), dropped, rejected.
func verdictRank(v trace.Verdict) int {
	switch v {
	case trace.VerdictDrop:
		return 1
	case trace.VerdictReject:
		return 2
	}
	return 0
}

// walkHook evaluates a built-in chain and applies its policy.
func (rs *Ruleset) walkHook(h trace.Host, table, chain string, st trace.State) ([]trace.Branch, error) {
	t := rs.tables[table]
	c := t.chains[chain]
	st.Hook = strings.ToLower(chain)
	res, err := rs.walk(h, t, c, st, 0)
	if err != nil {
		return nil, err
	}
	for i := range res {
		if res[i].End == trace.EndNone && c.Policy == "DROP" {
			res[i].End = trace.EndDrop
		}
	}
	return res, nil
}

// walk evaluates chain c from its first rule. A branch whose End is EndNone
// fell off the end or returned.
func (rs *Ruleset) walk(h trace.Host, t *Table, c *Chain, st trace.State, depth int) ([]trace.Branch, error) {
	if err := trace.CheckDepth(depth, t.Name+"/"+c.Name); err != nil {
		return nil, err
	}
	st.Path = append(st.Path, t.Name+"/"+c.Name)
	return rs.walkFrom(h, t, c, 0, st, depth)
}

// walkFrom evaluates chain c from rule index from: the rule splits the
// state into the part it matches (its target is taken) and the part it does
// not (the next rules see it, recursively).
func (rs *Ruleset) walkFrom(h trace.Host, t *Table, c *Chain, from int, st trace.State, depth int) ([]trace.Branch, error) {
	if from >= len(c.Rules) {
		return []trace.Branch{{St: st}}, nil // fell off the end
	}
	if st.Prob == 0 {
		return nil, nil
	}
	i, r := from, c.Rules[from]
	yes, no, err := r.evaluate(h, st)
	if err != nil {
		return nil, fmt.Errorf("%s/%s rule %d (%s): %w", t.Name, c.Name, i+1, r.Spec, err)
	}
	var out []trace.Branch
	if no != nil {
		rest, err := rs.walkFrom(h, t, c, i+1, *no, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
	}
	if yes == nil {
		return out, nil
	}
	taken, err := rs.take(h, t, c, i, r, *yes, depth)
	if err != nil {
		return nil, err
	}
	return append(taken, out...), nil
}

// take applies r's target to st and continues as netfilter would.
func (rs *Ruleset) take(h trace.Host, t *Table, c *Chain, i int, r *Rule, st trace.State, depth int) ([]trace.Branch, error) {
	tg := r.target
	if tg.name != "" {
		st.AddStep(trace.Step{Table: t.Name, Chain: c.Name, Rule: i + 1, Spec: r.Spec, Target: tg.name})
	}
	switch tg.name {
	case "":
		return rs.walkFrom(h, t, c, i+1, st, depth)
	case "ACCEPT":
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	case "DROP":
		return []trace.Branch{{St: st, End: trace.EndDrop}}, nil
	case "REJECT":
		return []trace.Branch{{St: st, End: trace.EndReject}}, nil
	case "RETURN":
		return []trace.Branch{{St: st}}, nil
	case "DNAT":
		st.Dst = tg.toAddr
		if tg.toPort != 0 {
			st.DstPort = tg.toPort
		}
		st.DNAT = true
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	case "SNAT", "MASQUERADE":
		st.Masq = true
		return []trace.Branch{{St: st, End: trace.EndAccept}}, nil
	case "MARK":
		st.Mark = (st.Mark &^ tg.markMask) ^ tg.markValue
		return rs.walkFrom(h, t, c, i+1, st, depth)
	case "LOG", "CONNMARK":
		return rs.walkFrom(h, t, c, i+1, st, depth)
	}
	sub := t.chains[tg.name]
	if sub == nil {
		return nil, fmt.Errorf("jump to missing chain %s", tg.name)
	}
	res, err := rs.walk(h, t, sub, st, depth+1)
	if err != nil {
		return nil, err
	}
	if tg.isGoto {
		// A goto never comes back here: a RETURN in sub returns to our caller.
		return res, nil
	}
	var out []trace.Branch
	for _, b := range res {
		if b.End != trace.EndNone {
			out = append(out, b)
			continue
		}
		rest, err := rs.walkFrom(h, t, c, i+1, b.St, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
	}
	return out, nil
}

// evaluate returns the state when the rule matches (yes) and when it does not
// (no); either may be nil. Only statistic matches split a state in two.
func (r *Rule) evaluate(h trace.Host, st trace.State) (yes, no *trace.State, err error) {
	p := st.Pkt
	if !r.src.matches(p.Src) || !r.dst.matches(st.Dst) {
		return nil, &st, nil
	}
	if r.proto != "" && r.proto != "all" && (r.proto == p.Proto) == r.protoNeg {
		return nil, &st, nil
	}
	if r.inIface != "" && (p.Local || (strings.TrimSuffix(r.inIface, "+") == p.InIface) == r.inNeg) {
		return nil, &st, nil
	}
	if r.outIface != "" && (r.outIface == p.OutIface) == r.outNeg {
		return nil, &st, nil
	}
	y := st.Clone()
	var split *trace.State // the non-matching share of a statistic match
	for _, m := range r.matches {
		ok := true
		switch m.module {
		case "comment":
		case "tcp", "udp", "sctp", "multiport":
			if m.dports != nil {
				ok = ok && anyPort(m.dports, st.DstPort) != m.neg["dport"]
			}
			if m.sports != nil {
				ok = ok && anyPort(m.sports, p.SrcPort) != m.neg["sport"]
			}
		case "addrtype":
			if m.srcType != "" {
				ok = ok && h.IsLocal(p.Src) != m.neg["--src-type"]
			}
			if m.dstType != "" {
				ok = ok && h.IsLocal(st.Dst) != m.neg["--dst-type"]
			}
		case "mark":
			ok = (st.Mark&m.markMask == m.mark) != m.neg["--mark"]
		case "conntrack":
			ok = hasState(m.states, st.DNAT, st.Masq) != m.neg["--ctstate"]
		case "statistic":
			if m.nth {
				ok = m.nthMatch() != m.neg["--every"]
				break
			}
			if split != nil {
				return nil, nil, fmt.Errorf("more than one statistic match")
			}
			s := y.Clone()
			s.Prob = y.Prob * (1 - m.probability)
			y.Prob *= m.probability
			split = &s
			if s.Prob == 0 {
				split = nil
			}
			ok = y.Prob > 0
		case "cluster":
			ok = m.clusterMatch(p.Src) != m.neg["--cluster-local-nodemask"] != m.neg["--cluster-local-node"]
		case "recent":
			in := h.AffinityHit[m.recentName]
			switch m.recentMode {
			case "set":
				y.AddAffinity(m.recentName)
			case "update", "rcheck":
				ok = in != m.neg["--"+m.recentMode]
			default:
				return nil, nil, fmt.Errorf("recent --%s not modelled", m.recentMode)
			}
		default:
			return nil, nil, fmt.Errorf("match %s not modelled", m.module)
		}
		if !ok {
			// A failed match after a statistic split: both shares fall through.
			return nil, &st, nil
		}
	}
	if split != nil {
		// The statistic match only decides whether the rule applies: the
		// non-matching share continues with the original state.
		rest := st.Clone()
		rest.Prob = split.Prob
		return &y, &rest, nil
	}
	return &y, nil, nil
}

func anyPort(rs []portRange, p uint16) bool {
	for _, r := range rs {
		if r.has(p) {
			return true
		}
	}
	return false
}

// hasState evaluates --ctstate for the first packet of a connection: it is
// NEW, and DNAT/SNAT once a NAT binding of that kind was made.
func hasState(states []string, dnat, snat bool) bool {
	for _, s := range states {
		switch {
		case s == "NEW":
			return true
		case s == "DNAT" && dnat, s == "SNAT" && snat:
			return true
		}
	}
	return false
}
