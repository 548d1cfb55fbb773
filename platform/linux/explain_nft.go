package linux

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/trace"
)

// NFTExplainer is `kproxy explain`'s tracer for the nftables mode: it
// follows a query through a Model of kproxy's table with nft's tracer,
// holding either kproxy's plan applied to an empty nftmodel.Fake (planned) or
// the table read back from the kernel (live, with the drift from the plan).
type NFTExplainer struct {
	cfg   facts.Config
	model *nftmodel.Model
	tr    *nftmodel.Tracer
	host  trace.Host
	drift []string
	notes []string
}

var _ explain.Tracer = (*NFTExplainer)(nil)

// plannedNFTPlan renders a full sync of v (a full View of cfg's family),
// as NFTBackend.DryRun does.
func plannedNFTPlan(cfg facts.Config, v *intent.View) (*nftables.Plan, error) {
	rd, err := nftables.NewRenderer(cfg)
	if err != nil {
		return nil, err
	}
	in := nftables.Input{Full: true, Node: nftFacts(cfg, v.Node, v.LocalAddrs), Ports: map[proxy.ServicePortName]*intent.Port{}}
	for _, p := range v.Sorted() {
		in.Ports[p.Name] = p
	}
	plan, _ := rd.Render(in, nil)
	return plan, nil
}

// plannedNFT applies plannedNFTPlan to an empty Fake: the table kproxy
// would hold.
func plannedNFT(cfg facts.Config, v *intent.View) (*nftmodel.Model, error) {
	plan, err := plannedNFTPlan(cfg, v)
	if err != nil {
		return nil, err
	}
	f := nftmodel.NewFake(nftables.Family(cfg.Family), nftables.TableName)
	if err := f.Run(context.Background(), plan.Tx); err != nil {
		return nil, fmt.Errorf("applying the plan to the nftables model: %w", err)
	}
	return f.Model(), nil
}

func newNFTExplainer(cfg facts.Config, m *nftmodel.Model, local []netip.Addr) (*NFTExplainer, error) {
	if m == nil {
		m = &nftmodel.Model{Chains: map[string]*nftmodel.Chain{}, Sets: map[string]*nftmodel.Set{}}
	}
	tr, err := nftmodel.NewTracer(nftables.Family(cfg.Family), m)
	if err != nil {
		return nil, fmt.Errorf("reading kproxy's nftables table for tracing: %w", err)
	}
	return &NFTExplainer{cfg: cfg, model: m, tr: tr, host: trace.Host{LocalAddrs: local}}, nil
}

// PlannedNFT returns a tracer over kproxy's plan of v (a full View of
// cfg.Family, with the node's local addresses).
func PlannedNFT(cfg facts.Config, v *intent.View) (*NFTExplainer, error) {
	m, err := plannedNFT(cfg, v)
	if err != nil {
		return nil, err
	}
	return newNFTExplainer(cfg, m, v.LocalAddrs)
}

// NFTLive is what was read from a node for a live explanation.
type NFTLive struct {
	// Table is `nft -j list table FAMILY kproxy` (nil: the table does not
	// exist).
	Table []byte
	// Chains is `nft -j list chains`: the base chains of every table, for
	// the other tables' hooks (nil: not read).
	Chains []byte
}

// LiveNFT returns a tracer over kproxy's table as read from the node, with
// a line for every difference from kproxy's plan of v and a note for
// every other table's NAT chain that sees connections before kproxy's.
func LiveNFT(cfg facts.Config, v *intent.View, in NFTLive) (*NFTExplainer, error) {
	fam := nftables.Family(cfg.Family)
	var l nftmodel.Listing
	if in.Table != nil {
		read, err := nftmodel.ParseJSON(fam, nftables.TableName, in.Table)
		if err != nil {
			return nil, fmt.Errorf("reading nft -j list table %s %s: %w", fam, nftables.TableName, err)
		}
		l = *read
	}
	var hooks []nftmodel.ListedChain
	if in.Chains != nil {
		var err error
		if hooks, err = nftmodel.ParseChains(in.Chains); err != nil {
			return nil, fmt.Errorf("reading nft -j list chains: %w", err)
		}
	}
	return liveNFT(cfg, v, l, hooks)
}

// liveNFT is LiveNFT over a table already read (l.Model nil: no table).
func liveNFT(cfg facts.Config, v *intent.View, l nftmodel.Listing, hooks []nftmodel.ListedChain) (*NFTExplainer, error) {
	planned, err := plannedNFT(cfg, v)
	if err != nil {
		return nil, err
	}
	e, err := newNFTExplainer(cfg, l.Model, v.LocalAddrs)
	if err != nil {
		return nil, err
	}
	fam := nftables.Family(cfg.Family)
	e.drift = NFTDrift(fam, planned, l.Model, l.Unreadable)
	e.notes = foreignNATHooks(fam, hooks)
	return e, nil
}

// Model returns the table the explainer traces (for tests and tools).
func (e *NFTExplainer) Model() *nftmodel.Model { return e.model }

// podIface is the interface a pod's packets arrive on, when pods are told
// apart by interface (detect-local BridgeInterface or InterfaceNamePrefix).
func (e *NFTExplainer) podIface() string {
	switch e.cfg.LocalDetect {
	case facts.LocalBridgeInterface:
		return e.cfg.LocalInterface
	case facts.LocalInterfaceNamePrefix:
		return e.cfg.LocalInterface + "0"
	}
	return ""
}

// Trace follows the first packet of q through kproxy's table.
func (e *NFTExplainer) Trace(q explain.Query) (*explain.Trace, error) {
	pkt := trace.Packet{Src: q.From, Dst: q.To.Addr(), Proto: strings.ToLower(string(q.Protocol)),
		SrcPort: 40000, DstPort: q.To.Port(), Local: q.Origin == explain.FromNode}
	tr := &explain.Trace{Drift: e.drift, Notes: append([]string(nil), e.notes...)}
	if q.Origin == explain.FromPod {
		if iface := e.podIface(); iface != "" {
			pkt.InIface = iface
			tr.Decisions = append(tr.Decisions, fmt.Sprintf("detect-local %s: a pod's packets arrive on %s", e.cfg.LocalDetect, iface))
		}
	}
	outs, err := e.tr.Trace(e.host, pkt)
	if err != nil {
		return nil, err
	}
	dnats := 0
	for _, o := range outs {
		t := explain.Target{Probability: o.Probability, Masquerade: o.Masquerade}
		switch o.Verdict {
		case trace.VerdictDNAT:
			t.Verdict, t.Endpoint = explain.DNAT, o.Dst.String()
			dnats++
		case trace.VerdictReject:
			t.Verdict = explain.Reject
		case trace.VerdictDrop:
			t.Verdict = explain.Drop
		case trace.VerdictUnknown:
			t.Verdict = explain.Unknown
			tr.Notes = appendOnce(tr.Notes, "the packet meets a rule kproxy does not write and the tracer cannot read (see the drift): what happens from there is not simulated")
		default:
			t.Verdict = explain.NotHandled
		}
		tr.Targets = mergeTarget(tr.Targets, t)
	}
	tr.Algorithm = nftAlgorithm(outs, dnats)
	tr.Path = nftPath(e.model, outs)
	if len(outs) > 0 && !touchesNFTServices(outs) {
		tr.Notes = append(tr.Notes, "no rule of kproxy's services chain sees this packet: kproxy's table does not handle it (or its entry chains are missing)")
	}
	return tr, nil
}

// touchesNFTServices reports whether some outcome went through the
// services chain (the dispatch).
func touchesNFTServices(outs []trace.Outcome) bool {
	for _, o := range outs {
		for _, s := range o.Path {
			if strings.HasPrefix(s, nftables.ChainServices+" #") {
				return true
			}
		}
	}
	return false
}

// nftAlgorithm names how one endpoint is picked, from the rules the
// outcomes took.
func nftAlgorithm(outs []trace.Outcome, dnats int) string {
	var all strings.Builder
	for _, o := range outs {
		for _, s := range o.Path {
			all.WriteString(s)
			all.WriteByte('\n')
		}
	}
	p := all.String()
	var alg string
	switch {
	case strings.Contains(p, "jhash "):
		alg = "source hash (jhash of the client's address over 32 slots): this client always gets the endpoint shown"
	case strings.Contains(p, "numgen inc "):
		alg = "round robin (numgen inc): new connections take the endpoints in turn; the chances shown are over one rotation"
	case strings.Contains(p, "numgen random mod 2147483648 <"):
		alg = "least connection: each endpoint is drawn at random with its weight (fewer connections, more weight)"
	case dnats > 1:
		alg = "random (numgen random), each new connection independently"
	}
	if strings.Contains(p, "update @aff-") && alg != "" {
		alg += "; a client in an endpoint's affinity set goes back to it"
	}
	return alg
}

// nftPath lists the steps every outcome took in common, each outcome's own
// steps (the endpoint choice, a verdict), then the steps every outcome took
// after them.
func nftPath(m *nftmodel.Model, outs []trace.Outcome) []explain.Step {
	if len(outs) == 0 {
		return nil
	}
	if len(outs) == 1 {
		var path []explain.Step
		for _, s := range outs[0].Path {
			path = append(path, nftStep(m, s, ""))
		}
		return path
	}
	first := outs[0].Path
	pre, suf := len(first), len(first)
	for _, o := range outs[1:] {
		n := 0
		for n < pre && n < len(o.Path) && o.Path[n] == first[n] {
			n++
		}
		pre = n
		k := 0
		for k < suf && k < len(o.Path) && o.Path[len(o.Path)-1-k] == first[len(first)-1-k] {
			k++
		}
		suf = k
	}
	for _, o := range outs {
		suf = min(suf, len(o.Path)-pre)
	}
	var path []explain.Step
	for _, s := range first[:pre] {
		path = append(path, nftStep(m, s, ""))
	}
	for _, o := range outs {
		fate := string(o.Verdict)
		switch o.Verdict {
		case trace.VerdictDNAT:
			fate = o.Dst.String()
		case trace.VerdictAccept:
			fate = "not handled"
		case trace.VerdictUnknown:
			fate = "not simulated"
		}
		for _, s := range o.Path[pre : len(o.Path)-suf] {
			path = append(path, nftStep(m, s, fmt.Sprintf("[%.1f%% → %s] ", 100*o.Probability, fate)))
		}
	}
	for _, s := range first[len(first)-suf:] {
		path = append(path, nftStep(m, s, ""))
	}
	return path
}

// stepRef reads "chain #N: rest" or "chain: rest" (a tracer path step).
var stepRef = regexp.MustCompile(`^(\S+?)(?: #(\d+))?: (.*)$`)

// nftStep turns one step of the tracer's path into an explain step: where
// (chain and rule), what (the rule) and why (in words).
func nftStep(m *nftmodel.Model, s, prefix string) explain.Step {
	sm := stepRef.FindStringSubmatch(s)
	if sm == nil {
		return explain.Step{Where: prefix + "?", Why: s}
	}
	chain, rest := sm[1], sm[3]
	if sm[2] == "" {
		// Entering a base chain, or its policy.
		return explain.Step{Where: prefix + chain, Why: baseReason(chain, rest)}
	}
	n, _ := strconv.Atoi(sm[2])
	where := fmt.Sprintf("%s%s rule %d", prefix, chain, n)
	rule, opaque := "", false
	if c := m.Chains[chain]; c != nil && n >= 1 && n <= len(c.Rules) {
		rule, opaque = c.Rules[n-1].String(), nftmodel.IsOpaque(c.Rules[n-1])
	}
	detail, isRule := strings.CutPrefix(rest, rule)
	if rule == "" || !isRule {
		// A note on one match of the rule (a random draw).
		return explain.Step{Where: where, What: rule, Why: matchReason(rest)}
	}
	if opaque {
		return explain.Step{Where: where, What: rule, Why: "a rule kproxy does not write, which the tracer cannot read: not simulated from here"}
	}
	return explain.Step{Where: where, What: rule, Why: nftRuleReason(chain, rule, strings.TrimPrefix(detail, ": "))}
}

func baseReason(chain, rest string) string {
	if strings.Contains(rest, "policy drop") {
		return "end of the base chain, whose policy is drop"
	}
	// "hook prerouting (type nat, priority -100)"
	hook := strings.NewReplacer(" (", ", ", ")", "").Replace(rest)
	switch chain {
	case nftables.ChainNATPrerouting:
		return "kproxy's entry for arriving connections (" + hook + ")"
	case nftables.ChainNATOutput:
		return "kproxy's entry for connections the node opens (" + hook + ")"
	case nftables.ChainNATPostrouting:
		return "after routing: kproxy's masquerading (" + hook + ")"
	case nftables.ChainFilterForward, nftables.ChainFilterInput:
		return "kproxy's filter chain (" + hook + ")"
	}
	return "a base chain kproxy does not write (" + hook + ")"
}

// matchReason words a note the tracer makes on one match of a rule ("numgen
// random mod 3 0: p 1/3", "...: no match, next rule").
func matchReason(note string) string {
	m, rest, _ := strings.Cut(note, ": ")
	no := strings.HasSuffix(rest, ": no match, next rule")
	rest = strings.TrimSuffix(rest, ": no match, next rule")
	switch {
	case strings.HasPrefix(m, "numgen random mod 2147483648 <"):
		if no {
			return "the weighted draw (" + rest + ") passes this endpoint: next rule"
		}
		return "the weighted draw (" + rest + ") picks this endpoint"
	case strings.HasPrefix(m, "numgen inc"):
		if no {
			return "round robin: not this endpoint's turn (" + rest + "): next rule"
		}
		return "round robin: this endpoint's turn (" + rest + ")"
	case strings.HasPrefix(m, "numgen random"):
		if no {
			return "the random draw (" + rest + ") passes this endpoint: next rule"
		}
		return "the random draw (" + rest + ") picks this endpoint"
	}
	if no {
		return m + " does not match (" + rest + "): next rule"
	}
	return m + " matches (" + rest + ")"
}

// ruleVerdict returns the verdict a rule ends with ("goto x", "drop", ...).
func ruleVerdict(rule string) string {
	f := strings.Fields(rule)
	if n := len(f); n >= 2 && (f[n-2] == "goto" || f[n-2] == "jump") {
		return f[n-2] + " " + f[n-1]
	}
	if n := len(f); n >= 1 {
		return f[n-1]
	}
	return ""
}

// sharedDNAT matches the names of the shared DNAT chains.
var sharedDNAT = regexp.MustCompile(`^dnat-(cluster|local)-(ip|np)-(tcp|udp|sctp)-(hash|r[0-9]+)$`)

// targetReason words where a verdict sends a packet.
func targetReason(v string) string {
	kind, chain, _ := strings.Cut(v, " ")
	if kind != "goto" && kind != "jump" {
		switch v {
		case "drop":
			return "dropped"
		case "accept":
			return "accepted"
		case "return":
			return "back to the calling chain"
		}
		return v
	}
	set := "the cluster-wide endpoints"
	if strings.HasPrefix(chain, "dnat-local-") || strings.Contains(chain, "-eps-local-") {
		set = "this node's endpoints"
	}
	switch {
	case chain == nftables.ChainReject:
		return "to reject-chain: the Service has no usable endpoint"
	case chain == nftables.ChainMarkMasq:
		return "marked for masquerade"
	case chain == nftables.ChainServices, chain == nftables.ChainMasquerading:
		return "to kproxy's " + chain + " chain"
	case sharedDNAT.MatchString(chain) && strings.HasSuffix(chain, "-hash"):
		return "to " + chain + ": one of " + set + " by source hash"
	case sharedDNAT.MatchString(chain):
		n := chain[strings.LastIndex(chain, "-r")+2:]
		return fmt.Sprintf("to %s: one of %s (%s) at random", chain, set, n)
	case strings.HasPrefix(chain, "masq-"):
		who := map[string]string{"all": "every client", "nonpod": "clients that are not pods", "mixed": "some clients"}[strings.Split(chain, "-")[1]]
		return "to " + chain + ": " + who + " masqueraded, then the endpoints"
	case strings.HasPrefix(chain, "split-"):
		return "to " + chain + ": pods, the node and other clients go different ways"
	case strings.Contains(chain, "-eps-"):
		return "to the port's own chain picking one of " + set + " (affinity, round robin or least connection)"
	case strings.Contains(chain, "-fw-"):
		return "to the port's loadBalancerSourceRanges firewall"
	case strings.Contains(chain, "-route-"):
		return "to the port's own route chain (pods, the node and other clients go different ways)"
	}
	return "to chain " + chain
}

// missKey is the key of a lookup that found nothing ("K not in @m, next
// rule").
func missKey(detail string) string {
	k, _, _ := strings.Cut(detail, " not in @")
	return k
}

// whoReason words the client match in front of a route rule.
func whoReason(rule string) string {
	switch {
	case strings.Contains(rule, "saddr != @"+nftables.SetPodCIDRs):
		return "the client is not a pod (outside the pod CIDRs)"
	case strings.Contains(rule, "saddr @"+nftables.SetPodCIDRs):
		return "the client is a pod (in the pod CIDRs)"
	case strings.Contains(rule, "fib saddr type != local"):
		return "the client is not this node"
	case strings.Contains(rule, "fib saddr type local"):
		return "the client is this node"
	case strings.Contains(rule, "iifname != "):
		return "the client does not arrive on the pods' interface"
	case strings.Contains(rule, "iifname "):
		return "the client arrives on the pods' interface"
	}
	return ""
}

// nftRuleReason says in words what a rule of kproxy's table did, from its
// chain, text and what the tracer found (detail: the key looked up and the
// element found, or nothing).
func nftRuleReason(chain, rule, detail string) string {
	switch {
	case strings.Contains(rule, "vmap @"+nftables.MapFrontends):
		if key, v, ok := strings.Cut(detail, " → "); ok {
			if v == "drop" {
				return fmt.Sprintf("dispatch: %s is a Service frontend in map frontends → drop: no endpoint for this traffic (a Local traffic policy without local endpoints)", key)
			}
			return fmt.Sprintf("dispatch: %s is a Service frontend in map frontends → %s", key, targetReason(v))
		}
		return "dispatch: " + missKey(detail) + " is no Service frontend (not in map frontends): next rule"
	case strings.Contains(rule, "vmap @"+nftables.MapNodePorts):
		if key, v, ok := strings.Cut(detail, " → "); ok {
			return fmt.Sprintf("the destination is a NodePort address: %s is a NodePort in map nodeports → %s", key, targetReason(v))
		}
		return "NodePorts: " + missKey(detail) + " is no NodePort (not in map nodeports): next rule"
	case strings.HasPrefix(rule, "dnat ") && strings.Contains(rule, " map @"):
		m := rule[strings.LastIndex(rule, "@")+1:]
		if key, ep, ok := strings.Cut(detail, " → "); ok {
			return fmt.Sprintf("DNAT to %s: the endpoint in slot %s of map %s", ep, key, m)
		}
		return "no endpoint in slot " + missKey(detail) + " of map " + m + ": the rule does not apply, next rule"
	case strings.Contains(rule, " dnat ") || strings.HasPrefix(rule, "dnat "):
		why := "DNAT to " + rule[strings.LastIndex(rule, " ")+1:]
		if strings.Contains(rule, "update @aff-") {
			why += "; records the client in this endpoint's affinity set"
		}
		if strings.Contains(rule, "saddr @aff-") {
			why = "session affinity: the client is in this endpoint's affinity set; " + why
		}
		return why
	case rule == "jump "+nftables.ChainServices:
		return "kproxy's entry: to the services chain (one lookup in the frontend maps)"
	case rule == "jump "+nftables.ChainMasquerading:
		return "to kproxy's masquerading chain"
	case strings.HasSuffix(rule, "jump "+nftables.ChainMarkMasq):
		if who := whoReason(rule); who != "" {
			return who + ": marked for masquerade"
		}
		return "every client of this frontend is masqueraded: marked for masquerade"
	case strings.HasPrefix(rule, "meta mark set meta mark |"):
		return "the connection's mark: masquerade it in postrouting"
	case strings.Contains(rule, "@"+nftables.SetHairpin) && strings.Contains(rule, "masquerade"):
		return "a pod reaching itself through a Service (hairpin): source masqueraded"
	case strings.HasPrefix(rule, "meta mark &") && strings.HasSuffix(rule, "return"):
		return "not marked for masquerade: the source is kept"
	case strings.HasPrefix(rule, "meta mark set meta mark ^") && strings.Contains(rule, "masquerade"):
		return "marked: the mark is cleared and the source masqueraded"
	case chain == nftables.ChainReject && strings.Contains(rule, "tcp reset"):
		return "rejected with a TCP reset: the Service has no usable endpoint"
	case chain == nftables.ChainReject && rule == "reject":
		return "rejected with an ICMP port unreachable: the Service has no usable endpoint"
	case strings.HasPrefix(rule, "ct state invalid"):
		return "a packet conntrack finds invalid is dropped"
	case strings.Contains(rule, "127.0.0.0/8") && strings.HasSuffix(rule, "drop"):
		return "localhost guard: a packet to 127.0.0.0/8 from elsewhere that was not DNATed is dropped"
	case strings.Contains(rule, "saddr != {") && strings.HasSuffix(rule, "drop"):
		return "loadBalancerSourceRanges: the client is not in the allowed ranges: dropped"
	case strings.Contains(chain, "-fw-"):
		return "loadBalancerSourceRanges: the client is allowed: " + targetReason(ruleVerdict(rule))
	}
	v := ruleVerdict(rule)
	if who := whoReason(rule); who != "" {
		return who + ": " + targetReason(v)
	}
	if rule == v {
		if v == "drop" && (strings.HasPrefix(chain, "split-") || strings.Contains(chain, "-route-")) {
			return "no endpoint for this traffic (a Local traffic policy without local endpoints): dropped"
		}
		return targetReason(v)
	}
	return "rule taken: " + targetReason(v)
}
