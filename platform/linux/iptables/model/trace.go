package model

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Packet is the first packet of a new connection, as the tracer sees it.
type Packet struct {
	Src, Dst netip.Addr
	// Proto is "tcp", "udp" or "sctp".
	Proto            string
	SrcPort, DstPort uint16
	// Local is true for a packet sent by a process on this host (it
	// traverses OUTPUT), false for one arriving on an interface (PREROUTING).
	Local bool
	// InIface and OutIface name the interfaces for -i/-o matches (optional).
	InIface, OutIface string
}

// String renders the packet for messages.
func (p Packet) String() string {
	where := "arriving"
	if p.Local {
		where = "local"
	}
	return fmt.Sprintf("%s %s %s -> %s", where, p.Proto,
		netip.AddrPortFrom(p.Src, p.SrcPort), netip.AddrPortFrom(p.Dst, p.DstPort))
}

// Host holds the facts about the host that rules can match on.
type Host struct {
	// LocalAddrs are the addresses assigned to the host's interfaces
	// (-m addrtype LOCAL). Loopback addresses are always local.
	LocalAddrs []netip.Addr
	// Recent holds, per "-m recent" list name, the source addresses in the
	// list (the model ignores timeouts).
	Recent map[string][]netip.Addr
}

func (h Host) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(h.LocalAddrs, a)
}

// Verdict is the fate of a traced packet.
type Verdict string

// Verdicts.
const (
	Accept Verdict = "accept"
	Reject Verdict = "reject"
	Drop   Verdict = "drop"
)

// Outcome is one possible fate of a traced packet.
type Outcome struct {
	// Probability of this outcome, from statistic rules (1 when there are none).
	Probability float64
	Verdict     Verdict
	// Dst is the destination after DNAT (the original one when not DNATed).
	Dst netip.AddrPort
	// DNAT tells whether the destination was rewritten.
	DNAT bool
	// Masquerade tells whether the source is masqueraded (or SNATed) in nat
	// POSTROUTING (never for an arriving packet delivered locally).
	Masquerade bool
	// Delivered is "local" (INPUT) or "forward" (FORWARD) or "out" (a local
	// packet to a remote destination).
	Delivered string
	// Mark is the packet mark after all tables.
	Mark uint32
	// RecentSet lists the recent lists the source was added to.
	RecentSet []string
	// Path lists the chains traversed, "table/chain", in order.
	Path []string
	// Steps lists, in order, every rule whose target was taken (a jump, a
	// verdict, a mark, a NAT).
	Steps []Step
}

// Step is one rule a traced packet matched and whose target it took.
type Step struct {
	Table, Chain string
	// Rule is the rule's position in its chain, from 1.
	Rule int
	// Spec is the rule's text after "-A CHAIN ".
	Spec string
	// Target is the rule's target (a built-in target or a chain).
	Target string
}

// String renders an outcome for messages.
func (o Outcome) String() string {
	s := fmt.Sprintf("%.3f %s %s", o.Probability, o.Verdict, o.Dst)
	if o.Masquerade {
		s += " masq"
	}
	return s
}

// state is one branch of a trace.
type state struct {
	pkt       Packet
	prob      float64
	mark      uint32
	dnat      bool
	dstPort   uint16
	masq      bool
	recentSet []string
	path      []string
	steps     []Step
}

func (s state) clone() state {
	s.recentSet = slices.Clone(s.recentSet)
	s.path = slices.Clone(s.path)
	s.steps = slices.Clone(s.steps)
	return s
}

// terminal verdicts inside one table walk.
const (
	vNone   = ""
	vAccept = "ACCEPT"
	vDrop   = "DROP"
	vReject = "REJECT"
)

type branch struct {
	st      state
	verdict string
}

const maxDepth = 64

// Trace follows p through the nat and filter tables and returns every
// possible outcome with its probability, in a deterministic order. It errors
// on a jump loop, a jump to a missing chain or a rule the model cannot
// evaluate.
func (rs *Ruleset) Trace(h Host, p Packet) ([]Outcome, error) {
	start := state{pkt: p, prob: 1, dstPort: p.DstPort}
	natHook := "PREROUTING"
	if p.Local {
		natHook = "OUTPUT"
	}
	var out []Outcome
	natRes, err := rs.walkHook(h, "nat", natHook, start)
	if err != nil {
		return nil, err
	}
	for _, nb := range natRes {
		local := h.isLocal(nb.st.pkt.Dst)
		// The stages after the nat hook, in netfilter order.
		var stages [][2]string
		delivered := "forward"
		switch {
		case p.Local && local:
			stages = [][2]string{{"filter", "OUTPUT"}, {"nat", "POSTROUTING"}, {"filter", "INPUT"}}
			delivered = "local"
		case p.Local:
			stages = [][2]string{{"filter", "OUTPUT"}, {"nat", "POSTROUTING"}}
			delivered = "out"
		case local:
			stages = [][2]string{{"filter", "INPUT"}}
			delivered = "local"
		default:
			stages = [][2]string{{"filter", "FORWARD"}, {"nat", "POSTROUTING"}}
		}
		cur := []branch{{st: nb.st}}
		for _, stage := range stages {
			var next []branch
			for _, b := range cur {
				if b.verdict == vDrop || b.verdict == vReject {
					next = append(next, b)
					continue
				}
				res, err := rs.walkHook(h, stage[0], stage[1], b.st)
				if err != nil {
					return nil, err
				}
				next = append(next, res...)
			}
			cur = next
		}
		for _, b := range cur {
			v := Accept
			switch b.verdict {
			case vDrop:
				v = Drop
			case vReject:
				v = Reject
			}
			out = append(out, Outcome{
				Probability: b.st.prob, Verdict: v,
				Dst: netip.AddrPortFrom(b.st.pkt.Dst, b.st.dstPort), DNAT: b.st.dnat,
				Masquerade: b.st.masq, Delivered: delivered,
				Mark: b.st.mark, RecentSet: b.st.recentSet, Path: b.st.path, Steps: b.st.steps,
			})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Verdict != out[j].Verdict {
			return out[i].Verdict < out[j].Verdict
		}
		return out[i].Dst.String() < out[j].Dst.String()
	})
	return out, nil
}

// walkHook evaluates a built-in chain and applies its policy.
func (rs *Ruleset) walkHook(h Host, table, chain string, st state) ([]branch, error) {
	t := rs.tables[table]
	c := t.chains[chain]
	res, err := rs.walk(h, t, c, st, 0)
	if err != nil {
		return nil, err
	}
	for i := range res {
		if res[i].verdict == vNone && c.Policy == "DROP" {
			res[i].verdict = vDrop
		}
	}
	return res, nil
}

// walk evaluates chain c from its first rule. A branch whose verdict is vNone
// fell off the end or returned.
func (rs *Ruleset) walk(h Host, t *Table, c *Chain, st state, depth int) ([]branch, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("jump depth over %d at %s/%s (loop?)", maxDepth, t.Name, c.Name)
	}
	st.path = append(st.path, t.Name+"/"+c.Name)
	return rs.walkFrom(h, t, c, 0, st, depth)
}

// walkFrom evaluates chain c from rule index from: the rule splits the
// state into the part it matches (its target is taken) and the part it does
// not (the next rules see it, recursively).
func (rs *Ruleset) walkFrom(h Host, t *Table, c *Chain, from int, st state, depth int) ([]branch, error) {
	if from >= len(c.Rules) {
		return []branch{{st: st}}, nil // fell off the end
	}
	if st.prob == 0 {
		return nil, nil
	}
	i, r := from, c.Rules[from]
	yes, no, err := r.evaluate(h, st)
	if err != nil {
		return nil, fmt.Errorf("%s/%s rule %d (%s): %w", t.Name, c.Name, i+1, r.Spec, err)
	}
	var out []branch
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
func (rs *Ruleset) take(h Host, t *Table, c *Chain, i int, r *Rule, st state, depth int) ([]branch, error) {
	tg := r.target
	if tg.name != "" {
		st.steps = append(slices.Clip(st.steps), Step{Table: t.Name, Chain: c.Name, Rule: i + 1, Spec: r.Spec, Target: tg.name})
	}
	switch tg.name {
	case "":
		return rs.walkFrom(h, t, c, i+1, st, depth)
	case "ACCEPT":
		return []branch{{st: st, verdict: vAccept}}, nil
	case "DROP":
		return []branch{{st: st, verdict: vDrop}}, nil
	case "REJECT":
		return []branch{{st: st, verdict: vReject}}, nil
	case "RETURN":
		return []branch{{st: st}}, nil
	case "DNAT":
		st.pkt.Dst = tg.toAddr
		if tg.toPort != 0 {
			st.dstPort = tg.toPort
		}
		st.dnat = true
		return []branch{{st: st, verdict: vAccept}}, nil
	case "SNAT", "MASQUERADE":
		st.masq = true
		return []branch{{st: st, verdict: vAccept}}, nil
	case "MARK":
		st.mark = (st.mark &^ tg.markMask) ^ tg.markValue
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
	var out []branch
	for _, b := range res {
		if b.verdict != vNone {
			out = append(out, b)
			continue
		}
		rest, err := rs.walkFrom(h, t, c, i+1, b.st, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, rest...)
	}
	return out, nil
}

// evaluate returns the state when the rule matches (yes) and when it does not
// (no); either may be nil. Only statistic matches split a state in two.
func (r *Rule) evaluate(h Host, st state) (yes, no *state, err error) {
	p := st.pkt
	if !r.src.matches(p.Src) || !r.dst.matches(p.Dst) {
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
	y := st.clone()
	var split *state // the non-matching share of a statistic match
	for _, m := range r.matches {
		ok := true
		switch m.module {
		case "comment":
		case "tcp", "udp", "sctp", "multiport":
			if m.dports != nil {
				ok = ok && anyPort(m.dports, st.dstPort) != m.neg["dport"]
			}
			if m.sports != nil {
				ok = ok && anyPort(m.sports, p.SrcPort) != m.neg["sport"]
			}
		case "addrtype":
			if m.srcType != "" {
				ok = ok && h.isLocal(p.Src) != m.neg["--src-type"]
			}
			if m.dstType != "" {
				ok = ok && h.isLocal(p.Dst) != m.neg["--dst-type"]
			}
		case "mark":
			ok = (st.mark&m.markMask == m.mark) != m.neg["--mark"]
		case "conntrack":
			ok = hasState(m.states, st.dnat, st.masq) != m.neg["--ctstate"]
		case "statistic":
			if m.nth {
				ok = m.nthMatch() != m.neg["--every"]
				break
			}
			if split != nil {
				return nil, nil, fmt.Errorf("more than one statistic match")
			}
			s := y.clone()
			s.prob = y.prob * (1 - m.probability)
			y.prob *= m.probability
			split = &s
			if s.prob == 0 {
				split = nil
			}
			ok = y.prob > 0
		case "cluster":
			ok = m.clusterMatch(p.Src) != m.neg["--cluster-local-nodemask"] != m.neg["--cluster-local-node"]
		case "recent":
			in := slices.Contains(h.Recent[m.recentName], p.Src)
			switch m.recentMode {
			case "set":
				y.recentSet = append(y.recentSet, m.recentName)
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
		rest := st.clone()
		rest.prob = split.prob
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
