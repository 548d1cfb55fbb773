package windows

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// Backoff of a quarantined object: the first retry after
// QuarantineInitialBackoff, doubling after each rejection up to
// QuarantineMaxBackoff.
const (
	QuarantineInitialBackoff = time.Second
	QuarantineMaxBackoff     = 5 * time.Minute
)

// quarantined is a load balancer slot or an endpoint address HNS refused
// for good (an error that is neither transient nor, after one listing, a
// conflict with the record): it is left out of the plan until its retry, and
// the service ports that wanted it are reported (proxy.Quarantiner).
type quarantined struct {
	// slot is the refused load balancer's slot ("" for an endpoint).
	slot string
	// ip is the refused endpoint's address (invalid for a load balancer).
	ip netip.Addr
	// sourceVIP: the endpoint is the overlay network's source VIP; while it
	// is held, so is every load balancer that uses it.
	sourceVIP bool
	// want is what HNS refused: the load balancer's key, or the endpoint
	// spec rendered. A different desire is tried at once.
	want   string
	owners []proxy.ServicePortName
	reason string

	since, retry time.Time
	backoff      time.Duration
}

// held reports whether the quarantine of an entry still applies to this
// desire at now.
func (q *quarantined) held(want string, now time.Time) bool {
	return q.want == want && now.Before(q.retry)
}

func endpointWant(e *plan.EndpointSpec) string {
	return string(e.Role) + " " + e.IP.String() + " pa=" + e.ProviderAddress.String()
}

func lbQuarantineKey(slot string) string   { return "lb " + slot }
func epQuarantineKey(ip netip.Addr) string { return "ep " + ip.String() }

// quarantine is the backend's bookkeeping of what HNS refused, and what it
// publishes for Quarantined (which must not wait for a sync).
type quarantine struct {
	family v1.IPFamily
	log    klog.Logger
	// entries by object (lbQuarantineKey, epQuarantineKey); owned by the
	// sync (Backend.mu).
	entries map[string]*quarantined
	// noVIP lists the ports left out while an overlay network has no
	// source VIP (nil when it has one).
	noVIP []proxy.QuarantinedPort

	mu        sync.Mutex
	published []proxy.QuarantinedPort
}

// held returns, for the plan p at now, the load balancer slots and endpoint
// addresses held in quarantine. A held source VIP endpoint holds every load
// balancer that uses the source VIP.
func (q *quarantine) held(p *plan.Plan, now time.Time) (map[string]bool, map[netip.Addr]bool) {
	if len(q.entries) == 0 {
		return nil, nil
	}
	var heldLB map[string]bool
	heldEP := make(map[netip.Addr]bool)
	var vips []netip.Addr
	for _, e := range p.Endpoints {
		if x := q.entries[epQuarantineKey(e.IP)]; x != nil && x.held(endpointWant(e), now) {
			heldEP[e.IP] = true
			if e.Role == plan.RoleSourceVIP {
				vips = append(vips, e.IP)
			}
		}
	}
	for _, lb := range p.LoadBalancers {
		x := q.entries[lbQuarantineKey(lb.Slot())]
		if (x != nil && x.held(lb.Key(), now)) || (lb.SourceVIP.IsValid() && containsAddr(vips, lb.SourceVIP)) {
			if heldLB == nil {
				heldLB = make(map[string]bool)
			}
			heldLB[lb.Slot()] = true
		}
	}
	return heldLB, heldEP
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}

// update records the refusals of a sync that ran to its end (p is the plan
// before Hold): a refused object enters quarantine or backs off further; one
// that was tried and not refused, or that the plan no longer wants, leaves
// it.
func (q *quarantine) update(p *plan.Plan, refused []reconcile.Rejection, now time.Time) {
	wantLB := make(map[string]*plan.LBSpec, len(p.LoadBalancers))
	ownersOf := make(map[netip.Addr][]proxy.ServicePortName)
	addOwners := func(ip netip.Addr, owners []proxy.ServicePortName) {
		for _, o := range owners {
			if !plan.ContainsOwner(ownersOf[ip], o) {
				ownersOf[ip] = append(ownersOf[ip], o)
			}
		}
	}
	for _, lb := range p.LoadBalancers {
		wantLB[lb.Slot()] = lb
		for _, ip := range lb.Endpoints {
			addOwners(ip, lb.Owners)
		}
		if lb.SourceVIP.IsValid() {
			addOwners(lb.SourceVIP, lb.Owners) // the source VIP's load balancers depend on it
		}
	}
	wantEP := p.EndpointIndex()
	next := make(map[string]*quarantined, len(q.entries))
	// Entries still held carry over untouched.
	for k, x := range q.entries {
		if x.slot != "" {
			if lb := wantLB[x.slot]; lb != nil && x.held(lb.Key(), now) {
				x.owners = lb.Owners
				next[k] = x
			}
		} else if e := wantEP[x.ip]; e != nil && x.held(endpointWant(e), now) {
			x.owners = ownersOf[x.ip]
			next[k] = x
		}
	}
	for _, r := range refused {
		var k, want string
		var owners []proxy.ServicePortName
		x := &quarantined{reason: r.Err.Error()}
		switch r.Op.Kind {
		case reconcile.OpKindCreateEndpoint:
			e := r.Op.Endpoint
			k, want, owners, x.ip = epQuarantineKey(e.IP), endpointWant(e), ownersOf[e.IP], e.IP
			if e.Role == plan.RoleSourceVIP {
				x.sourceVIP = true
				x.reason = fmt.Sprintf("HNS refused the source VIP endpoint %s, so no overlay load balancer using it is programmed: %v", e.IP, r.Err)
			}
		default:
			lb := r.Op.LB
			k, want, owners, x.slot = lbQuarantineKey(lb.Slot()), lb.Key(), lb.Owners, lb.Slot()
			if w := wantLB[lb.Slot()]; w != nil {
				want, owners = w.Key(), w.Owners // the desire, before endpoints were left out
			}
		}
		x.want, x.owners = want, owners
		x.since, x.backoff = now, QuarantineInitialBackoff
		if old := q.entries[k]; old != nil {
			x.since, x.backoff = old.since, min(2*old.backoff, QuarantineMaxBackoff)
		}
		x.retry = now.Add(x.backoff)
		if q.entries[k] == nil {
			q.log.Info("HNS refused an object; left out and retried with backoff", "family", q.family,
				"object", k, "services", plan.OwnerNames(owners), "retry", x.backoff, "err", r.Err)
		} else {
			q.log.V(2).Info("HNS refused an object again", "family", q.family,
				"object", k, "services", plan.OwnerNames(owners), "retry", x.backoff, "err", r.Err)
		}
		next[k] = x
	}
	for k := range q.entries {
		if next[k] == nil {
			q.log.Info("HNS accepted an object it had refused, or it is no longer wanted", "family", q.family, "object", k)
		}
	}
	q.entries = next
	q.publish()
}

// due reports whether a quarantined object is due for a retry.
func (q *quarantine) due(now time.Time) bool {
	for _, x := range q.entries {
		if !now.Before(x.retry) {
			return true
		}
	}
	return false
}

// publish makes the entries visible to Quarantined.
func (q *quarantine) publish() {
	best := make(map[proxy.ServicePortName]proxy.QuarantinedPort)
	for _, x := range q.entries {
		for _, o := range x.owners {
			p, ok := best[o]
			if !ok {
				p = proxy.QuarantinedPort{Name: o, Family: q.family, Reason: x.reason, Since: x.since, Retry: x.retry}
			} else {
				if x.since.Before(p.Since) || (x.sourceVIP && !x.since.After(p.Since)) {
					p.Since, p.Reason = x.since, x.reason
				}
				if x.retry.After(p.Retry) {
					p.Retry = x.retry
				}
			}
			best[o] = p
		}
	}
	out := make([]proxy.QuarantinedPort, 0, len(best)+len(q.noVIP))
	for _, p := range best {
		out = append(out, p)
	}
	for _, p := range q.noVIP {
		if _, dup := best[p.Name]; !dup {
			out = append(out, p)
		}
	}
	proxy.SortQuarantined(out)
	q.mu.Lock()
	q.published = out
	q.mu.Unlock()
}

var _ proxy.Quarantiner = (*Backend)(nil)

// Quarantined lists the service ports whose load balancers (or one of whose
// endpoints, or the source VIP endpoint they use) HNS refused and which the
// backend leaves out until they are accepted. Safe to call while a sync runs.
func (b *Backend) Quarantined() []proxy.QuarantinedPort {
	b.q.mu.Lock()
	defer b.q.mu.Unlock()
	return append([]proxy.QuarantinedPort(nil), b.q.published...)
}
