package cache

import (
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// index updates the ownership indexes for Service name going from old to
// cur (either may be nil), and marks dirty every Service whose claimed
// external frontends gained or lost a ClusterIP owner. Called locked.
func (c *Cache) index(name types.NamespacedName, old, cur *svcInfo) {
	var oldIPs, curIPs []netip.Addr
	if old != nil {
		oldIPs = ownedIPs(old)
		for _, a := range claimedIPs(old) {
			if m := c.claims[a]; m != nil {
				delete(m, name)
				if len(m) == 0 {
					delete(c.claims, a)
				}
			}
		}
	}
	if cur != nil {
		curIPs = ownedIPs(cur)
		for _, a := range claimedIPs(cur) {
			m := c.claims[a]
			if m == nil {
				m = map[types.NamespacedName]struct{}{}
				c.claims[a] = m
			}
			m[name] = struct{}{}
		}
	}
	for _, a := range oldIPs {
		if c.owners[a]--; c.owners[a] <= 0 {
			delete(c.owners, a)
		}
	}
	for _, a := range curIPs {
		c.owners[a]++
	}
	// Claimants of a ClusterIP that appeared or went away must be
	// recomputed (it is now denied, or allowed again).
	for _, a := range symmetricDiff(oldIPs, curIPs) {
		for claimant := range c.claims[a] {
			c.dirty[claimant] = struct{}{}
		}
	}
}

func ownedIPs(s *svcInfo) []netip.Addr {
	var out []netip.Addr
	for _, a := range s.clusterIPs {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

func claimedIPs(s *svcInfo) []netip.Addr {
	return append(slices.Clip(s.externalIPs), s.lbIPs...)
}

func symmetricDiff(a, b []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, x)
		}
	}
	return out
}

// ownedFrontends returns svc without the externalIPs and load balancer IPs
// that are some Service's ClusterIP (its own included): a ClusterIP belongs
// to its Service alone, so another Service in any namespace cannot capture
// its traffic by listing it as an external frontend. Each one left out is
// reported through Options.Conflict and counted. Called locked.
func (c *Cache) ownedFrontends(svc *svcInfo) *svcInfo {
	denied := func(a netip.Addr) bool { return c.owners[a] > 0 }
	if !slices.ContainsFunc(svc.externalIPs, denied) && !slices.ContainsFunc(svc.lbIPs, denied) {
		return svc
	}
	cp := *svc
	keep := func(list []netip.Addr, field string) []netip.Addr {
		var out []netip.Addr
		for _, a := range list {
			if !denied(a) {
				out = append(out, a)
				continue
			}
			c.conflicts[svc.name]++
			if c.conflict != nil {
				c.conflict(svc.name, ReasonFrontendConflict,
					fmt.Sprintf("%s %s is a Service's ClusterIP; it is not programmed as a frontend of this Service", field, a))
			}
			c.log.Info("Ignoring an external frontend that is a ClusterIP", "service", svc.name.String(), "field", field, "address", a)
		}
		return out
	}
	cp.externalIPs = keep(svc.externalIPs, "spec.externalIPs")
	cp.lbIPs = keep(svc.lbIPs, "status.loadBalancer.ingress")
	return &cp
}

// FrontendConflicts returns the number of external frontends left out of
// the last Snapshot because they are a Service's ClusterIP.
func (c *Cache) FrontendConflicts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.conflicts {
		n += k
	}
	return n
}
