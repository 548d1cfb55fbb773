package reconcile

import (
	"net/netip"
	"sort"

	"github.com/kproxy/kproxy/platform/windows/plan"
)

// Hold returns p without what is held (in quarantine): a held load
// balancer, by slot, keeps what HNS has in its slot (the recorded one, so
// nothing is deleted), or is left out when HNS has nothing there; a held
// endpoint, by address, is left out of the plan and of every load balancer
// (one left without endpoints is left out too). It returns p itself when
// nothing is held. It is pure: p and st are not changed.
func Hold(p *plan.Plan, st *State, heldLB map[string]bool, heldEP map[netip.Addr]bool) *plan.Plan {
	if len(heldLB) == 0 && len(heldEP) == 0 {
		return p
	}
	out := &plan.Plan{Family: p.Family, Warnings: p.Warnings, Err: p.Err}
	have := make(map[netip.Addr]bool, len(p.Endpoints))
	for _, e := range p.Endpoints {
		if !heldEP[e.IP] {
			out.Endpoints = append(out.Endpoints, e)
			have[e.IP] = true
		}
	}
	for _, lb := range p.LoadBalancers {
		if heldLB[lb.Slot()] {
			cur := st.LoadBalancers[lb.Slot()]
			if cur == nil || cur.Spec == nil {
				continue
			}
			// Keep what is there, with the endpoints it holds.
			for _, ip := range cur.Spec.Endpoints {
				if ep := st.Endpoints[ip]; ep != nil && ep.Remote && !have[ip] {
					out.Endpoints = append(out.Endpoints, &plan.EndpointSpec{IP: ip, Role: plan.RoleRemote, MAC: ep.MAC, ProviderAddress: ep.ProviderAddress})
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
				out.LoadBalancers = append(out.LoadBalancers, lb.WithEndpoints(keep))
				continue
			}
		}
		out.LoadBalancers = append(out.LoadBalancers, lb)
	}
	sort.Slice(out.Endpoints, func(i, j int) bool { return out.Endpoints[i].IP.Less(out.Endpoints[j].IP) })
	return out
}
