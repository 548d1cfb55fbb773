package linux

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
	"github.com/kproxy/kproxy/platform/linux/trace"
)

// IptablesExplainer is `kproxy explain`'s tracer for the iptables mode: it
// follows a query through an in-memory model of the nat and filter tables,
// holding either kproxy's plan applied to empty tables (planned) or what
// iptables-save printed (live, with the drift from the plan).
type IptablesExplainer struct {
	rs    *iptmodel.Ruleset
	host  trace.Host
	drift []string
}

var _ explain.Tracer = (*IptablesExplainer)(nil)

// plannedRuleset plans a full sync of v and applies it to empty tables, as
// the applier applies it to the kernel: the restore input, then the jumps
// at the top of the built-in chains.
func plannedRuleset(cfg facts.Config, v *intent.View) (*iptmodel.Ruleset, []iptables.Jump, error) {
	p, err := iptables.NewPlanner(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("iptables planner: %w", err)
	}
	plan := p.Plan(iptables.Input{View: v, Full: true})
	rs := iptmodel.New()
	if err := rs.Restore(plan.Restore, true); err != nil {
		return nil, nil, fmt.Errorf("applying the plan to the iptables model: %w", err)
	}
	for i := len(plan.Jumps) - 1; i >= 0; i-- {
		j := plan.Jumps[i]
		if err := rs.Insert(j.Table, j.Chain, 1, j.Spec...); err != nil {
			return nil, nil, fmt.Errorf("inserting the jump %s/%s %v into the model: %w", j.Table, j.Chain, j.Spec, err)
		}
	}
	return rs, plan.Jumps, nil
}

// PlannedIptables returns a tracer over kproxy's plan of v (a full View of
// cfg.Family, with the node's local addresses).
func PlannedIptables(cfg facts.Config, v *intent.View) (*IptablesExplainer, error) {
	rs, _, err := plannedRuleset(cfg, v)
	if err != nil {
		return nil, err
	}
	return &IptablesExplainer{rs: rs, host: trace.Host{LocalAddrs: v.LocalAddrs}}, nil
}

// LiveIptables returns a tracer over save, the iptables-save output of the nat
// and filter tables of cfg.Family, with a line for every difference from
// kproxy's plan of v.
func LiveIptables(cfg facts.Config, v *intent.View, save []byte) (*IptablesExplainer, error) {
	live, err := iptmodel.Parse(save)
	if err != nil {
		return nil, fmt.Errorf("reading iptables-save output: %w", err)
	}
	planned, jumps, err := plannedRuleset(cfg, v)
	if err != nil {
		return nil, err
	}
	return &IptablesExplainer{rs: live, host: trace.Host{LocalAddrs: v.LocalAddrs}, drift: IptablesDrift(planned, live, jumps)}, nil
}

// Trace follows the first packet of q through the tables.
func (e *IptablesExplainer) Trace(q explain.Query) (*explain.Trace, error) {
	pkt := trace.Packet{Src: q.From, Dst: q.To.Addr(), Proto: strings.ToLower(string(q.Protocol)),
		SrcPort: 40000, DstPort: q.To.Port(), Local: q.Origin == explain.FromNode}
	outs, err := e.rs.Trace(e.host, pkt)
	if err != nil {
		return nil, err
	}
	tr := &explain.Trace{Drift: e.drift}
	dnats := 0
	affinity := false
	for _, o := range outs {
		t := explain.Target{Probability: o.Probability, Masquerade: o.Masquerade}
		byKproxy := decidedByKproxy(o)
		switch {
		case (o.Verdict == trace.VerdictReject || o.Verdict == trace.VerdictDrop) && !byKproxy && !o.DNAT:
			// The host's own rules (a FORWARD policy of DROP, say) decide
			// the fate of a packet kproxy does not handle.
			t.Verdict = explain.NotHandled
			tr.Notes = appendOnce(tr.Notes, fmt.Sprintf("kproxy does not handle it; the host's own rules then %s it (%s)", strings.ToLower(string(o.Verdict)), lastStep(o)))
		case o.Verdict == trace.VerdictReject:
			t.Verdict = explain.Reject
		case o.Verdict == trace.VerdictDrop:
			t.Verdict = explain.Drop
		case o.DNAT:
			t.Verdict = explain.DNAT
			t.Endpoint = o.Dst.String()
			dnats++
		default:
			t.Verdict = explain.NotHandled
		}
		affinity = affinity || len(o.AffinitySets) > 0
		tr.Targets = mergeTarget(tr.Targets, t)
	}
	if dnats > 1 {
		tr.Algorithm = "random (iptables statistic match), each new connection independently"
		if affinity {
			tr.Algorithm += "; a client recorded in an affinity list goes back to its endpoint"
		}
	}
	tr.Path = iptablesPath(outs)
	if len(outs) > 0 && !touchesKproxy(outs) {
		tr.Notes = append(tr.Notes, "no kproxy chain sees this packet: kproxy does not handle this address (or its jumps are missing)")
	}
	return tr, nil
}

// decidedByKproxy reports whether a DROP or REJECT of o comes from a rule
// of a kproxy chain (kproxy's own REJECT and DROP rules, in KPROXY-FIREWALL).
func decidedByKproxy(o trace.Outcome) bool {
	for _, st := range o.Steps {
		if iptables.Owned(st.Chain) && (st.Target == "DROP" || st.Target == "REJECT") {
			return true
		}
	}
	return false
}

// lastStep names where a packet's fate was decided: the last rule taken, or
// the policy of the last chain.
func lastStep(o trace.Outcome) string {
	if n := len(o.Steps); n > 0 && (o.Steps[n-1].Target == "DROP" || o.Steps[n-1].Target == "REJECT") {
		st := o.Steps[n-1]
		return fmt.Sprintf("%s/%s rule %d: %s", st.Table, st.Chain, st.Rule, st.Spec)
	}
	if n := len(o.Path); n > 0 {
		return o.Path[n-1] + " policy"
	}
	return "policy"
}

func appendOnce(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

func mergeTarget(ts []explain.Target, t explain.Target) []explain.Target {
	for i := range ts {
		if ts[i].Verdict == t.Verdict && ts[i].Endpoint == t.Endpoint && ts[i].Masquerade == t.Masquerade {
			ts[i].Probability += t.Probability
			return ts
		}
	}
	return append(ts, t)
}

func touchesKproxy(outs []trace.Outcome) bool {
	for _, o := range outs {
		for _, p := range o.Path {
			if iptables.Owned(p[strings.IndexByte(p, '/')+1:]) {
				return true
			}
		}
	}
	return false
}

// iptablesPath lists the rules every outcome took in common, each
// outcome's own rules (the endpoint choice, a verdict), then the rules every
// outcome took after them.
func iptablesPath(outs []trace.Outcome) []explain.Step {
	if len(outs) == 0 {
		return nil
	}
	if len(outs) == 1 {
		var path []explain.Step
		for _, s := range outs[0].Steps {
			path = append(path, stepOf(s, ""))
		}
		return path
	}
	first := outs[0].Steps
	pre, suf := len(first), len(first)
	for _, o := range outs[1:] {
		n := 0
		for n < pre && n < len(o.Steps) && o.Steps[n] == first[n] {
			n++
		}
		pre = n
		m := 0
		for m < suf && m < len(o.Steps) && o.Steps[len(o.Steps)-1-m] == first[len(first)-1-m] {
			m++
		}
		suf = m
	}
	for _, o := range outs {
		suf = min(suf, len(o.Steps)-pre)
	}
	var path []explain.Step
	for _, s := range first[:pre] {
		path = append(path, stepOf(s, ""))
	}
	for _, o := range outs {
		fate := strings.ToLower(string(o.Verdict))
		if o.DNAT {
			fate = o.Dst.String()
		}
		for _, s := range o.Steps[pre : len(o.Steps)-suf] {
			path = append(path, stepOf(s, fmt.Sprintf("[%.1f%% → %s] ", 100*o.Probability, fate)))
		}
	}
	for _, s := range first[len(first)-suf:] {
		path = append(path, stepOf(s, ""))
	}
	return path
}

func stepOf(s trace.Step, prefix string) explain.Step {
	return explain.Step{
		Where: fmt.Sprintf("%s%s/%s rule %d", prefix, s.Table, s.Chain, s.Rule),
		What:  "-A " + s.Chain + " " + s.Spec,
		Why:   ruleReason(s),
	}
}

// ruleReason says in words what a rule kproxy writes does, from its chain,
// target and matches.
func ruleReason(s trace.Step) string {
	args, _ := syntax.Split(s.Spec)
	svc := argAfter(args, "--comment")
	of := ""
	if svc != "" {
		of = " of " + svc
	}
	builtin := !iptables.Owned(s.Chain)
	switch {
	case builtin && iptables.Owned(s.Target):
		return "kproxy's jump from the built-in chain into " + s.Target
	case builtin:
		return "a rule that is not kproxy's, in a built-in chain (target " + s.Target + ")"
	case !iptables.Owned(s.Chain):
		return "not kproxy's rule"
	}
	t := s.Target
	switch {
	case strings.HasPrefix(t, "KPROXY-SVC-"):
		return "frontend" + of + " matched: to the cluster-wide endpoints"
	case strings.HasPrefix(t, "KPROXY-SVL-"):
		return "frontend" + of + ": to this node's endpoints only (traffic policy Local)"
	case strings.HasPrefix(t, "KPROXY-EXT-"):
		return "external frontend" + of + " matched: to its external traffic policy chain"
	case strings.HasPrefix(t, "KPROXY-FW-"):
		return "LoadBalancer IP" + of + " matched: to its loadBalancerSourceRanges firewall"
	case strings.HasPrefix(t, "KPROXY-SH-"):
		return "to the shard of Service frontends holding this destination"
	case strings.HasPrefix(t, "KPROXY-NP-"):
		return "to the shard of NodePorts holding this port"
	case t == iptables.ChainNodePorts:
		return "no Service IP matched and the destination is a local address: look for a NodePort"
	case t == iptables.ChainReject:
		return "no usable endpoint" + of + ": marked to be rejected (in filter)"
	case t == iptables.ChainDrop:
		return "no endpoint for this traffic" + of + ": marked to be dropped (in filter)"
	case t == iptables.ChainOffCluster:
		return "check whether the source is inside the cluster"
	case t == iptables.ChainHairpin:
		return "the connection was DNATed: check for a pod reaching itself (hairpin)"
	case t == iptables.ChainPostrouting, t == iptables.ChainFirewall, t == iptables.ChainServices:
		return "to kproxy's " + t + " chain"
	case t == "DNAT":
		why := "DNAT to " + argAfter(args, "--to-destination")
		if p := argAfter(args, "--probability"); p != "" {
			why += fmt.Sprintf(" when the random draw (probability %s of what is left) picks it", p)
		}
		if slices.Contains(args, "--set") {
			why += "; records the client in this endpoint's affinity list"
		}
		return why
	case t == "MARK" && slices.Contains(args, "--rcheck"), t == "MARK" && slices.Contains(args, "--update"):
		return "session affinity: a client seen within the timeout keeps its endpoint"
	case t == "MARK":
		switch s.Chain {
		case iptables.ChainReject:
			return "marked for REJECT"
		case iptables.ChainDrop:
			return "marked for DROP"
		case iptables.ChainOffCluster:
			return "source outside the cluster CIDRs: marked for masquerade"
		case iptables.ChainPostrouting:
			return "masquerade mark cleared before masquerading"
		}
		if strings.HasPrefix(s.Chain, "KPROXY-EXT-") {
			return "external traffic with policy Cluster (or from this node): marked for masquerade"
		}
		return "marked for masquerade"
	case t == "MASQUERADE" || t == "SNAT":
		if s.Chain == iptables.ChainHairpin {
			return "a pod reaching itself through the Service: source masqueraded"
		}
		return "the connection was marked: source masqueraded"
	case t == "RETURN":
		if s.Chain == iptables.ChainOffCluster {
			return "source inside the cluster: not masqueraded"
		}
		return "back to the calling chain"
	case t == "ACCEPT":
		return "accepted"
	case t == "REJECT":
		return "rejected: the Service has no usable endpoint"
	case t == "DROP":
		return "dropped"
	case strings.HasPrefix(t, iptables.Prefix):
		return "to kproxy's chain " + t
	}
	return "target " + t
}

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// Save renders the tables the explainer traces as iptables-save would (nat
// then filter), for tests and tools.
func (e *IptablesExplainer) Save() string {
	return e.rs.Save(iptables.TableNAT) + e.rs.Save(iptables.TableFilter)
}
