package plan

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// portResult is what one service port contributes to a plan. Once built it
// is never modified (later plans share it).
type portResult struct {
	port     *intent.Port
	lbs      []*LBSpec
	health   []*LBSpec
	eps      []*EndpointSpec
	warnings []Warning
	dropped  []Dropped
}

// portPlanner plans service ports one at a time under fixed facts.
type portPlanner struct {
	facts   *Facts
	overlay bool
	subnets []subnet
	nodePAs map[netip.Addr]bool // provider addresses: the other nodes' IPs

	// known holds the remote endpoint specs made so far by this Build
	// (shared by every port); prevEP those of the previous plan under the
	// same facts (read only), reused so that unchanged ports share them.
	known  map[netip.Addr]*EndpointSpec
	prevEP map[netip.Addr]*EndpointSpec

	// The port being planned.
	res    *portResult
	epSeen map[netip.Addr]*EndpointSpec
}

type subnet struct {
	prefix netip.Prefix
	pa     netip.Addr
}

func newPortPlanner(f *Facts, prev *Plan) *portPlanner {
	pl := &portPlanner{
		facts:   f,
		overlay: f.Network.IsOverlay(),
		subnets: parseSubnets(f.Network.RemoteSubnets),
		nodePAs: make(map[netip.Addr]bool),
		known:   make(map[netip.Addr]*EndpointSpec),
	}
	if prev != nil {
		pl.prevEP = prev.byIP
	}
	for _, rs := range pl.subnets {
		pl.nodePAs[rs.pa] = true
	}
	return pl
}

func parseSubnets(rs []hns.RemoteSubnet) []subnet {
	var out []subnet
	for _, r := range rs {
		pfx, err1 := netip.ParsePrefix(r.DestinationPrefix)
		pa, err2 := netip.ParseAddr(r.ProviderAddress)
		if err1 != nil || err2 != nil {
			continue // a malformed route cannot match anything
		}
		out = append(out, subnet{prefix: pfx.Masked(), pa: pa.Unmap()})
	}
	// Longest prefix first, so the first match is the most specific.
	sort.SliceStable(out, func(i, j int) bool { return out[i].prefix.Bits() > out[j].prefix.Bits() })
	return out
}

func (b *portPlanner) warn(reason, format string, args ...any) {
	for _, w := range b.res.warnings {
		if w.Reason == reason {
			return
		}
	}
	b.res.warnings = append(b.res.warnings, Warning{Service: b.res.port.Name.NamespacedName, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

func (b *portPlanner) addEndpoint(e *EndpointSpec) {
	if _, ok := b.epSeen[e.IP]; !ok {
		b.epSeen[e.IP] = e
		b.res.eps = append(b.res.eps, e)
	}
}

// ProtocolNumber is HNS's number for a protocol (0 when it has none).
func ProtocolNumber(p v1.Protocol) uint32 {
	switch p {
	case v1.ProtocolTCP:
		return hns.ProtocolTCP
	case v1.ProtocolUDP:
		return hns.ProtocolUDP
	case v1.ProtocolSCTP:
		return hns.ProtocolSCTP
	}
	return 0
}

// ProtocolName names an HNS protocol number ("TCP").
func ProtocolName(p uint32) string {
	switch p {
	case hns.ProtocolTCP:
		return "TCP"
	case hns.ProtocolUDP:
		return "UDP"
	case hns.ProtocolSCTP:
		return "SCTP"
	}
	return "proto" + strconv.Itoa(int(p))
}

// backends is the endpoint set of one load balancer.
type backends struct {
	ips  []netip.Addr
	port uint16
	// nodeOrPublic: some remote backend is another node's IP or outside every
	// remote subnet, so overlay load balancers must use the node IP as source.
	nodeOrPublic bool
}

// backends turns an endpoint set of the intent (validated there) into load
// balancer backends: one target port (HNS load balancers have a single
// internal port), at most MaxEndpointsPerLB. Remote backends become desired
// remote endpoints.
func (b *portPlanner) backends(sp *intent.Port, eps []proxy.Endpoint) backends {
	var out backends
	if len(eps) == 0 {
		return out
	}
	// The most common target port wins; ties go to the lowest port.
	best, ports := b.targetPort(eps)
	if ports > 1 {
		b.warn(ReasonMixedTargetPorts,
			"port %q: endpoints use %d different target ports; an HNS load balancer has one internal port, so only endpoints on port %d get traffic",
			sp.Name.Port, ports, best)
	}
	out.port = uint16(best)
	out.ips = make([]netip.Addr, 0, len(eps))
	for _, e := range eps {
		if e.Port != best {
			continue
		}
		if n := len(out.ips); n > 0 && out.ips[n-1] == e.IP {
			continue // the cache sorts by address; one address once
		}
		if len(out.ips) == MaxEndpointsPerLB {
			b.warn(ReasonTooManyEndpoints,
				"port %q: %d endpoints; HNS load balancers take at most %d, the rest get no traffic", sp.Name.Port, len(eps), MaxEndpointsPerLB)
			break
		}
		out.ips = append(out.ips, e.IP)
		if !e.Local && b.remote(e.IP) {
			out.nodeOrPublic = true
		}
	}
	return out
}

// targetPort returns the most common port of eps (ties: the lowest) and the
// number of distinct ports.
func (b *portPlanner) targetPort(eps []proxy.Endpoint) (best int32, distinct int) {
	same := true
	for i := range eps {
		if best == 0 {
			best = eps[i].Port
		} else if eps[i].Port != best {
			same = false
			break
		}
	}
	if same {
		if best == 0 {
			return 0, 0
		}
		return best, 1
	}
	counts := make(map[int32]int, 2)
	for i := range eps {
		counts[eps[i].Port]++
	}
	best = 0
	for port, n := range counts {
		if n > counts[best] || (n == counts[best] && port < best) {
			best = port
		}
	}
	return best, len(counts)
}

// remote registers a remote endpoint and reports whether its address is
// another node's IP or outside every remote subnet (overlay only).
func (b *portPlanner) remote(ip netip.Addr) (nodeOrPublic bool) {
	if old, ok := b.epSeen[ip]; ok {
		return b.overlay && old.Role == RoleRemote && (old.ProviderAddress == ip || old.ProviderAddress == b.facts.NodeIP)
	}
	spec, ok := b.known[ip]
	if !ok {
		if old := b.prevEP[ip]; old != nil && old.Role == RoleRemote {
			spec, ok = old, true
			b.known[ip] = old
		}
	}
	if ok {
		b.addEndpoint(spec)
		return b.overlay && (spec.ProviderAddress == ip || spec.ProviderAddress == b.facts.NodeIP)
	}
	spec = &EndpointSpec{IP: ip, Role: RoleRemote, MAC: RemoteMAC(ip)}
	b.known[ip] = spec
	if b.overlay {
		switch {
		case b.nodePAs[ip]:
			spec.ProviderAddress = ip
			nodeOrPublic = true
		default:
			spec.ProviderAddress = b.facts.NodeIP
			nodeOrPublic = true
			for _, s := range b.subnets {
				if s.prefix.Contains(ip) {
					spec.ProviderAddress = s.pa
					nodeOrPublic = false
					break
				}
			}
		}
	}
	b.addEndpoint(spec)
	return nodeOrPublic
}

func (b *portPlanner) sourceVIP(be backends) netip.Addr {
	if !b.overlay {
		return netip.Addr{}
	}
	if be.nodeOrPublic {
		return b.facts.NodeIP
	}
	return b.facts.SourceVIP
}

func (b *portPlanner) add(lb *LBSpec) {
	lb.Owners = []proxy.ServicePortName{b.res.port.Name}
	b.res.lbs = append(b.res.lbs, lb.Finish())
}

// plan plans the load balancers of one service port: its intent (every
// routing decision, validation and ownership included, made once for every
// platform), rendered as HNS load balancers. What HNS cannot express is
// reported as a warning: a ClusterIP load balancer applies to pods and the
// node alike, an external one (NodePort, externalIP, load balancer IP)
// serves every client the route of outside clients, there is no reject
// (no load balancer: dropped), no source range filter.
func (b *portPlanner) plan(p *intent.Port) *portResult {
	b.res = &portResult{port: p}
	if b.epSeen == nil {
		b.epSeen = make(map[netip.Addr]*EndpointSpec)
	} else {
		clear(b.epSeen)
	}
	sp := p.From
	f := b.facts
	proto := ProtocolNumber(p.Protocol)

	// What HNS cannot express.
	cip := p.ClusterIP()
	external := len(p.External()) > 0
	var lbFrontends []*intent.Frontend
	for i := range p.Frontends {
		if p.Frontends[i].Kind == intent.LoadBalancerIP {
			lbFrontends = append(lbFrontends, &p.Frontends[i])
		}
	}
	for _, fe := range p.Frontends {
		if rejects(&fe) {
			b.warn(ReasonRejectUnsupported,
				"port %q has no usable endpoint: HNS cannot reject, so connections to it are dropped (no load balancer), not refused", sp.Name.Port)
			b.res.dropped = append(b.res.dropped, Dropped{Service: sp.Name, Kind: fe.Kind, Addr: fe.Addr, Port: uint16(fe.Port), Protocol: proto})
		}
	}
	if len(lbFrontends) > 0 && len(lbFrontends[0].SourceRanges) > 0 {
		b.warn(ReasonSourceRangesIgnored,
			"loadBalancerSourceRanges cannot be enforced by HNS load balancers: the LoadBalancer IPs accept traffic from every source")
	}
	dist := hns.DistributionNone
	if p.AffinitySeconds > 0 {
		if f.Caps.SessionAffinity {
			dist = hns.DistributionSourceIP
			if p.AffinitySeconds != defaultAffinitySeconds {
				b.warn(ReasonAffinityTimeoutIgnored,
					"sessionAffinity ClientIP timeout %ds cannot be set on HNS load balancers; HNS keeps a client on one endpoint for as long as it sees its traffic",
					p.AffinitySeconds)
			}
		} else {
			b.warn(ReasonAffinityUnsupported, "sessionAffinity ClientIP needs HNS 12.0 or later; connections are balanced without affinity")
		}
	}
	// The load-balancing algorithm (session affinity, above, wins: the
	// effective algorithm is then random). HNS has two distributions:
	// its default (spread per connection) and by source address.
	switch alg := p.Algorithm; alg {
	case proxy.AlgorithmSourceHash:
		if f.Caps.SessionAffinity {
			dist = hns.DistributionSourceIP
		} else {
			b.warn(ReasonAlgorithmUnsupported, "%s %s needs HNS 12.0 or later (source IP distribution); connections are balanced by HNS's default distribution", proxy.AnnotationLoadBalancing, alg)
		}
	case proxy.AlgorithmRoundRobin, proxy.AlgorithmLeastConnection:
		b.warn(ReasonAlgorithmUnsupported, "%s %s is not available in HNS load balancers; connections are balanced by HNS's default distribution", proxy.AnnotationLoadBalancing, alg)
	}
	// Outside clients keep their source on an external frontend whose
	// route does not masquerade them (externalTrafficPolicy Local, and the
	// load balancer IPs of preserve-destination): HNS needs DSR for that;
	// keeping the destination too (preserve-destination) needs it as well.
	wantsDSR, keeps := false, false
	for _, fe := range p.External() {
		r := fe.Routes[intent.FromOutside]
		if r.PreserveDestination {
			keeps = true
		} else {
			wantsDSR = wantsDSR || (r.Verdict == intent.DNAT && !r.Masquerade)
		}
	}
	if !f.Caps.DSR {
		if keeps {
			b.warn(ReasonPreserveDestinationUnsupported,
				"preserve-destination without DSR support in HNS: the NodePort and load balancer IPs still go only to endpoints on this node, but the destination is not kept")
		}
		if wantsDSR {
			b.warn(ReasonLocalPolicyWithoutDSR,
				"externalTrafficPolicy Local without DSR support in HNS: traffic still goes only to endpoints on this node, but the client source IP is not preserved")
		}
	}
	var famFlag hns.LoadBalancerFlags
	if f.Family == v1.IPv6Protocol {
		famFlag = hns.LBFlagIPv6
	}
	// The endpoints of a route (none when it does not DNAT).
	of := func(rt intent.Route) backends {
		if rt.Verdict != intent.DNAT {
			return backends{}
		}
		return b.backends(p, p.Endpoints(rt.Set))
	}

	// ClusterIP: one load balancer for pods and the node alike.
	internal := of(cip.Route(intent.FromPod))
	if len(internal.ips) > 0 {
		flags := famFlag
		if f.EnableDSR && f.Caps.DSR {
			flags |= hns.LBFlagDSR
		}
		b.add(&LBSpec{
			Kind: KindClusterIP, FrontendVIPs: []netip.Addr{cip.Addr}, SourceVIP: b.sourceVIP(internal),
			Protocol: proto, InternalPort: internal.port, ExternalPort: uint16(cip.Port), Distribution: dist,
			Flags: flags, Endpoints: internal.ips,
		})
		if b.overlay {
			mac := f.HostMAC
			if mac == "" {
				mac = RemoteMAC(cip.Addr) // a remote endpoint needs one
			}
			b.addEndpoint(&EndpointSpec{IP: cip.Addr, Role: RoleServiceVIP, MAC: mac, ProviderAddress: f.NodeIP})
		}
	}
	if !external {
		return b.res
	}

	// Each external frontend: the endpoints of outside clients' route (HNS
	// applies it to every client), without SNAT where the route does not
	// masquerade, the destination kept where the route keeps it.
	for i := range p.External() {
		fe := &p.External()[i]
		r := fe.Routes[intent.FromOutside]
		keep := r.PreserveDestination && f.Caps.DSR
		if fe.Kind == intent.LoadBalancerIP {
			// Even without endpoints here: the health server then tells
			// the cloud load balancer to avoid this node.
			b.healthCheck(p, fe.Addr, famFlag, keep)
		}
		to := of(r)
		if len(to.ips) == 0 {
			continue
		}
		flags := famFlag
		if !r.Masquerade && f.Caps.DSR {
			flags |= hns.LBFlagDSR
		}
		lb := &LBSpec{
			SourceVIP: b.sourceVIP(to), Protocol: proto, InternalPort: to.port, ExternalPort: uint16(fe.Port),
			Distribution: dist, Flags: flags, Endpoints: to.ips,
		}
		switch fe.Kind {
		case intent.NodePort:
			lb.Kind, lb.PortFlags = KindNodePort, hns.PortFlagVIPExternalIP|hns.PortFlagLocalRoutedVIP
		case intent.ExternalIP:
			lb.Kind, lb.PortFlags = KindExternalIP, hns.PortFlagVIPExternalIP
		case intent.LoadBalancerIP:
			lb.Kind, lb.PortFlags = KindLoadBalancerIP, hns.PortFlagVIPExternalIP
		}
		if fe.Addr.IsValid() {
			lb.FrontendVIPs = []netip.Addr{fe.Addr}
		}
		if keep {
			lb.PortFlags |= hns.PortFlagUseMux | hns.PortFlagPreserveDIP
		}
		b.add(lb)
	}
	return b.res
}

// healthCheck adds the load balancer that lets a cloud load balancer's
// health probe to the ingress IP reach the node's health server.
func (b *portPlanner) healthCheck(p *intent.Port, ip netip.Addr, famFlag hns.LoadBalancerFlags, preserve bool) {
	f := b.facts
	if !f.ForwardHealthCheckVIP {
		return
	}
	port := uint16(p.HealthCheckNodePort)
	if port == 0 {
		port = f.HealthzPort
	}
	if port == 0 {
		return
	}
	if !f.RootEndpointIP.IsValid() {
		b.warn(ReasonHealthCheckNotForwarded,
			"forwardHealthCheckVip is set but the root HNS endpoint is not known: health checks to %s are not forwarded", ip)
		return
	}
	// As upstream: the Service's protocol, on overlay networks the source
	// VIP, and for preserve-destination the mux and the destination kept
	// (without DSR).
	var src netip.Addr
	if b.overlay {
		src = f.SourceVIP
	}
	var pflags hns.PortMappingFlags
	if preserve {
		pflags = hns.PortFlagUseMux | hns.PortFlagPreserveDIP
	}
	lb := &LBSpec{
		Kind: KindHealthCheck, Owners: []proxy.ServicePortName{p.Name}, FrontendVIPs: []netip.Addr{ip},
		SourceVIP: src, Protocol: ProtocolNumber(p.Protocol), InternalPort: port, ExternalPort: port, PortFlags: pflags,
		Flags: famFlag, Endpoints: []netip.Addr{f.RootEndpointIP},
	}
	b.res.health = append(b.res.health, lb.Finish())
}

// rejects reports whether some class of client gets REJECT at fe.
func rejects(fe *intent.Frontend) bool {
	for _, src := range intent.Sources {
		if fe.Route(src).Verdict == intent.Reject {
			return true
		}
	}
	return false
}
