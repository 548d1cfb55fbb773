package reconcile

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// OpKind is the kind of an HNS operation.
type OpKind int

// Operation kinds.
const (
	OpKindCreateEndpoint OpKind = iota
	OpKindDeleteEndpoint
	OpKindCreateLB
	OpKindUpdateLB
	OpKindDeleteLB
)

func (k OpKind) String() string {
	switch k {
	case OpKindCreateEndpoint:
		return "create-endpoint"
	case OpKindDeleteEndpoint:
		return "delete-endpoint"
	case OpKindCreateLB:
		return "create-lb"
	case OpKindUpdateLB:
		return "update-lb"
	case OpKindDeleteLB:
		return "delete-lb"
	}
	return "unknown"
}

// Op is one HNS operation of a reconciliation.
type Op struct {
	Kind OpKind
	// LB is the load balancer to create, or the new content of one to update.
	LB *plan.LBSpec
	// Old is the load balancer to update or delete.
	Old *ObservedLB
	// Endpoint is the endpoint to create.
	Endpoint *plan.EndpointSpec
	// OldEndpoint is the endpoint to delete.
	OldEndpoint *ObservedEndpoint
	// Why explains the operation, for logs and tests.
	Why string
	// Replacing marks the deletion of an endpoint that is created again
	// (with other settings) later in the same reconciliation.
	Replacing bool
}

func (o Op) String() string {
	switch o.Kind {
	case OpKindCreateEndpoint:
		return fmt.Sprintf("%s %s %s (%s)", o.Kind, o.Endpoint.Role, o.Endpoint.IP, o.Why)
	case OpKindDeleteEndpoint:
		return fmt.Sprintf("%s %s (%s)", o.Kind, o.OldEndpoint.IP, o.Why)
	case OpKindCreateLB:
		return fmt.Sprintf("%s %s (%s)", o.Kind, o.LB.Key(), o.Why)
	case OpKindUpdateLB:
		return fmt.Sprintf("%s %s (%s)", o.Kind, o.LB.Key(), o.Why)
	default:
		if o.Old.Spec != nil {
			return fmt.Sprintf("%s %s (%s)", o.Kind, o.Old.Spec.Key(), o.Why)
		}
		return fmt.Sprintf("%s %s (%s)", o.Kind, o.Old.ID, o.Why)
	}
}

// Reconciliation is the ordered list of operations that turns a state into a
// plan, with what could not be honoured.
//
// Order: (0) load balancers that may block a creation: orphans whose slot
// cannot be told (malformed, partly created: they may hold any port), and
// load balancers nothing wants that share the family, protocol and
// external port of one this reconciliation creates (HNS may refuse a
// frontend on their port); (1) load balancers and endpoints that must be
// deleted before an endpoint is recreated (rare: a provider address
// changed); (2) endpoint creations; (3) load balancer creations and
// updates, slot by slot (a replacement deletes the old load balancer just
// before creating the new one, since HNS holds one per slot, and orphans in
// a wanted slot go first too); (4) deletion of the other load balancers
// nothing wants (added before deleted); (5) deletion of owned endpoints
// nothing references.
type Reconciliation struct {
	Ops []Op
	// MissingLocal are local endpoint addresses that load balancers want but
	// HNS does not have (the CNI has not created them, or they are host
	// network addresses); they are left out of the load balancers.
	MissingLocal []netip.Addr
	// Dropped are desired load balancers left with no endpoint at all.
	Dropped []*plan.LBSpec
}

// Empty reports whether nothing needs to be done.
func (r *Reconciliation) Empty() bool { return len(r.Ops) == 0 }

// String renders the operations one per line.
func (r *Reconciliation) String() string {
	var b strings.Builder
	for _, op := range r.Ops {
		b.WriteString(op.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Counts returns the number of operations per kind.
func (r *Reconciliation) Counts() map[OpKind]int {
	m := make(map[OpKind]int)
	for _, op := range r.Ops {
		m[op.Kind]++
	}
	return m
}

// Reconcile computes the operations that make st match plan. With modify set,
// a load balancer whose content changed is updated in place; otherwise it is
// deleted and created again. Reconcile does not modify plan or st.
func Reconcile(p *plan.Plan, st *State, modify bool) *Reconciliation {
	r := &Reconciliation{}
	desiredEP := p.EndpointIndex()
	var phase0, phase1, phase2, phase3, phase4, phase5 []Op

	// Endpoints: create the missing, replace the remote ones whose provider
	// address changed. Addresses whose endpoint will be (re)created have no
	// usable ID yet.
	fresh := make(map[netip.Addr]bool)
	for _, spec := range p.Endpoints {
		cur := st.Endpoints[spec.IP]
		switch {
		case cur == nil:
			phase2 = append(phase2, Op{Kind: OpKindCreateEndpoint, Endpoint: spec, Why: "missing"})
			fresh[spec.IP] = true
		case !cur.matches(spec):
			phase1 = append(phase1, Op{Kind: OpKindDeleteEndpoint, OldEndpoint: cur, Replacing: true,
				Why: fmt.Sprintf("provider address %s, want %s", cur.ProviderAddress, spec.ProviderAddress)})
			phase2 = append(phase2, Op{Kind: OpKindCreateEndpoint, Endpoint: spec, Why: "replaces " + cur.ID})
			fresh[spec.IP] = true
		}
	}

	// Load balancers whose endpoints are about to be replaced go first.
	gone := make(map[string]bool) // slots deleted in phase 1
	if len(phase1) > 0 {
		replacedIDs := make(map[string]bool, len(phase1))
		for _, op := range phase1 {
			replacedIDs[op.OldEndpoint.ID] = true
		}
		for _, slot := range SortedSlots(st.LoadBalancers) {
			cur := st.LoadBalancers[slot]
			for _, id := range cur.EndpointIDs {
				if replacedIDs[id] {
					gone[slot] = true
					phase1 = append(phase1, Op{Kind: OpKindDeleteLB, Old: cur, Why: "endpoint " + id + " is replaced"})
					break
				}
			}
		}
		// Deleting the load balancers must precede deleting the endpoints.
		sort.SliceStable(phase1, func(i, j int) bool {
			return phase1[i].Kind == OpKindDeleteLB && phase1[j].Kind != OpKindDeleteLB
		})
	}

	// Orphans in a slot kproxy wants must go before the slot is programmed.
	orphansIn := make(map[string][]*ObservedLB)
	for _, o := range st.Orphans {
		if o.Slot != "" {
			orphansIn[o.Slot] = append(orphansIn[o.Slot], o)
		}
	}
	handled := make(map[*ObservedLB]bool)

	// Load balancers, slot by slot.
	desiredSlots := make(map[string]bool, len(p.LoadBalancers))
	missing := make(map[netip.Addr]bool)
	kept := make([]*plan.LBSpec, 0, len(p.LoadBalancers))
	for _, want := range p.LoadBalancers {
		if cur := st.LoadBalancers[want.Slot()]; cur != nil && cur.Spec == want && cur.gen == st.idGen && !gone[want.Slot()] && len(orphansIn[want.Slot()]) == 0 {
			// Recorded from this very spec, and no address has changed
			// endpoint since: nothing to do (the common case, made cheap).
			desiredSlots[want.Slot()] = true
			kept = append(kept, want)
			continue
		}
		cur := st.LoadBalancers[want.Slot()]
		if gone[want.Slot()] {
			cur = nil
		}
		want, current := resolve(want, cur, desiredEP, st, fresh, missing)
		if len(want.Endpoints) == 0 {
			r.Dropped = append(r.Dropped, want)
			continue
		}
		desiredSlots[want.Slot()] = true
		kept = append(kept, want)
		for _, o := range orphansIn[want.Slot()] {
			phase3 = append(phase3, Op{Kind: OpKindDeleteLB, Old: o, Why: o.Problem})
			handled[o] = true
		}
		switch {
		case cur == nil:
			phase3 = append(phase3, Op{Kind: OpKindCreateLB, LB: want, Why: "missing"})
		case current:
			// In place and identical: nothing to do.
		case modify:
			phase3 = append(phase3, Op{Kind: OpKindUpdateLB, LB: want, Old: cur, Why: changeWhy(cur, want)})
		default:
			phase3 = append(phase3,
				Op{Kind: OpKindDeleteLB, Old: cur, Why: "replaced: " + changeWhy(cur, want)},
				Op{Kind: OpKindCreateLB, LB: want, Why: "replaces " + cur.ID})
		}
	}

	// Load balancers nothing wants: those that share a port with a creation
	// go first, the others last.
	created := make(map[portKey]bool)
	for _, op := range phase3 {
		if op.Kind == OpKindCreateLB || op.Kind == OpKindUpdateLB {
			created[portOf(op.LB)] = true
		}
	}
	var stale []string
	for slot := range st.LoadBalancers {
		if !desiredSlots[slot] && !gone[slot] {
			stale = append(stale, slot)
		}
	}
	sort.Strings(stale)
	for _, slot := range stale {
		old := st.LoadBalancers[slot]
		if old.Spec != nil && created[portOf(old.Spec)] {
			phase0 = append(phase0, Op{Kind: OpKindDeleteLB, Old: old, Why: "stale, on the port of a load balancer to create"})
			continue
		}
		phase4 = append(phase4, Op{Kind: OpKindDeleteLB, Old: old, Why: "stale"})
	}
	for _, o := range st.Orphans {
		switch {
		case handled[o]:
		case o.Slot == "":
			phase0 = append(phase0, Op{Kind: OpKindDeleteLB, Old: o, Why: o.Problem + "; it may hold any port"})
		case o.Spec != nil && created[portOf(o.Spec)]:
			phase0 = append(phase0, Op{Kind: OpKindDeleteLB, Old: o, Why: o.Problem + "; on the port of a load balancer to create"})
		default:
			phase4 = append(phase4, Op{Kind: OpKindDeleteLB, Old: o, Why: o.Problem})
		}
	}

	// Owned endpoints nothing references (the references are only worked out
	// when some owned endpoint is not wanted).
	var unused []netip.Addr
	for ip, ep := range st.Endpoints {
		if desiredEP[ip] == nil && ep.Owned() {
			unused = append(unused, ip)
		}
	}
	if len(unused) > 0 {
		referenced := make(map[netip.Addr]bool)
		for _, lb := range kept {
			for _, ip := range lb.Endpoints {
				referenced[ip] = true
			}
		}
		sort.Slice(unused, func(i, j int) bool { return unused[i].Less(unused[j]) })
		for _, ip := range unused {
			if !referenced[ip] {
				phase5 = append(phase5, Op{Kind: OpKindDeleteEndpoint, OldEndpoint: st.Endpoints[ip], Why: "unused"})
			}
		}
	}
	for _, ep := range st.Shadowed {
		if ep.Owned() {
			phase5 = append(phase5, Op{Kind: OpKindDeleteEndpoint, OldEndpoint: ep, Why: "duplicate address"})
		}
	}

	for ip := range missing {
		r.MissingLocal = append(r.MissingLocal, ip)
	}
	sort.Slice(r.MissingLocal, func(i, j int) bool { return r.MissingLocal[i].Less(r.MissingLocal[j]) })
	n := len(phase0) + len(phase1) + len(phase2) + len(phase3) + len(phase4) + len(phase5)
	if n > 0 {
		r.Ops = make([]Op, 0, n)
		for _, ph := range [][]Op{phase0, phase1, phase2, phase3, phase4, phase5} {
			r.Ops = append(r.Ops, ph...)
		}
	}
	return r
}

// resolve drops the endpoints of want that will not exist (local addresses
// for which HNS has no local endpoint; they are added to missing) and reports
// whether cur holds exactly the result, with the endpoint IDs the addresses
// have now. It returns want itself when nothing is dropped. One pass, two map
// lookups per endpoint: this runs for every load balancer of a full plan.
func resolve(want *plan.LBSpec, cur *ObservedLB, desiredEP map[netip.Addr]*plan.EndpointSpec, st *State,
	fresh, missing map[netip.Addr]bool) (*plan.LBSpec, bool) {
	current := cur != nil && len(cur.EndpointIDs) <= len(want.Endpoints)
	var drop []int
	for i, ip := range want.Endpoints {
		ep := st.Endpoints[ip]
		if ep == nil || ep.Remote {
			if desiredEP[ip] == nil { // a local address HNS lacks
				missing[ip] = true
				drop = append(drop, i)
				continue
			}
		}
		if !current {
			continue
		}
		// Unique addresses with unique IDs: with equal lengths (checked at
		// the end), every ID present means equal sets.
		if ep == nil || (len(fresh) > 0 && fresh[ip]) {
			current = false
			continue
		}
		if j := sort.SearchStrings(cur.EndpointIDs, ep.ID); j == len(cur.EndpointIDs) || cur.EndpointIDs[j] != ep.ID {
			current = false
		}
	}
	if len(drop) > 0 {
		keep := make([]netip.Addr, 0, len(want.Endpoints)-len(drop))
		for i, ip := range want.Endpoints {
			if len(drop) > 0 && drop[0] == i {
				drop = drop[1:]
				continue
			}
			keep = append(keep, ip)
		}
		want = want.WithEndpoints(keep)
	}
	return want, current && len(cur.EndpointIDs) == len(want.Endpoints) && cur.Spec.Key() == want.Key()
}

func changeWhy(cur *ObservedLB, want *plan.LBSpec) string {
	if cur.Spec.Key() == want.Key() {
		return "endpoint IDs changed"
	}
	return "content changed"
}

// portKey is what HNS may refuse to share between two load balancers
// whatever their frontend VIPs: family, protocol and external port.
type portKey struct {
	v6    bool
	proto uint32
	port  uint16
}

func portOf(s *plan.LBSpec) portKey {
	return portKey{s.Flags&hns.LBFlagIPv6 != 0, s.Protocol, s.ExternalPort}
}

// SortedSlots returns the keys of m, sorted.
func SortedSlots(m map[string]*ObservedLB) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
