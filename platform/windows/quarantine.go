package windows

import (
	"net/netip"
	"sort"
	"time"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Backoff of a quarantined object: the first retry after
// QuarantineInitialBackoff, doubling after each rejection up to
// QuarantineMaxBackoff.
const (
	QuarantineInitialBackoff = time.Second
	QuarantineMaxBackoff     = 5 * time.Minute
)

// quarantined is a load balancer slot or an endpoint address HNS rejected
// for good (an error that is neither transient, nor a sign of a stale
// record): it is left out of the plan until retry, and the service ports
// that wanted it are reported (proxy.Quarantiner).
type quarantined struct {
	// lb is the rejected load balancer's slot ("" for an endpoint).
	slot string
	// ip is the rejected endpoint's address (invalid for a load balancer).
	ip netip.Addr
	// want is what HNS rejected: the load balancer's key, or the endpoint
	// spec rendered. A different desire is tried at once.
	want   string
	owners []proxy.ServicePortName
	reason string

	since, retry time.Time
	backoff      time.Duration
}

// rejection is one operation HNS refused for good.
type rejection struct {
	op  *Op
	err error
}

// isRejection reports whether a failed operation is isolated instead of
// failing the sync: creating or updating a load balancer, or creating an
// endpoint, refused with an error that says nothing about HNS's health or
// the record's accuracy.
func isRejection(op *Op, err error) bool {
	switch op.Kind {
	case OpKindCreateLB, OpKindUpdateLB, OpKindCreateEndpoint:
	default:
		return false
	}
	switch ClassOf(err) {
	case ClassOther, ClassNotImplemented:
		return true
	}
	return false
}

func endpointWant(e *EndpointSpec) string {
	return string(e.Role) + " " + e.IP.String() + " pa=" + e.ProviderAddress.String()
}

// held reports whether the quarantine of an entry still applies to this
// desire at now.
func (q *quarantined) held(want string, now time.Time) bool {
	return q.want == want && now.Before(q.retry)
}

// holdQuarantined returns plan without what is held in quarantine at now: a
// held load balancer keeps what HNS has in its slot (the recorded one, so
// nothing is deleted), or is left out when HNS has nothing there; a held
// endpoint is left out of the plan and of every load balancer (one left
// without endpoints is left out too). It returns plan itself when nothing
// is held. It does not modify plan, st or the entries.
func holdQuarantined(plan *Plan, st *State, q map[string]*quarantined, now time.Time) *Plan {
	if len(q) == 0 {
		return plan
	}
	heldEP := make(map[netip.Addr]bool)
	for _, e := range plan.Endpoints {
		if x := q[epQuarantineKey(e.IP)]; x != nil && x.held(endpointWant(e), now) {
			heldEP[e.IP] = true
		}
	}
	var heldLB map[string]bool
	for _, lb := range plan.LoadBalancers {
		if x := q[lbQuarantineKey(lb.slot)]; x != nil && x.held(lb.key, now) {
			if heldLB == nil {
				heldLB = make(map[string]bool)
			}
			heldLB[lb.slot] = true
		}
	}
	if len(heldEP) == 0 && len(heldLB) == 0 {
		return plan
	}
	out := &Plan{Family: plan.Family, Warnings: plan.Warnings, Err: plan.Err}
	have := make(map[netip.Addr]bool, len(plan.Endpoints))
	for _, e := range plan.Endpoints {
		if !heldEP[e.IP] {
			out.Endpoints = append(out.Endpoints, e)
			have[e.IP] = true
		}
	}
	for _, lb := range plan.LoadBalancers {
		if heldLB[lb.slot] {
			cur := st.LoadBalancers[lb.slot]
			if cur == nil || cur.Spec == nil {
				continue
			}
			// Keep what is there, with the endpoints it holds.
			for _, ip := range cur.Spec.Endpoints {
				if ep := st.Endpoints[ip]; ep != nil && ep.Remote && !have[ip] {
					out.Endpoints = append(out.Endpoints, &EndpointSpec{IP: ip, Role: RoleRemote, MAC: ep.MAC, ProviderAddress: ep.ProviderAddress})
					have[ip] = true
				}
			}
			out.LoadBalancers = append(out.LoadBalancers, cur.Spec)
			continue
		}
		if len(heldEP) > 0 {
			keep := make([]netip.Addr, 0, len(lb.Endpoints))
			for _, ip := range lb.Endpoints {
				if !heldEP[ip] {
					keep = append(keep, ip)
				}
			}
			if len(keep) == 0 {
				continue
			}
			if len(keep) != len(lb.Endpoints) {
				c := lb.withEndpoints(keep)
				out.LoadBalancers = append(out.LoadBalancers, c)
				continue
			}
		}
		out.LoadBalancers = append(out.LoadBalancers, lb)
	}
	sort.Slice(out.Endpoints, func(i, j int) bool { return out.Endpoints[i].IP.Less(out.Endpoints[j].IP) })
	return out
}

func lbQuarantineKey(slot string) string   { return "lb " + slot }
func epQuarantineKey(ip netip.Addr) string { return "ep " + ip.String() }

// updateQuarantine records the rejections of a sync that ran to its end
// (plan is the plan before holdQuarantined): a rejected object enters
// quarantine or backs off further; one that was tried and not rejected, or
// that the plan no longer wants, leaves it.
func (b *Backend) updateQuarantine(plan *Plan, rejected []rejection, now time.Time) {
	wantLB := make(map[string]*LBSpec, len(plan.LoadBalancers))
	ownersOf := make(map[netip.Addr][]proxy.ServicePortName)
	for _, lb := range plan.LoadBalancers {
		wantLB[lb.slot] = lb
		for _, ip := range lb.Endpoints {
			for _, o := range lb.Owners {
				if !containsOwner(ownersOf[ip], o) {
					ownersOf[ip] = append(ownersOf[ip], o)
				}
			}
		}
	}
	wantEP := plan.endpointIndex()
	next := make(map[string]*quarantined, len(b.quar))
	// Entries still held carry over untouched.
	for k, x := range b.quar {
		if x.slot != "" {
			if lb := wantLB[x.slot]; lb != nil && x.held(lb.key, now) {
				x.owners = lb.Owners
				next[k] = x
			}
		} else if e := wantEP[x.ip]; e != nil && x.held(endpointWant(e), now) {
			x.owners = ownersOf[x.ip]
			next[k] = x
		}
	}
	for _, r := range rejected {
		var k, want string
		var owners []proxy.ServicePortName
		x := &quarantined{reason: r.err.Error()}
		switch r.op.Kind {
		case OpKindCreateEndpoint:
			e := r.op.Endpoint
			k, want, owners, x.ip = epQuarantineKey(e.IP), endpointWant(e), ownersOf[e.IP], e.IP
		default:
			lb := r.op.LB
			k, want, owners, x.slot = lbQuarantineKey(lb.slot), lb.key, lb.Owners, lb.slot
			if w := wantLB[lb.slot]; w != nil {
				want, owners = w.key, w.Owners // the desire, before endpoints were left out
			}
		}
		x.want, x.owners = want, owners
		x.since, x.backoff = now, QuarantineInitialBackoff
		if old := b.quar[k]; old != nil {
			x.since, x.backoff = old.since, min(2*old.backoff, QuarantineMaxBackoff)
		}
		x.retry = now.Add(x.backoff)
		if b.quar[k] == nil {
			b.log.Info("HNS rejected an object; left out and retried with backoff", "family", b.opts.Family,
				"object", k, "services", ownerNames(owners), "retry", x.backoff, "err", r.err)
		} else {
			b.log.V(2).Info("HNS rejected an object again", "family", b.opts.Family,
				"object", k, "services", ownerNames(owners), "retry", x.backoff, "err", r.err)
		}
		next[k] = x
	}
	for k := range b.quar {
		if next[k] == nil {
			b.log.Info("HNS accepted an object it had rejected, or it is no longer wanted", "family", b.opts.Family, "object", k)
		}
	}
	b.quar = next
	b.publishQuarantine()
}

// quarantineDue reports whether a quarantined object is due for a retry.
func (b *Backend) quarantineDue(now time.Time) bool {
	for _, x := range b.quar {
		if !now.Before(x.retry) {
			return true
		}
	}
	return false
}

// publishQuarantine makes the entries visible to Quarantined. b.mu is held.
func (b *Backend) publishQuarantine() {
	best := make(map[proxy.ServicePortName]proxy.QuarantinedPort)
	for _, x := range b.quar {
		for _, o := range x.owners {
			p, ok := best[o]
			if !ok {
				p = proxy.QuarantinedPort{Name: o, Family: b.opts.Family, Reason: x.reason, Since: x.since, Retry: x.retry}
			} else {
				if x.since.Before(p.Since) {
					p.Since, p.Reason = x.since, x.reason
				}
				if x.retry.After(p.Retry) {
					p.Retry = x.retry
				}
			}
			best[o] = p
		}
	}
	out := make([]proxy.QuarantinedPort, 0, len(best)+len(b.noVIP))
	for _, p := range best {
		out = append(out, p)
	}
	for _, p := range b.noVIP {
		if _, dup := best[p.Name]; !dup {
			out = append(out, p)
		}
	}
	proxy.SortQuarantined(out)
	b.qmu.Lock()
	b.qPublished = out
	b.qmu.Unlock()
}

var _ proxy.Quarantiner = (*Backend)(nil)

// Quarantined lists the service ports whose load balancers (or one of whose
// endpoints) HNS rejected and which the backend leaves out until they are
// accepted. Safe to call while a sync runs.
func (b *Backend) Quarantined() []proxy.QuarantinedPort {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	return append([]proxy.QuarantinedPort(nil), b.qPublished...)
}
