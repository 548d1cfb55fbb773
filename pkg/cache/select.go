package cache

import (
	"slices"

	"github.com/kproxy/kproxy/pkg/proxy"
	v1 "k8s.io/api/core/v1"
)

// topology modes chosen from EndpointSlice hints.
const (
	topologyNone     = ""
	topologySameZone = "PreferSameZone"
	topologySameNode = "PreferSameNode"
)

// candidate is one merged endpoint of a service port before selection.
type candidate struct {
	ep  proxy.Endpoint
	loc location
}

// servicePorts computes the desired state of every port of svc in family fam,
// from the Service's slices (sorted by slice name) and the node facts.
// It is a pure function.
func servicePorts(svc *svcInfo, sl []*sliceInfo, fam int, node *proxy.Node) []*proxy.ServicePort {
	cip := svc.clusterIPs[fam]
	if !cip.IsValid() {
		return nil
	}
	out := make([]*proxy.ServicePort, 0, len(svc.ports))
	for _, p := range svc.ports {
		sp := &proxy.ServicePort{
			Name:                     proxy.ServicePortName{NamespacedName: svc.name, Port: p.name, Protocol: p.protocol},
			Family:                   families[fam],
			Type:                     svc.typ,
			ClusterIP:                cip,
			Port:                     p.port,
			Protocol:                 p.protocol,
			NodePort:                 p.nodePort,
			ExternalIPs:              addrsOf(svc.externalIPs, fam),
			LoadBalancerIPs:          addrsOf(svc.lbIPs, fam),
			LoadBalancerSourceRanges: prefixesOf(svc.sourceRanges, fam),
			AffinityTimeoutSeconds:   svc.affinityTimeout,
			InternalPolicyLocal:      svc.internalLocal,
			HealthCheckNodePort:      svc.healthCheckNodePort,
			TrafficDistribution:      svc.trafficDistribution,
			PreserveDestination:      svc.preserveDestination,
			Algorithm:                svc.algorithm,
		}
		sp.ExternalPolicyLocal = svc.externalLocal && sp.ExternallyAccessible()
		cands := mergeEndpoints(sl, fam, p, node.Name)
		sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasAnyEndpoints = categorize(cands, sp, node.Name, node.Zone)
		if !sp.HasAnyEndpoints {
			sp.SlicePortsElsewhere = slicePortsElsewhere(svc, sl, fam, p.protocol)
		}
		out = append(out, sp)
	}
	return out
}

// slicePortsElsewhere lists the names of the ports of protocol proto in
// svc's slices of family fam that have a ready endpoint but no port of svc
// of that name and protocol, sorted and without duplicates.
func slicePortsElsewhere(svc *svcInfo, sl []*sliceInfo, fam int, proto v1.Protocol) []string {
	var out []string
	for _, s := range sl {
		if s.fam != fam || !slices.ContainsFunc(s.eps, func(e sliceEndpoint) bool { return e.ready() }) {
			continue
		}
		for _, sp := range s.ports {
			if sp.protocol != proto || slices.ContainsFunc(svc.ports, func(p svcPortInfo) bool { return p.name == sp.name && p.protocol == proto }) {
				continue
			}
			out = append(out, sp.name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// mergeEndpoints gathers the endpoints of one service port from every slice of
// family fam that carries the port (by name and protocol; the target port
// number is resolved per slice). The same address and port in two slices
// collapse into one, keeping the better conditions.
func mergeEndpoints(sl []*sliceInfo, fam int, p svcPortInfo, nodeName string) []candidate {
	n := 0
	for _, s := range sl {
		if s.fam == fam {
			n += len(s.eps)
		}
	}
	out := make([]candidate, 0, n)
	for _, s := range sl {
		if s.fam != fam {
			continue
		}
		port := int32(-1)
		for _, sp := range s.ports {
			if sp.name == p.name && sp.protocol == p.protocol {
				port = sp.port
				break
			}
		}
		if port < 0 {
			continue
		}
		for i := range s.eps {
			e := &s.eps[i]
			loc := e.where.Value()
			ep := proxy.Endpoint{
				IP: s.addr(i), Port: port, Where: loc.topo,
				Ready: e.ready(), Serving: e.serving(), Terminating: e.terminating(),
			}
			ep.Local = nodeName != "" && ep.NodeName() == nodeName
			out = append(out, candidate{ep: ep, loc: loc})
		}
	}
	// Sort by address and port, the better copy of a duplicate first (the
	// sort is stable: among equals, the slice earlier by name wins), then
	// keep the first of each run.
	slices.SortStableFunc(out, func(a, b candidate) int {
		if c := a.ep.IP.Compare(b.ep.IP); c != 0 {
			return c
		}
		if a.ep.Port != b.ep.Port {
			return int(a.ep.Port - b.ep.Port)
		}
		return rank(&b.ep) - rank(&a.ep)
	})
	return slices.CompactFunc(out, func(a, b candidate) bool { return a.ep.AddrPort() == b.ep.AddrPort() })
}

// rank orders duplicate copies of an endpoint: ready beats not ready, then
// serving beats not serving.
func rank(e *proxy.Endpoint) int {
	r := 0
	if e.Ready {
		r += 2
	}
	if e.Serving {
		r++
	}
	return r
}

// categorize selects, with the Kubernetes semantics, the endpoints for
// cluster-scoped traffic and for node-local traffic, and whether any usable
// endpoint exists anywhere:
//   - usable means ready; when no endpoint is ready, serving-and-terminating
//     endpoints are used instead, independently for cluster and local traffic;
//   - cluster endpoints honour topology hints: node hints when every ready
//     endpoint has one and one names this node, else zone hints when every
//     ready endpoint has one and one names this node's zone;
//   - a list is nil when it would be empty, and always when the port never
//     uses that kind of traffic.
func categorize(cands []candidate, sp *proxy.ServicePort, nodeName, zone string) (cluster, local []proxy.Endpoint, hasAny bool) {
	if len(cands) == 0 {
		return nil, nil, false
	}
	if sp.UsesClusterEndpoints() {
		mode := topologyMode(cands, nodeName, zone)
		cluster = pick(cands, func(c *candidate) bool { return c.ep.Ready && availableForTopology(c, mode, nodeName, zone) })
		if len(cluster) == 0 {
			// No ready endpoint anywhere (topology never hides every ready one).
			cluster = pick(cands, func(c *candidate) bool { return c.ep.Serving && c.ep.Terminating })
		}
		hasAny = len(cluster) > 0
	}
	if !sp.UsesLocalEndpoints() {
		return cluster, nil, hasAny
	}
	var localReady, localServingTerminating bool
	for i := range cands {
		ep := &cands[i].ep
		switch {
		case ep.Ready:
			hasAny = true
			localReady = localReady || ep.Local
		case ep.Serving && ep.Terminating:
			hasAny = true
			localServingTerminating = localServingTerminating || ep.Local
		}
	}
	switch {
	case localReady:
		local = pick(cands, func(c *candidate) bool { return c.ep.Local && c.ep.Ready })
	case localServingTerminating:
		local = pick(cands, func(c *candidate) bool { return c.ep.Local && c.ep.Serving && c.ep.Terminating })
	}
	return cluster, local, hasAny
}

// pick returns the endpoints kept by keep, or nil when none is. The result
// is allocated at its exact size: it lives as long as the snapshot.
func pick(cands []candidate, keep func(*candidate) bool) []proxy.Endpoint {
	n := 0
	for i := range cands {
		if keep(&cands[i]) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]proxy.Endpoint, 0, n)
	for i := range cands {
		if keep(&cands[i]) {
			out = append(out, cands[i].ep)
		}
	}
	return out
}

func topologyMode(cands []candidate, nodeName, zone string) string {
	var anyReady, forNode, forZone bool
	allNode, allZone := true, true
	for i := range cands {
		c := &cands[i]
		if !c.ep.Ready {
			continue
		}
		anyReady = true
		if c.loc.nodeHints == "" {
			allNode = false
		} else if hasName(c.loc.nodeHints, nodeName) {
			forNode = true
		}
		if c.loc.zoneHints == "" {
			allZone = false
		} else if zone != "" && hasName(c.loc.zoneHints, zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

func availableForTopology(c *candidate, mode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return hasName(c.loc.nodeHints, nodeName)
	case topologySameZone:
		return hasName(c.loc.zoneHints, zone)
	}
	return true
}

// equalPorts reports whether two computed service ports are identical, so
// the cache can keep publishing the old pointer.
func equalPorts(a, b *proxy.ServicePort) bool {
	return a.Name == b.Name && a.Family == b.Family && a.Type == b.Type &&
		a.ClusterIP == b.ClusterIP && a.Port == b.Port && a.Protocol == b.Protocol &&
		a.NodePort == b.NodePort &&
		slices.Equal(a.ExternalIPs, b.ExternalIPs) &&
		slices.Equal(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		a.AffinityTimeoutSeconds == b.AffinityTimeoutSeconds &&
		a.ExternalPolicyLocal == b.ExternalPolicyLocal &&
		a.InternalPolicyLocal == b.InternalPolicyLocal &&
		a.HealthCheckNodePort == b.HealthCheckNodePort &&
		a.TrafficDistribution == b.TrafficDistribution &&
		a.PreserveDestination == b.PreserveDestination &&
		a.Algorithm == b.Algorithm &&
		a.HasAnyEndpoints == b.HasAnyEndpoints &&
		slices.Equal(a.SlicePortsElsewhere, b.SlicePortsElsewhere) &&
		slices.Equal(a.ClusterEndpoints, b.ClusterEndpoints) &&
		slices.Equal(a.LocalEndpoints, b.LocalEndpoints)
}
