package compare

import (
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Difference is an intended difference between upstream's winkernel
// proxier and kproxy: an ID, the reason, and whether a given difference is
// one of it. docs/compatibility.md lists the same IDs and reasons
// (TestDifferencesDocumented checks).
type Difference struct {
	ID, Reason string
	match      func(c *stepContext, d Diff) bool
}

// Differences are every intended difference, in the order they are tried.
var Differences = []Difference{
	{
		ID: "shared-frontend-owner",
		Reason: "when two Services claim one externalIP or LoadBalancer IP and port, kproxy gives it to the first " +
			"by name and reports the other (Warning FrontendConflict); upstream keeps whichever load balancer it " +
			"created first for that frontend, which follows its map iteration",
		match: func(c *stepContext, d Diff) bool {
			owner := c.firstClaimant(d)
			kp, _ := d.Kproxy.(LB)
			return owner != nil && sameButEndpoints(d) && c.endpointsOf(owner, kp.Endpoints)
		},
	},
	{
		ID: "terminating-fallback",
		Reason: "kproxy falls back to serving terminating endpoints for every Service (the shared cache, as on Linux); " +
			"upstream only for LoadBalancer Services, so it programs no load balancer when a ClusterIP or NodePort " +
			"Service has only terminating endpoints",
		match: func(c *stepContext, d Diff) bool {
			kp, ok := d.Kproxy.(LB)
			svc := c.serviceOf(d)
			return ok && d.Upstream == nil && svc != nil && svc.Spec.Type != v1.ServiceTypeLoadBalancer && c.allTerminating(svc, kp.Endpoints)
		},
	},
	{
		ID: "topology-hints",
		Reason: "kproxy honours topology hints and trafficDistribution (the shared cache); upstream ignores them and " +
			"uses every endpoint",
		match: func(c *stepContext, d Diff) bool {
			svc := c.serviceOf(d)
			return svc != nil && c.hinted(svc) && sameButEndpoints(d)
		},
	},
	{
		ID: "overlay-service-vip-without-lb",
		Reason: "on overlay networks upstream creates the remote endpoint holding a ClusterIP for every Service, even " +
			"one with no endpoint; kproxy only for a ClusterIP it programs a load balancer for",
		match: func(c *stepContext, d Diff) bool {
			up, ok := d.Upstream.(EP)
			return ok && d.Kproxy == nil && c.s.Overlay && c.clusterIPs[up.IP] && !c.kproxyVIPs[up.IP]
		},
	},
	{
		ID: "health-check-without-local-endpoints",
		Reason: "with forwardHealthCheckVip, kproxy forwards the health check of a LoadBalancer ingress IP even when " +
			"the node has no endpoint for it, so that the cloud load balancer's probe gets the health server's " +
			"answer (\"no local endpoints\") and avoids the node; upstream only when it programs the ingress IP",
		match: func(c *stepContext, d Diff) bool {
			k, ok := d.Kproxy.(LB)
			return ok && d.Upstream == nil && c.s.HealthCheck && c.isHealthCheck(k)
		},
	},
	{
		ID: "ipv6-health-check-flag",
		Reason: "upstream creates the forwarded health check load balancer of an IPv6 ingress IP without the IPv6 " +
			"flag (its flags leave isIPv6 out); kproxy sets it, as on every IPv6 load balancer",
		match: func(c *stepContext, d Diff) bool {
			up, ok1 := d.Upstream.(LB)
			kp, ok2 := d.Kproxy.(LB)
			if !ok1 || !ok2 || !c.s.HealthCheck || !c.isHealthCheck(kp) || up.Flags&2 != 0 || kp.Flags&2 == 0 {
				return false
			}
			up.Flags |= 2
			up.IPv6 = true
			return up.String() == kp.String()
		},
	},
	{
		ID: "ipv6-remote-mac",
		Reason: "kproxy derives an IPv6 remote endpoint's MAC from a hash of the whole address; upstream from its " +
			"last four bytes, which collide across pod subnets (fd00:10:244:1::a and fd00:10:244:2::a)",
		match: func(c *stepContext, d Diff) bool {
			up, ok1 := d.Upstream.(EP)
			kp, ok2 := d.Kproxy.(EP)
			return ok1 && ok2 && strings.Contains(up.IP, ":") && up.IP == kp.IP && up.Remote == kp.Remote &&
				up.ProviderAddress == kp.ProviderAddress && up.MAC != kp.MAC
		},
	},
	{
		ID: "affinity-needs-hns-12",
		Reason: "before HNS 12.0 there is no SourceIP distribution: kproxy programs the default distribution and warns; " +
			"upstream logs that affinity is unsupported and asks for it all the same",
		match: func(c *stepContext, d Diff) bool {
			up, ok1 := d.Upstream.(LB)
			kp, ok2 := d.Kproxy.(LB)
			if !ok1 || !ok2 || !c.s.OldHNS || up.Distribution == kp.Distribution {
				return false
			}
			up.Distribution = kp.Distribution
			return up.String() == kp.String()
		},
	},
}

// context is what the rules know of a step.
type stepContext struct {
	s      *Scenario
	step   Step
	facts  Facts
	slices map[string][]*discovery.EndpointSlice // by Service name
	// clusterIPs are the step's ClusterIPs of the family; kproxyVIPs the
	// frontend VIPs of kproxy's load balancers.
	clusterIPs, kproxyVIPs map[string]bool
}

func newContext(s *Scenario, i int, _ Objects, kproxy Objects) *stepContext {
	c := &stepContext{s: s, step: s.Steps[i], facts: s.Facts(i), slices: map[string][]*discovery.EndpointSlice{},
		clusterIPs: map[string]bool{}, kproxyVIPs: map[string]bool{}}
	for _, sl := range c.step.Slices {
		name := sl.Labels[discovery.LabelServiceName]
		c.slices[name] = append(c.slices[name], sl)
	}
	for _, svc := range c.step.Services {
		for _, ip := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil && a.Is6() == (s.Family == v1.IPv6Protocol) {
				c.clusterIPs[a.String()] = true
			}
		}
	}
	for _, l := range kproxy.LBs {
		for _, v := range l.FrontendVIPs {
			c.kproxyVIPs[v] = true
		}
	}
	return c
}

// explain returns the ID of the intended difference d is, or "".
func (c *stepContext) explain(d Diff) string {
	for _, x := range Differences {
		if x.match(c, d) {
			return x.ID
		}
	}
	return ""
}

// lbOf is the load balancer of either side of d (kproxy's first).
func lbOf(d Diff) (LB, bool) {
	if l, ok := d.Kproxy.(LB); ok {
		return l, true
	}
	l, ok := d.Upstream.(LB)
	return l, ok
}

// serviceOf is the Service a differing load balancer serves (nil when it
// cannot be told): by ClusterIP, externalIP or ingress IP and port, or by
// NodePort.
func (c *stepContext) serviceOf(d Diff) *v1.Service {
	l, ok := lbOf(d)
	if !ok {
		return nil
	}
	proto := map[uint32]v1.Protocol{6: v1.ProtocolTCP, 17: v1.ProtocolUDP, 132: v1.ProtocolSCTP}[l.Protocol]
	for _, svc := range c.step.Services {
		for _, p := range svc.Spec.Ports {
			if p.Protocol != proto {
				continue
			}
			if len(l.FrontendVIPs) == 0 {
				if p.NodePort == int32(l.ExternalPort) {
					return svc
				}
				continue
			}
			if p.Port != int32(l.ExternalPort) {
				continue
			}
			vip := l.FrontendVIPs[0]
			if slices.Contains(svc.Spec.ClusterIPs, vip) || slices.Contains(svc.Spec.ExternalIPs, vip) {
				return svc
			}
			for _, in := range svc.Status.LoadBalancer.Ingress {
				if in.IP == vip {
					return svc
				}
			}
		}
	}
	return nil
}

// allTerminating reports whether every address of ips is a terminating
// endpoint of svc.
func (c *stepContext) allTerminating(svc *v1.Service, ips []string) bool {
	terminating := map[string]bool{}
	for _, sl := range c.slices[svc.Name] {
		for _, e := range sl.Endpoints {
			if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
				for _, a := range e.Addresses {
					terminating[canon(a)] = true
				}
			}
		}
	}
	for _, ip := range ips {
		if !terminating[ip] {
			return false
		}
	}
	return len(ips) > 0
}

// hinted reports whether svc's endpoint selection uses topology.
func (c *stepContext) hinted(svc *v1.Service) bool {
	if svc.Spec.TrafficDistribution != nil {
		return true
	}
	for _, sl := range c.slices[svc.Name] {
		for _, e := range sl.Endpoints {
			if e.Hints != nil {
				return true
			}
		}
	}
	return false
}

// sameButEndpoints reports whether both sides have the load balancer and
// it differs in its endpoints only.
func sameButEndpoints(d Diff) bool {
	up, ok1 := d.Upstream.(LB)
	kp, ok2 := d.Kproxy.(LB)
	if !ok1 || !ok2 {
		return false
	}
	up.Endpoints = kp.Endpoints
	return up.String() == kp.String()
}

// isHealthCheck reports whether l is a forwarded health check: to the
// root endpoint only, external port = internal port, on an ingress IP.
func (c *stepContext) isHealthCheck(l LB) bool {
	root := c.facts.Local[RootEndpoint]
	return len(l.Endpoints) == 1 && root.IsValid() && l.Endpoints[0] == root.String() && l.ExternalPort == l.InternalPort &&
		len(l.FrontendVIPs) == 1
}

// firstClaimant returns, when two or more of the step's Services list the
// externalIP or LoadBalancer IP and port of d's load balancer, the first
// of them by name; nil otherwise.
func (c *stepContext) firstClaimant(d Diff) *v1.Service {
	l, ok := lbOf(d)
	if !ok || len(l.FrontendVIPs) == 0 {
		return nil
	}
	proto := map[uint32]v1.Protocol{6: v1.ProtocolTCP, 17: v1.ProtocolUDP, 132: v1.ProtocolSCTP}[l.Protocol]
	vip := l.FrontendVIPs[0]
	var claims []*v1.Service
	for _, svc := range c.step.Services {
		ips := slices.Clone(svc.Spec.ExternalIPs)
		for _, in := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		if !slices.Contains(ips, vip) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Protocol == proto && p.Port == int32(l.ExternalPort) {
				claims = append(claims, svc)
				break
			}
		}
	}
	if len(claims) < 2 {
		return nil
	}
	return slices.MinFunc(claims, func(a, b *v1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
}

// endpointsOf reports whether every address of eps is an endpoint address
// of svc's EndpointSlices in the step.
func (c *stepContext) endpointsOf(svc *v1.Service, eps []string) bool {
	have := map[string]bool{}
	for _, sl := range c.slices[svc.Name] {
		for _, e := range sl.Endpoints {
			for _, a := range e.Addresses {
				have[a] = true
			}
		}
	}
	for _, e := range eps {
		if !have[e] {
			return false
		}
	}
	return len(eps) > 0
}
