package intent

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// ReasonSourceHashTooManyEndpoints: a source-hash port has more endpoints
// than the source-hash table has slots; it is balanced at random.
const ReasonSourceHashTooManyEndpoints = "SourceHashTooManyEndpoints"

// Config holds what the decisions depend on besides the service port: fixed
// settings and the node's facts of one family.
type Config struct {
	// Family is the IP family every address of the intent is of.
	Family v1.IPFamily
	// MasqueradeAll masquerades every connection to a ClusterIP
	// (--masquerade-all), pods' included.
	MasqueradeAll bool
	// PodSources tells whether the node can tell its pods' traffic from
	// other traffic: a detect-local mode is configured and its facts are
	// known (the cluster CIDRs, or the node's pod CIDRs, or the bridge or
	// interface prefix). Without it, connections to a ClusterIP from
	// outside the cluster are not masqueraded (nothing tells them apart),
	// and pods reaching an externalTrafficPolicy Local frontend are treated
	// as outside clients.
	PodSources bool
	// NodeIPs are the node's own addresses of the family (status addresses
	// and those on its interfaces, loopback excluded), sorted. Source ranges
	// that contain one admit the load balancer IPs as sources too.
	NodeIPs []netip.Addr
	// PreserveDestination: the platform honours the preserve-destination
	// annotation (HNS; Linux ignores it, as upstream does).
	PreserveDestination bool
}

// DependsOnNodeIPs reports whether sp's intent changes with Config.NodeIPs
// (it has load balancer IPs with source ranges).
func DependsOnNodeIPs(sp *proxy.ServicePort) bool {
	return len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0
}

func (c *Config) addrOK(a netip.Addr) bool {
	return a.IsValid() && a.Is6() == (c.Family == v1.IPv6Protocol) && !a.Is4In6() && !a.IsUnspecified()
}

// AddrOK reports whether a is a usable unicast address of the family.
func (c *Config) AddrOK(a netip.Addr) bool { return c.addrOK(a) }

// Build makes the intent of one service port. conns, for a
// least-connection port, holds the established connections per endpoint
// (read from conntrack; see LeastConnectionWeights). It returns nil and
// the problems when the port cannot be programmed at all; otherwise the
// port, whose Problems list the fields left out.
func Build(cfg Config, sp *proxy.ServicePort, conns map[netip.AddrPort]int) (*Port, []proxy.Unsupported) {
	b := builder{cfg: &cfg, sp: sp}
	p := b.build(conns)
	if p != nil {
		p.Problems = b.problems
	}
	return p, b.problems
}

type builder struct {
	cfg      *Config
	sp       *proxy.ServicePort
	problems []proxy.Unsupported
}

func (b *builder) problem(reason, field, format string, args ...any) {
	b.problems = append(b.problems, proxy.Unsupported{
		Service: b.sp.Name.NamespacedName, Port: b.sp.Name.Port, Family: b.cfg.Family, Reason: reason,
		Message: fmt.Sprintf("service port %s: %s: %s", b.sp.Name, field, fmt.Sprintf(format, args...)),
	})
}

func (b *builder) build(conns map[netip.AddrPort]int) *Port {
	sp, cfg := b.sp, b.cfg
	switch {
	case sp.Family != cfg.Family:
		b.problem(proxy.ReasonInvalidServicePort, "family", "%s port in the %s view", sp.Family, cfg.Family)
		return nil
	case !cfg.addrOK(sp.ClusterIP):
		b.problem(proxy.ReasonInvalidServicePort, "clusterIP", "%q is not a valid %s address", sp.ClusterIP, cfg.Family)
		return nil
	case sp.Port <= 0 || sp.Port > 65535:
		b.problem(proxy.ReasonInvalidServicePort, "port", "%d is out of range", sp.Port)
		return nil
	case sp.Protocol != v1.ProtocolTCP && sp.Protocol != v1.ProtocolUDP && sp.Protocol != v1.ProtocolSCTP:
		b.problem(proxy.ReasonInvalidServicePort, "protocol", "%q is not TCP, UDP or SCTP", sp.Protocol)
		return nil
	}
	p := &Port{
		Name: sp.Name, Family: sp.Family, Protocol: sp.Protocol, From: sp,
		Algorithm:       sp.EffectiveAlgorithm(),
		AffinitySeconds: max(sp.AffinityTimeoutSeconds, 0),
		HasAnyEndpoints: sp.HasAnyEndpoints,
	}
	if sp.HealthCheckNodePort > 0 && sp.HealthCheckNodePort <= 65535 {
		p.HealthCheckNodePort = sp.HealthCheckNodePort
	}
	p.Cluster = b.endpoints("clusterEndpoints", sp.ClusterEndpoints)
	p.Local = b.endpoints("localEndpoints", sp.LocalEndpoints)
	if n := max(len(p.Cluster), len(p.Local)); p.Algorithm == proxy.AlgorithmSourceHash && n > proxy.MaxSourceHashEndpoints {
		b.problem(ReasonSourceHashTooManyEndpoints, "algorithm",
			"source-hash spreads over at most %d endpoints, %d here: using random", proxy.MaxSourceHashEndpoints, n)
	}
	if p.Algorithm == proxy.AlgorithmLeastConnection {
		p.ClusterWeights = LeastConnectionWeights(p.Cluster, conns)
		p.LocalWeights = LeastConnectionWeights(p.Local, conns)
	}

	nodePort := sp.NodePort
	if nodePort < 0 || nodePort > 65535 {
		b.problem(proxy.ReasonInvalidField, "nodePort", "%d is out of range", nodePort)
		nodePort = 0
	}
	extIPs := b.addrs("externalIPs", sp.ExternalIPs)
	lbIPs := b.addrs("loadBalancerIPs", sp.LoadBalancerIPs)

	p.Frontends = make([]Frontend, 0, 1+len(extIPs)+len(lbIPs)+min(int(nodePort), 1))
	p.Frontends = append(p.Frontends, Frontend{Kind: ClusterIP, Addr: sp.ClusterIP, Port: sp.Port, Routes: b.internalRoutes(p)})
	if nodePort == 0 && len(extIPs) == 0 && len(lbIPs) == 0 {
		return p
	}
	ext := b.externalRoutes(p)
	// preserve-destination, as upstream's Windows proxy reads it: the
	// NodePort and the load balancer IPs serve only this node's endpoints,
	// the load balancer IPs keeping the destination; the externalIPs are
	// left as they are.
	np, lb := ext, ext
	if sp.PreserveDestination && cfg.PreserveDestination {
		np = localOnly(p, !sp.ExternalPolicyLocal, false)
		lb = localOnly(p, false, true)
	}
	if nodePort != 0 {
		p.Frontends = append(p.Frontends, Frontend{Kind: NodePort, Port: nodePort, Routes: np})
	}
	for _, a := range extIPs {
		p.Frontends = append(p.Frontends, Frontend{Kind: ExternalIP, Addr: a, Port: sp.Port, Routes: ext})
	}
	ranges := b.ranges(sp.LoadBalancerSourceRanges)
	var allowed []netip.Addr
	if len(ranges) > 0 && slices.ContainsFunc(cfg.NodeIPs, func(ip netip.Addr) bool {
		return slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(ip) })
	}) {
		allowed = lbIPs
	}
	for _, a := range lbIPs {
		p.Frontends = append(p.Frontends, Frontend{Kind: LoadBalancerIP, Addr: a, Port: sp.Port, Routes: lb,
			SourceRanges: ranges, AllowedSources: allowed})
	}
	return p
}

// endpoints keeps the endpoints that can be programmed.
func (b *builder) endpoints(field string, eps []proxy.Endpoint) []proxy.Endpoint {
	ok := func(ep *proxy.Endpoint) bool { return b.cfg.addrOK(ep.IP) && ep.Port > 0 && ep.Port <= 65535 }
	for i := range eps {
		if ok(&eps[i]) {
			continue
		}
		// Slow path: copy the good ones.
		out := make([]proxy.Endpoint, 0, len(eps))
		out = append(out, eps[:i]...)
		for j := i; j < len(eps); j++ {
			if ok(&eps[j]) {
				out = append(out, eps[j])
				continue
			}
			b.problem(proxy.ReasonInvalidEndpoint, fmt.Sprintf("%s[%d]", field, j), "endpoint %s is not a valid %s address and port", eps[j], b.cfg.Family)
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return eps
}

func (b *builder) addrs(field string, as []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for i, a := range as {
		if b.cfg.addrOK(a) {
			out = append(out, a)
		} else {
			b.problem(proxy.ReasonInvalidField, fmt.Sprintf("%s[%d]", field, i), "%q is not a valid %s address", a, b.cfg.Family)
		}
	}
	return out
}

// ranges keeps the source ranges of the family, masked.
func (b *builder) ranges(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.IsValid() && p.Addr().Is6() == (b.cfg.Family == v1.IPv6Protocol) && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// empty is the route when a set has no endpoint: reject when the Service
// has none anywhere, drop otherwise.
func empty(p *Port) Route {
	if p.HasAnyEndpoints {
		return Route{Verdict: Drop}
	}
	return Route{Verdict: Reject}
}

func to(p *Port, s Set, masq bool) Route {
	if len(p.Endpoints(s)) == 0 {
		return empty(p)
	}
	return Route{Verdict: DNAT, Set: s, Masquerade: masq}
}

// internalRoutes decides the ClusterIP: internalTrafficPolicy picks the set;
// with a detect-local mode, connections from outside the cluster's pods
// (the node itself, routed clients) are masqueraded so that answers come
// back through this node; --masquerade-all masquerades pods too.
func (b *builder) internalRoutes(p *Port) [numSources]Route {
	set := Cluster
	if b.sp.InternalPolicyLocal {
		set = Local
	}
	others := b.cfg.MasqueradeAll || b.cfg.PodSources
	return [numSources]Route{
		FromPod:     to(p, set, b.cfg.MasqueradeAll),
		FromNode:    to(p, set, others),
		FromOutside: to(p, set, others),
	}
}

// externalRoutes decides the NodePort, externalIPs and load balancer IPs,
// which share one set of routes. No endpoint anywhere: every source is
// rejected. externalTrafficPolicy Cluster: every source is masqueraded and
// reaches the cluster set. Local: outside clients keep their source and
// reach only this node's endpoints (or are dropped); pods and the node
// itself short-circuit to the cluster set, as if they had gone out to the
// load balancer and come back to some node (the node masqueraded, pods
// not) — when the cluster set has endpoints; otherwise they fall to the
// outside clients' route (the node still masqueraded).
func (b *builder) externalRoutes(p *Port) [numSources]Route {
	if !p.HasAnyEndpoints {
		r := Route{Verdict: Reject}
		return [numSources]Route{r, r, r}
	}
	if !b.sp.ExternalPolicyLocal {
		r := to(p, Cluster, true)
		return [numSources]Route{r, r, r}
	}
	outside := to(p, Local, false)
	if len(p.Cluster) == 0 {
		node := outside
		node.Masquerade = node.Verdict == DNAT
		return [numSources]Route{FromPod: outside, FromNode: node, FromOutside: outside}
	}
	pod := outside
	if b.cfg.PodSources {
		pod = Route{Verdict: DNAT, Set: Cluster}
	}
	return [numSources]Route{
		FromPod:     pod,
		FromNode:    Route{Verdict: DNAT, Set: Cluster, Masquerade: true},
		FromOutside: outside,
	}
}

// localOnly are the routes of a frontend of preserve-destination: every
// source reaches only this node's endpoints (dropped when there is none
// here, rejected when the Service has none anywhere), masqueraded or not,
// the destination kept or not.
func localOnly(p *Port, masq, keep bool) [numSources]Route {
	r := to(p, Local, masq)
	r.PreserveDestination = keep
	return [numSources]Route{r, r, r}
}

// LeastConnectionWeights gives each endpoint of eps the weight 1/(1+c), c
// its established connections in conns (missing: 0), so a new connection
// goes to an endpoint with a probability inversely proportional to its
// load plus one: with two endpoints, one holding 50 connections and one
// none, 51 of 52 new connections go to the idle one. It returns nil (equal
// weights) when conns is empty.
func LeastConnectionWeights(eps []proxy.Endpoint, conns map[netip.AddrPort]int) []float64 {
	if len(eps) == 0 || len(conns) == 0 {
		return nil
	}
	out := make([]float64, len(eps))
	for i, ep := range eps {
		out[i] = 1 / float64(1+max(conns[ep.AddrPort()], 0))
	}
	return out
}
