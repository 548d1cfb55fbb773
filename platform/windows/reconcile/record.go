package reconcile

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// Record is what the backend knows of HNS for one IP family and network:
// the state (what HNS holds, by slot and by address), what kproxy sent for
// each object it created or adopted (the fields HNS may not return), and
// what it learned about how HNS echoes fields (echo.go).
//
// It is the "last applied" of the render contract: Reconcile renders the
// operations against a record, Apply runs them and returns the next record,
// built from the answers of the calls that succeeded, and the backend keeps
// that one. Neither changes the record it is given.
type Record struct {
	State *State
	Sent  Sent
	Echo  Echoes
}

// NewRecord returns the record of a state kproxy sent nothing for.
func NewRecord(st *State) *Record {
	return &Record{State: st, Sent: Sent{LBs: map[string]*plan.LBSpec{}, EPs: map[string]SentEndpoint{}}}
}

// Sent is what kproxy sent for the objects it created, updated or adopted,
// by lower-case HNS ID.
type Sent struct {
	LBs map[string]*plan.LBSpec
	EPs map[string]SentEndpoint
}

// SentEndpoint is what kproxy sent for an endpoint it created (or adopted).
type SentEndpoint struct {
	IP              netip.Addr
	Remote          bool
	Name            string
	MAC             string
	ProviderAddress netip.Addr
}

// SentFrom is what kproxy sends to create spec.
func SentFrom(spec *plan.EndpointSpec) SentEndpoint {
	return SentEndpoint{IP: spec.IP, Remote: spec.Remote(), Name: spec.Name(), MAC: spec.MAC, ProviderAddress: spec.ProviderAddress}
}

func sentFromObserved(ep *ObservedEndpoint) SentEndpoint {
	return SentEndpoint{IP: ep.IP, Remote: ep.Remote, Name: ep.Name, MAC: ep.MAC, ProviderAddress: ep.ProviderAddress}
}

// Recorded reports whether kproxy has a record of what it sent for the
// object with this ID.
func (s Sent) Recorded(id string) bool {
	id = lower(id)
	_, lb := s.LBs[id]
	_, ep := s.EPs[id]
	return lb || ep
}

// clone copies the maps and slices of r, not the objects they point to:
// what Apply changes (the maps and lists) is then its own, and the objects
// (never modified once recorded) are shared.
func (r *Record) clone() *Record {
	st := *r.State
	st.LoadBalancers = maps.Clone(r.State.LoadBalancers)
	st.Endpoints = maps.Clone(r.State.Endpoints)
	st.Orphans = slices.Clone(r.State.Orphans)
	st.Shadowed = slices.Clone(r.State.Shadowed)
	return &Record{
		State: &st,
		Sent:  Sent{LBs: maps.Clone(r.Sent.LBs), EPs: maps.Clone(r.Sent.EPs)},
		Echo:  r.Echo.clone(),
	}
}

// deepClone is clone with copies of the observed objects too, for
// adoption, which completes them.
func (st *State) deepClone() *State {
	c := *st
	c.LoadBalancers = make(map[string]*ObservedLB, len(st.LoadBalancers))
	copied := make(map[*ObservedLB]*ObservedLB, len(st.LoadBalancers)+len(st.Orphans))
	cp := func(o *ObservedLB) *ObservedLB {
		if n := copied[o]; n != nil {
			return n
		}
		n := *o
		copied[o] = &n
		return &n
	}
	for slot, o := range st.LoadBalancers {
		c.LoadBalancers[slot] = cp(o)
	}
	c.Orphans = make([]*ObservedLB, len(st.Orphans))
	for i, o := range st.Orphans {
		c.Orphans[i] = cp(o)
	}
	c.Endpoints = make(map[netip.Addr]*ObservedEndpoint, len(st.Endpoints))
	for ip, ep := range st.Endpoints {
		n := *ep
		c.Endpoints[ip] = &n
	}
	c.Shadowed = make([]*ObservedEndpoint, len(st.Shadowed))
	for i, ep := range st.Shadowed {
		n := *ep
		c.Shadowed[i] = &n
	}
	return &c
}

// AddEndpoints returns last with the endpoints of a fresh listing of the
// network's endpoints that it lacks (local endpoints the CNI created since
// the last listing; a local one wins over a remote one with its address).
// The endpoints kproxy sent get back the fields HNS did not return. It is
// pure: last and fresh are not changed.
func AddEndpoints(last *Record, fresh *State, evidence hns.Fields) *Record {
	next := last.clone()
	next.Echo.Seen |= evidence
	for ip, ep := range fresh.Endpoints {
		c := *ep
		if s, ok := next.Sent.EPs[c.ID]; ok && s.IP == c.IP && s.Remote == c.Remote {
			next.Echo.fillEndpoint(&c, s, nil, nil)
		}
		if old := next.State.Endpoints[ip]; old == nil || (old.Remote && !c.Remote) {
			next.State.setEndpoint(&c)
		}
	}
	return next
}
