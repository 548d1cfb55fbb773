package reconcile

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// State is what exists in HNS for one IP family and network, as far as the
// backend knows: built by Observe from a full listing, then kept up to date
// by the backend after every HNS call (the record of what it programmed).
type State struct {
	// NetworkID is the HNS network the endpoints belong to.
	NetworkID string
	// LoadBalancers holds the usable load balancers of the family, by slot.
	LoadBalancers map[string]*ObservedLB
	// Orphans are load balancers of the family that cannot be kept: malformed,
	// referring to endpoints that are not in the network, or a second load
	// balancer in a slot. They are deleted.
	Orphans []*ObservedLB
	// Endpoints holds the network's endpoints of the family, by address. When
	// HNS holds several endpoints with one address (a known Windows bug), the
	// local one, else the lowest ID; the others are in Shadowed.
	Endpoints map[netip.Addr]*ObservedEndpoint
	Shadowed  []*ObservedEndpoint

	// idGen counts the times an address in Endpoints got another endpoint ID
	// (adding or removing an address does not count). A load balancer
	// recorded at the current idGen still holds the current IDs of its
	// addresses.
	idGen uint64
}

// setEndpoint records the endpoint of an address.
func (st *State) setEndpoint(ep *ObservedEndpoint) {
	if old := st.Endpoints[ep.IP]; old != nil && old.ID != ep.ID {
		st.idGen++
	}
	st.Endpoints[ep.IP] = ep
}

// NewState returns an empty state for a network.
func NewState(networkID string) *State {
	return &State{
		NetworkID:     networkID,
		LoadBalancers: make(map[string]*ObservedLB),
		Endpoints:     make(map[netip.Addr]*ObservedEndpoint),
	}
}

// ObservedLB is a load balancer that exists in HNS.
type ObservedLB struct {
	ID string
	// Spec is its content with endpoints named by address (nil for a
	// malformed orphan).
	Spec *plan.LBSpec
	// EndpointIDs are the HNS endpoint IDs it holds, lower case and sorted.
	EndpointIDs []string
	// Problem says why an orphan cannot be kept.
	Problem string
	// Slot is the frontend the load balancer occupies ("" when it cannot be
	// told): an orphan in a slot kproxy wants is deleted before the slot is
	// programmed.
	Slot string
	// gen is the State's idGen when the backend recorded it (0 when observed).
	gen uint64
}

// ObservedEndpoint is an endpoint that exists in HNS.
type ObservedEndpoint struct {
	// ID is the HNS ID in lower case (HNS is not consistent about case).
	ID     string
	IP     netip.Addr
	Name   string
	Remote bool
	MAC    string
	// ProviderAddress of a remote endpoint on an overlay network.
	ProviderAddress netip.Addr
}

// Owned reports whether kproxy may delete the endpoint when it no longer needs
// it: kproxy named it, or it is a remote endpoint with the MAC address kproxy
// and kube-proxy derive from the address. Endpoints of the CNI (local pods,
// the host's root endpoint) are never deleted.
func (e *ObservedEndpoint) Owned() bool {
	return strings.HasPrefix(e.Name, plan.EndpointNamePrefix) ||
		(e.Remote && strings.HasPrefix(strings.ToLower(e.MAC), plan.RemoteMACPrefix))
}

func observeEndpoint(ep *hns.Endpoint, ip netip.Addr) *ObservedEndpoint {
	o := &ObservedEndpoint{ID: strings.ToLower(ep.ID), IP: ip, Name: ep.Name, Remote: ep.IsRemote(), MAC: ep.MacAddress}
	if pa, err := netip.ParseAddr(ep.ProviderAddress()); err == nil {
		o.ProviderAddress = pa.Unmap()
	}
	return o
}

// matches reports whether an existing endpoint can serve as spec.
func (e *ObservedEndpoint) matches(spec *plan.EndpointSpec) bool {
	if !e.Remote || !spec.Remote() {
		// A local endpoint with the address serves any purpose (the CNI's
		// endpoint wins over ours); a remote one found where a local source
		// VIP endpoint is wanted is kept too, like upstream.
		return true
	}
	return e.ProviderAddress == spec.ProviderAddress
}

// Observe builds the state of one family from a listing of the network's
// endpoints and the host's load balancers. It never fails: what cannot be
// understood becomes an orphan.
func Observe(family v1.IPFamily, networkID string, endpoints []hns.Endpoint, lbs []hns.LoadBalancer) *State {
	st := NewState(networkID)
	v6 := family == v1.IPv6Protocol
	byID := make(map[string]netip.Addr, len(endpoints))

	sorted := make([]*hns.Endpoint, 0, len(endpoints))
	for i := range endpoints {
		sorted = append(sorted, &endpoints[i])
	}
	// Local endpoints first, then by ID, so the choice among duplicates is stable.
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.IsRemote() != b.IsRemote() {
			return !a.IsRemote()
		}
		return a.ID < b.ID
	})
	for _, ep := range sorted {
		if ep.HostComputeNetwork != "" && !strings.EqualFold(ep.HostComputeNetwork, networkID) {
			continue
		}
		for _, ip := range ep.IPs() {
			if ip.Is6() != v6 {
				continue
			}
			byID[strings.ToLower(ep.ID)] = ip
			o := observeEndpoint(ep, ip)
			if _, dup := st.Endpoints[ip]; dup {
				st.Shadowed = append(st.Shadowed, o)
			} else {
				st.Endpoints[ip] = o
			}
			break // one address per family
		}
	}

	sortedLBs := make([]*hns.LoadBalancer, 0, len(lbs))
	for i := range lbs {
		sortedLBs = append(sortedLBs, &lbs[i])
	}
	sort.Slice(sortedLBs, func(i, j int) bool { return sortedLBs[i].ID < sortedLBs[j].ID })
	for _, lb := range sortedLBs {
		if (lb.Flags&hns.LBFlagIPv6 != 0) != v6 {
			continue // the other family's backend owns it
		}
		o := observeLB(lb, byID, v6)
		if o.Spec == nil {
			st.Orphans = append(st.Orphans, o)
			continue
		}
		o.Slot = o.Spec.Slot()
		if _, dup := st.LoadBalancers[o.Spec.Slot()]; dup {
			o.Problem = "second load balancer for " + o.Spec.Slot()
			st.Orphans = append(st.Orphans, o)
			continue
		}
		st.LoadBalancers[o.Spec.Slot()] = o
	}
	return st
}

func observeLB(lb *hns.LoadBalancer, byID map[string]netip.Addr, v6 bool) *ObservedLB {
	o := &ObservedLB{ID: lb.ID, EndpointIDs: sortedCopy(lb.HostComputeEndpoints)}
	if len(lb.PortMappings) != 1 {
		o.Problem = fmt.Sprintf("malformed: %d port mappings", len(lb.PortMappings))
		return o
	}
	if len(lb.HostComputeEndpoints) == 0 {
		o.Problem = "malformed: no endpoints"
		return o
	}
	pm := lb.PortMappings[0]
	spec := &plan.LBSpec{
		Protocol: pm.Protocol, InternalPort: pm.InternalPort, ExternalPort: pm.ExternalPort,
		Distribution: pm.DistributionType, PortFlags: pm.Flags, Flags: lb.Flags,
	}
	for _, s := range lb.FrontendVIPs {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Unmap().Is6() != v6 {
			o.Problem = fmt.Sprintf("malformed: frontend VIP %q", s)
			return o
		}
		spec.FrontendVIPs = append(spec.FrontendVIPs, a.Unmap())
	}
	sort.Slice(spec.FrontendVIPs, func(i, j int) bool { return spec.FrontendVIPs[i].Less(spec.FrontendVIPs[j]) })
	if lb.SourceVIP != "" {
		a, err := netip.ParseAddr(lb.SourceVIP)
		if err != nil {
			o.Problem = fmt.Sprintf("malformed: source VIP %q", lb.SourceVIP)
			return o
		}
		spec.SourceVIP = a.Unmap()
	}
	o.Slot = spec.Finish().Slot()
	for _, id := range lb.HostComputeEndpoints {
		ip, ok := byID[strings.ToLower(id)]
		if !ok {
			o.Problem = fmt.Sprintf("refers to endpoint %s, which is not in the network", id)
			return o
		}
		spec.Endpoints = append(spec.Endpoints, ip)
	}
	sort.Slice(spec.Endpoints, func(i, j int) bool { return spec.Endpoints[i].Less(spec.Endpoints[j]) })
	for i := 1; i < len(spec.Endpoints); i++ {
		if spec.Endpoints[i] == spec.Endpoints[i-1] {
			o.Problem = "holds two endpoints with address " + spec.Endpoints[i].String()
			return o
		}
	}
	o.Spec = spec.Finish()
	return o
}

func sortedCopy(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToLower(v)
	}
	sort.Strings(out)
	return out
}

// eachUsableLB calls fn for every load balancer whose content is understood:
// those in a slot and those orphaned as a second one in a slot.
func (st *State) eachUsableLB(fn func(*ObservedLB)) {
	for _, slot := range SortedSlots(st.LoadBalancers) {
		fn(st.LoadBalancers[slot])
	}
	for _, o := range st.Orphans {
		if o.Spec != nil {
			fn(o)
		}
	}
}

// rekey files the usable load balancers again by the slot of their spec
// (which adoption may have completed): one per slot, those in first before
// the others, then by ID; the others are orphans, as Observe makes them.
func (st *State) rekey(first map[*ObservedLB]bool) {
	var all []*ObservedLB
	st.eachUsableLB(func(o *ObservedLB) { all = append(all, o) })
	sort.SliceStable(all, func(i, j int) bool {
		if first[all[i]] != first[all[j]] {
			return first[all[i]]
		}
		return all[i].ID < all[j].ID
	})
	orphans := st.Orphans[:0:0]
	for _, o := range st.Orphans {
		if o.Spec == nil {
			orphans = append(orphans, o)
		}
	}
	st.LoadBalancers = make(map[string]*ObservedLB, len(st.LoadBalancers))
	for _, o := range all {
		o.Slot = o.Spec.Slot()
		if _, dup := st.LoadBalancers[o.Slot]; dup {
			o.Problem = "second load balancer for " + o.Slot
			orphans = append(orphans, o)
			continue
		}
		o.Problem = ""
		st.LoadBalancers[o.Slot] = o
	}
	st.Orphans = orphans
}

// orphan makes a usable load balancer an orphan of a slot: Reconcile deletes
// it before that slot is programmed.
func (st *State) orphan(o *ObservedLB, slot, problem string) {
	if o.Spec != nil && st.LoadBalancers[o.Spec.Slot()] == o {
		delete(st.LoadBalancers, o.Spec.Slot())
	} else {
		for i, x := range st.Orphans {
			if x == o {
				st.Orphans = append(st.Orphans[:i], st.Orphans[i+1:]...)
				break
			}
		}
	}
	o.Slot, o.Problem = slot, problem
	st.Orphans = append(st.Orphans, o)
}
