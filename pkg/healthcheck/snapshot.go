package healthcheck

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// ServicesFromSnapshot returns what the health check node ports serve for
// snap: every Service with a healthCheckNodePort (the cache sets it only for
// LoadBalancer Services with externalTrafficPolicy Local) and its number of
// ready endpoints on this node.
//
// Like upstream, endpoints are counted by IP address, so a pod serving
// several ports of the Service counts once, and only ready endpoints count:
// a node left with terminating endpoints only answers 503 so load balancers
// move away from it. A dual-stack pod counts once (the larger of the
// per-family counts), as each upstream per-family server would report it.
func ServicesFromSnapshot(snap *proxy.Snapshot) map[types.NamespacedName]ServiceHealth {
	if snap == nil {
		return map[types.NamespacedName]ServiceHealth{}
	}
	var fams [2][]*proxy.ServicePort
	for i, view := range []*proxy.FamilyView{snap.IPv4, snap.IPv6} {
		for p := range view.All() {
			if p.HealthCheckNodePort != 0 {
				fams[i] = append(fams[i], p)
			}
		}
	}
	return ServicesFromPorts(fams[0], fams[1])
}

// ServicesFromPorts is ServicesFromSnapshot for the ports of each family
// that have a health check node port (others are ignored), as the app keeps
// them from sync to sync.
func ServicesFromPorts(families ...[]*proxy.ServicePort) map[types.NamespacedName]ServiceHealth {
	out := map[types.NamespacedName]ServiceHealth{}
	for _, ports := range families {
		ips := map[types.NamespacedName]map[netip.Addr]struct{}{}
		for _, p := range ports {
			if p.HealthCheckNodePort == 0 {
				continue
			}
			name := p.Name.NamespacedName
			if _, ok := out[name]; !ok {
				out[name] = ServiceHealth{Port: p.HealthCheckNodePort}
			}
			set := ips[name]
			if set == nil {
				set = map[netip.Addr]struct{}{}
				ips[name] = set
			}
			for _, ep := range p.LocalEndpoints {
				if ep.Local && ep.Ready {
					set[ep.IP] = struct{}{}
				}
			}
		}
		for name, set := range ips {
			if h := out[name]; len(set) > h.LocalEndpoints {
				h.LocalEndpoints = len(set)
				out[name] = h
			}
		}
	}
	return out
}
