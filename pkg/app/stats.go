package app

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/healthcheck"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// familyStats is what the per-sync metrics and the health check node ports
// need from every service port of one family, kept up to date from the
// changed ports only: a partial sync costs the same at 1,000 and at
// 100,000 service ports (a full sync counts everything again).
type familyStats struct {
	// view is the view the counts describe (nil: none yet).
	view *proxy.FamilyView
	// noLocalInternal and noLocalExternal: see metrics.CountNoLocalEndpoints.
	noLocalInternal, noLocalExternal int
	byAlgorithm                      map[proxy.Algorithm]int
	// health holds the ports with a health check node port, by Service.
	health map[types.NamespacedName]map[proxy.ServicePortName]*proxy.ServicePort
}

// update makes the counts describe cur and returns the Services whose
// health check node port ports changed, or all true when everything was
// counted again. ch must name every port that differs between the view
// the counts describe and cur (the cache's changes since the last
// acknowledged snapshot do: the counts are never older than it).
func (st *familyStats) update(cur *proxy.FamilyView, ch proxy.Changes) (touched map[types.NamespacedName]struct{}, all bool) {
	if st.view == nil || ch.Full {
		*st = familyStats{byAlgorithm: map[proxy.Algorithm]int{}, health: map[types.NamespacedName]map[proxy.ServicePortName]*proxy.ServicePort{}}
		for p := range cur.All() {
			st.add(p, 1)
		}
		st.view = cur
		return nil, true
	}
	touched = map[types.NamespacedName]struct{}{}
	ch.Differences(st.view, cur, func(n proxy.ServicePortName, old, now *proxy.ServicePort) {
		if old != nil {
			st.add(old, -1)
		}
		if now != nil {
			st.add(now, 1)
		}
		if (old != nil && old.HealthCheckNodePort != 0) || (now != nil && now.HealthCheckNodePort != 0) {
			touched[n.NamespacedName] = struct{}{}
		}
	})
	st.view = cur
	return touched, false
}

// add counts p once (d 1) or takes it out (d -1).
func (st *familyStats) add(p *proxy.ServicePort, d int) {
	internal, external := metrics.NoLocalEndpointsOf(p)
	if internal {
		st.noLocalInternal += d
	}
	if external {
		st.noLocalExternal += d
	}
	st.byAlgorithm[p.EffectiveAlgorithm()] += d
	if p.HealthCheckNodePort == 0 {
		return
	}
	svc := p.Name.NamespacedName
	if d > 0 {
		if st.health[svc] == nil {
			st.health[svc] = map[proxy.ServicePortName]*proxy.ServicePort{}
		}
		st.health[svc][p.Name] = p
		return
	}
	delete(st.health[svc], p.Name)
	if len(st.health[svc]) == 0 {
		delete(st.health, svc)
	}
}

// healthPorts returns the ports of svc with a health check node port, every
// Service's when svc is nil.
func (st *familyStats) healthPorts(svc *types.NamespacedName) []*proxy.ServicePort {
	var out []*proxy.ServicePort
	for name, ports := range st.health {
		if svc != nil && name != *svc {
			continue
		}
		for _, p := range ports {
			out = append(out, p)
		}
	}
	return out
}

// servicesHealth returns, from the counts of both families (IPv4, IPv6),
// what the health check node ports of svcs serve (every Service's when
// svcs is nil): see healthcheck.ServicesFromSnapshot.
func servicesHealth(stats *[2]familyStats, svcs map[types.NamespacedName]struct{}) map[types.NamespacedName]healthcheck.ServiceHealth {
	if svcs == nil {
		return healthcheck.ServicesFromPorts(stats[0].healthPorts(nil), stats[1].healthPorts(nil))
	}
	out := map[types.NamespacedName]healthcheck.ServiceHealth{}
	for svc := range svcs {
		for name, h := range healthcheck.ServicesFromPorts(stats[0].healthPorts(&svc), stats[1].healthPorts(&svc)) {
			out[name] = h
		}
	}
	return out
}

// familyIndex is the index of f in syncer.stats.
func familyIndex(f v1.IPFamily) int {
	if f == v1.IPv6Protocol {
		return 1
	}
	return 0
}
