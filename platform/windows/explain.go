package windows

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// HNSExplainer is `kproxy explain`'s tracer for the kernelspace mode: it
// resolves a query over a list of HNS load balancers (Resolve), either the
// backend's plan (planned) or what HNS holds (live, with the drift from the
// plan).
type HNSExplainer struct {
	lbs []*plan.LBSpec
	// dropped are the plan's frontends without endpoints (no load
	// balancer: dropped).
	dropped []plan.Dropped
	drift   []string
	notes   []string
}

var _ explain.Tracer = (*HNSExplainer)(nil)

// Explainer returns a tracer over the plan of the backend's family for the
// intent view v or, with live, over the load balancers HNS holds (the backend needs HNS
// then). Planned without HNS, the network is assumed as in DryRun.
func (b *Backend) Explainer(v *intent.View, live bool) (*HNSExplainer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if live && b.hns == nil {
		return nil, fmt.Errorf("--live needs HNS (on a Windows node)")
	}
	version := hns.Version{Major: 15, Minor: 5}
	network := &hns.Network{Name: b.opts.NetworkName, Type: hns.NetworkTypeL2Bridge}
	var ifaces []HostInterface
	var obs *observed
	if b.hns == nil {
		if b.opts.Offline.Version != nil {
			version = *b.opts.Offline.Version
		}
		if b.opts.Offline.Network != nil {
			network = b.opts.Offline.Network
		}
		ifaces, _ = b.opts.Interfaces() // best effort, as in DryRun
	} else {
		v, err := b.hns.Version()
		if err != nil {
			return nil, fmt.Errorf("asking HNS for its version: %w", err)
		}
		version = v
		if obs, err = b.r.read(); err != nil {
			return nil, err
		}
		network, ifaces = obs.network, obs.ifaces
	}
	var rec *reconcile.State
	if obs != nil {
		rec = obs.state
	}
	p := plan.Build(GatherFacts(&b.opts, hns.CapabilitiesFor(version), network, ifaces, rec, v.Node), v, nil)
	if p.Err != nil {
		return nil, fmt.Errorf("planning %s HNS load balancers: %w", b.opts.Family, p.Err)
	}
	e := &HNSExplainer{lbs: p.LoadBalancers, dropped: p.Dropped}
	for _, w := range p.Warnings {
		e.notes = append(e.notes, fmt.Sprintf("%s: %s", w.Service, w.Message))
	}
	if !live {
		return e, nil
	}
	// What HNS did not say is unknown, as for a backend without a record
	// (reconcile/echo.go): taken as planned, not reported as drift.
	st := reconcile.Adopt(obs.state, obs.evidence, nil, p).Record.State
	kinds := map[string]plan.LBKind{}
	for _, lb := range p.LoadBalancers {
		kinds[lb.Slot()] = lb.Kind
	}
	e.lbs = make([]*plan.LBSpec, 0, len(st.LoadBalancers))
	for _, slot := range reconcile.SortedSlots(st.LoadBalancers) {
		c := *st.LoadBalancers[slot].Spec // HNS does not say why a load balancer exists: the plan's slot does
		c.Kind = kinds[slot]
		e.lbs = append(e.lbs, &c)
	}
	e.drift = HNSDrift(p, st)
	return e, nil
}

// HNSDrift returns one line per difference between a plan and what HNS
// holds: a load balancer missing, different, or in HNS without being
// planned, and load balancers HNS holds that cannot be understood.
func HNSDrift(p *plan.Plan, st *reconcile.State) []string {
	var out []string
	want := map[string]*plan.LBSpec{}
	for _, lb := range p.LoadBalancers {
		want[lb.Slot()] = lb
		have := st.LoadBalancers[lb.Slot()]
		switch {
		case have == nil:
			out = append(out, fmt.Sprintf("missing load balancer %s (%s of %s)", lb.Slot(), lb.Kind, plan.OwnerNames(lb.Owners)))
		case have.Spec.Key() != lb.Key():
			out = append(out, fmt.Sprintf("load balancer %s (%s) differs from the plan: HNS has %q, the plan %q", lb.Slot(), have.ID, have.Spec.Key(), lb.Key()))
		}
	}
	for _, slot := range reconcile.SortedSlots(st.LoadBalancers) {
		if want[slot] == nil {
			out = append(out, fmt.Sprintf("stale load balancer %s (%s): in HNS, not in the plan", slot, st.LoadBalancers[slot].ID))
		}
	}
	for _, o := range st.Orphans {
		out = append(out, fmt.Sprintf("load balancer %s cannot be used by kproxy: %s", o.ID, o.Problem))
	}
	return out
}

// Trace resolves q over the load balancers.
func (e *HNSExplainer) Trace(q explain.Query) (*explain.Trace, error) {
	origin := map[explain.Origin]plan.Origin{explain.FromPod: plan.OriginPod, explain.FromNode: plan.OriginNode, explain.FromOutside: plan.OriginRemote}[q.Origin]
	c := plan.Conn{Protocol: plan.ProtocolNumber(q.Protocol), Src: q.From, Dst: q.To, From: origin, NodeAddrs: q.NodeAddrs}
	r := plan.Resolve(familyLBs(e.lbs, q.Family()), c)
	tr := &explain.Trace{Drift: e.drift, Notes: e.notes}
	for i, why := range r.Reasons {
		s := explain.Step{Where: fmt.Sprintf("HNS step %d", i+1), Why: why}
		if i == len(r.Reasons)-1 || r.LB == nil {
			s.Where = "HNS"
		}
		tr.Path = append(tr.Path, s)
	}
	if r.LB == nil {
		// HNS has no reject: a Service address without a load balancer is
		// not captured, and nothing on the node answers for it.
		for _, d := range e.dropped {
			if d.Matches(c) {
				tr.Targets = []explain.Target{{Verdict: explain.Drop, Probability: 1}}
				tr.Path = append(tr.Path, explain.Step{Where: "HNS", Why: fmt.Sprintf(
					"%s has no usable endpoint, so it has no load balancer (HNS cannot reject): the connection is dropped, not refused", d.Service)})
				break
			}
		}
		return tr, nil
	}
	tr.Path = append(tr.Path, explain.Step{Where: "HNS load balancer", What: lbWhat(r.LB), Why: "the load balancer taking the connection"})
	for _, be := range r.Endpoints {
		p := 1 / float64(len(r.Endpoints))
		if r.Pick.IsValid() {
			p = 0
			if be == r.Pick {
				p = 1
			}
		}
		tr.Targets = append(tr.Targets, explain.Target{Verdict: explain.DNAT, Endpoint: netip.AddrPortFrom(be, r.LB.InternalPort).String(),
			Probability: p, Masquerade: r.SeesNode(c, be)})
	}
	switch {
	case r.Pick.IsValid():
		tr.Algorithm = fmt.Sprintf("source IP hash (session affinity): %s gets %s", q.From, r.Pick)
	case len(r.Endpoints) > 1:
		tr.Algorithm = "HNS spreads new connections over the endpoints (equal weights)"
	}
	return tr, nil
}

func familyLBs(lbs []*plan.LBSpec, fam v1.IPFamily) []*plan.LBSpec {
	v6 := fam == v1.IPv6Protocol
	var out []*plan.LBSpec
	for _, lb := range lbs {
		if (lb.Flags&hns.LBFlagIPv6 != 0) == v6 {
			out = append(out, lb)
		}
	}
	return out
}

func lbWhat(lb *plan.LBSpec) string {
	var flags []string
	if lb.Flags&hns.LBFlagDSR != 0 {
		flags = append(flags, "DSR")
	}
	if lb.PortFlags&hns.PortFlagVIPExternalIP != 0 {
		flags = append(flags, "VIPExternalIP")
	}
	if lb.PortFlags&hns.PortFlagLocalRoutedVIP != 0 {
		flags = append(flags, "LocalRoutedVIP")
	}
	if lb.PortFlags&hns.PortFlagILB != 0 {
		flags = append(flags, "ILB")
	}
	eps := make([]string, 0, len(lb.Endpoints))
	for _, e := range lb.Endpoints {
		eps = append(eps, e.String())
	}
	src := ""
	if lb.SourceVIP.IsValid() {
		src = " sourceVIP=" + lb.SourceVIP.String()
	}
	return fmt.Sprintf("%s -> %d flags=[%s] distribution=%d%s endpoints=[%s]", lb.Slot(), lb.InternalPort, strings.Join(flags, ","), lb.Distribution, src, strings.Join(eps, ","))
}
