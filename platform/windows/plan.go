package windows

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// MaxEndpointsPerLB is the most endpoints kproxy puts in one HNS load
// balancer; larger endpoint sets are cut (the lowest addresses are kept) and
// the Service gets a warning.
const MaxEndpointsPerLB = 1024

// defaultAffinitySeconds is Kubernetes' default ClientIP affinity timeout.
const defaultAffinitySeconds = 10800

// Facts are the node facts a plan depends on, gathered by the backend from
// its options, the snapshot's Node and HNS. They are plain data.
type Facts struct {
	Family v1.IPFamily
	// Network supplies the network type and, for overlay, the remote subnet
	// routes (the ID is not used by the plan).
	Network Network
	// NodeIP is this node's address of Family: the provider address of
	// remote endpoints outside every remote subnet and the source VIP of
	// overlay load balancers whose backends are node or public IPs.
	NodeIP netip.Addr
	// HostMAC is the MAC address of the interface holding NodeIP, given to the
	// source VIP and service VIP endpoints on overlay networks ("" lets HNS choose).
	HostMAC string
	// SourceVIP is the configured source VIP (--source-vip); required on overlay.
	SourceVIP netip.Addr
	// EnableDSR asks for direct server return on ClusterIP load balancers.
	EnableDSR bool
	Caps      Capabilities
	// ForwardHealthCheckVIP adds, for each LoadBalancer ingress IP, a load
	// balancer forwarding the health check port to RootEndpointIP.
	ForwardHealthCheckVIP bool
	// HealthzPort is the proxy's own health port, used when a LoadBalancer
	// Service has no healthCheckNodePort (0: no forwarding then).
	HealthzPort uint16
	// RootEndpointIP is the address of the root HNS endpoint
	// (--root-hnsendpoint-name); invalid when it is not known.
	RootEndpointIP netip.Addr
}

// LBKind says which frontend of a service port a load balancer serves.
type LBKind string

// Load balancer kinds.
const (
	KindClusterIP      LBKind = "ClusterIP"
	KindNodePort       LBKind = "NodePort"
	KindExternalIP     LBKind = "ExternalIP"
	KindLoadBalancerIP LBKind = "LoadBalancerIP"
	KindHealthCheck    LBKind = "HealthCheck"
)

// LBSpec is one desired (or observed) HNS load balancer, with its endpoints
// named by address. Its identity is its whole content: a load balancer found
// in HNS is kept only if every field matches.
type LBSpec struct {
	// Kind and Owners describe why the load balancer exists; they are not part
	// of its identity (an observed load balancer has neither).
	Kind   LBKind                  `json:",omitempty"`
	Owners []proxy.ServicePortName `json:"-"`

	FrontendVIPs []netip.Addr
	SourceVIP    netip.Addr
	Protocol     uint32
	InternalPort uint16
	ExternalPort uint16
	Distribution Distribution
	PortFlags    PortMappingFlags
	Flags        LoadBalancerFlags
	// Endpoints are the endpoint addresses, sorted and unique.
	Endpoints []netip.Addr

	slot, key string
}

// finish computes the slot and the key; call after any field change.
func (s *LBSpec) finish() *LBSpec {
	var b strings.Builder
	b.Grow(48 + 16*len(s.Endpoints))
	if s.Flags&LBFlagIPv6 != 0 {
		b.WriteString("v6 ")
	} else {
		b.WriteString("v4 ")
	}
	b.WriteString(protocolName(s.Protocol))
	b.WriteByte(' ')
	if len(s.FrontendVIPs) == 0 {
		b.WriteByte('*')
	}
	for i, v := range s.FrontendVIPs {
		if i > 0 {
			b.WriteByte(',')
		}
		if v.Is6() {
			b.WriteByte('[')
			b.WriteString(v.String())
			b.WriteByte(']')
		} else {
			b.WriteString(v.String())
		}
	}
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(int(s.ExternalPort)))
	s.slot = b.String()
	b.WriteString(" -> ")
	b.WriteString(strconv.Itoa(int(s.InternalPort)))
	fmt.Fprintf(&b, " flags=%d pflags=%d dist=%d src=", s.Flags, s.PortFlags, s.Distribution)
	if s.SourceVIP.IsValid() {
		b.WriteString(s.SourceVIP.String())
	}
	b.WriteString(" eps=")
	for i, e := range s.Endpoints {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.String())
	}
	s.key = b.String()
	return s
}

// Slot identifies the frontend a load balancer occupies: family, protocol,
// frontend VIPs and external port. HNS holds at most one load balancer per slot.
func (s *LBSpec) Slot() string { return s.slot }

// Key is the full identity: the slot plus internal port, flags,
// distribution, source VIP and the sorted endpoint set.
func (s *LBSpec) Key() string { return s.key }

func (s *LBSpec) String() string { return s.key }

// withEndpoints returns a copy of s with another endpoint set.
func (s *LBSpec) withEndpoints(eps []netip.Addr) *LBSpec {
	c := *s
	c.Endpoints = eps
	return c.finish()
}

// HNS renders the load balancer in HNS's schema with these endpoint IDs (or,
// in a dry run, the endpoint addresses).
func (s *LBSpec) HNS(endpointIDs []string) *LoadBalancer {
	lb := &LoadBalancer{
		HostComputeEndpoints: endpointIDs,
		PortMappings: []PortMapping{{
			Protocol:         s.Protocol,
			InternalPort:     s.InternalPort,
			ExternalPort:     s.ExternalPort,
			DistributionType: s.Distribution,
			Flags:            s.PortFlags,
		}},
		Flags: s.Flags,
	}
	if s.SourceVIP.IsValid() {
		lb.SourceVIP = s.SourceVIP.String()
	}
	for _, v := range s.FrontendVIPs {
		lb.FrontendVIPs = append(lb.FrontendVIPs, v.String())
	}
	return lb
}

// EndpointRole says why kproxy wants an HNS endpoint.
type EndpointRole string

// Endpoint roles.
const (
	// RoleRemote is a backend on another node (a remote endpoint).
	RoleRemote EndpointRole = "Remote"
	// RoleServiceVIP is the remote endpoint holding a ClusterIP on overlay networks.
	RoleServiceVIP EndpointRole = "ServiceVIP"
	// RoleSourceVIP is the local endpoint holding the source VIP on overlay networks.
	RoleSourceVIP EndpointRole = "SourceVIP"
)

// EndpointNamePrefix starts the name of every HNS endpoint kproxy creates;
// kproxy deletes endpoints it no longer needs only if they carry it (or, for
// remote endpoints, the 02-11 MAC prefix that kproxy and kube-proxy derive
// from the address).
const EndpointNamePrefix = "kproxy-"

// remoteMACPrefix starts the MAC address kproxy derives for remote endpoints.
const remoteMACPrefix = "02-11-"

// EndpointSpec is an HNS endpoint kproxy must make exist.
type EndpointSpec struct {
	IP   netip.Addr
	Role EndpointRole
	MAC  string
	// ProviderAddress is the host that holds the endpoint (overlay remote
	// endpoints only; invalid otherwise).
	ProviderAddress netip.Addr
}

// Remote reports whether the endpoint is created as a remote endpoint.
func (e *EndpointSpec) Remote() bool { return e.Role != RoleSourceVIP }

// Name is the HNS name kproxy gives the endpoint.
func (e *EndpointSpec) Name() string {
	return EndpointNamePrefix + strings.ToLower(string(e.Role)) + "-" + e.IP.String()
}

// HNS renders the endpoint in HNS's schema for a network.
func (e *EndpointSpec) HNS(networkID string) *Endpoint {
	ep := &Endpoint{
		Name:               e.Name(),
		HostComputeNetwork: networkID,
		IPConfigurations:   []IPConfig{{IPAddress: e.IP.String()}},
		MacAddress:         e.MAC,
	}
	if e.Remote() {
		ep.Flags = EndpointFlagRemote
		if e.ProviderAddress.IsValid() {
			ep.Policies = []EndpointPolicy{providerAddressPolicy(e.ProviderAddress)}
		}
	}
	return ep
}

// RemoteMAC derives the MAC address of a remote endpoint from its address:
// 02-11 followed by the four bytes of an IPv4 address (as kube-proxy does),
// or by a 32-bit FNV-1a hash of an IPv6 address (whose last four bytes alone
// collide across pod subnets). It is never sent on the wire; HNS only needs
// it to be stable and mostly unique.
func RemoteMAC(ip netip.Addr) string {
	b := ip.AsSlice()
	if len(b) != 4 {
		h := fnv.New32a()
		h.Write(b)
		b = h.Sum(nil)
	}
	return fmt.Sprintf("%s%02x-%02x-%02x-%02x", remoteMACPrefix, b[0], b[1], b[2], b[3])
}

// Warning reasons: what HNS cannot do for a Service.
const (
	ReasonSourceRangesIgnored     = "LoadBalancerSourceRangesIgnored"
	ReasonAffinityTimeoutIgnored  = "SessionAffinityTimeoutIgnored"
	ReasonAffinityUnsupported     = "SessionAffinityUnsupported"
	ReasonLocalPolicyWithoutDSR   = "ExternalTrafficPolicyLocalWithoutDSR"
	ReasonTooManyEndpoints        = "TooManyEndpoints"
	ReasonMixedTargetPorts        = "MixedTargetPorts"
	ReasonFrontendConflict        = "FrontendConflict"
	ReasonInvalid                 = "InvalidServicePort"
	ReasonInvalidEndpoint         = "InvalidEndpoint"
	ReasonHealthCheckNotForwarded = "HealthCheckNotForwarded"
)

// Warning says that HNS cannot do something a Service asks for, or that a
// piece of it was skipped. The backend reports each (Service, Reason) once.
type Warning struct {
	Service types.NamespacedName
	Reason  string
	Message string
}

// Plan is the desired HNS state for one IP family: deterministic, sorted,
// and free of HNS IDs.
type Plan struct {
	Family v1.IPFamily
	// LoadBalancers, sorted by slot; at most one per slot.
	LoadBalancers []*LBSpec
	// Endpoints kproxy must create (or find): remote backends, and on overlay
	// networks the source VIP and service VIP endpoints. Sorted by address.
	// Load balancer endpoints not listed here are local endpoints, which the
	// CNI creates.
	Endpoints []*EndpointSpec
	// Warnings, sorted by Service then reason; one per (Service, reason).
	Warnings []Warning
	// Err is set when no plan can be made (missing node facts); the rest is then empty.
	Err error
}

// Errors a plan can carry.
var (
	ErrNoSourceVIP = errors.New("overlay networks need a source VIP (--source-vip / winkernel.sourceVip) of the proxy's IP family")
	ErrNoNodeIP    = errors.New("overlay networks need the node IP: none of the node's addresses is of the proxy's IP family")
	ErrNoIPv6      = errors.New("this HNS version does not support IPv6 load balancers (HNS 11.10+ needed)")
)

// BuildPlan computes the desired load balancers and endpoints for one family view.
func BuildPlan(f *Facts, view *proxy.FamilyView) *Plan {
	p := &Plan{Family: f.Family}
	if view == nil || view.Len() == 0 {
		return p
	}
	overlay := f.Network.IsOverlay()
	switch {
	case f.Family == v1.IPv6Protocol && !f.Caps.IPv6:
		p.Err = ErrNoIPv6
		return p
	case overlay && !f.SourceVIP.IsValid():
		p.Err = ErrNoSourceVIP
		return p
	case overlay && !f.NodeIP.IsValid():
		p.Err = ErrNoNodeIP
		return p
	}
	b := &planner{
		facts:   f,
		overlay: overlay,
		lbs:     make(map[string]*LBSpec, view.Len()*2),
		eps:     make(map[netip.Addr]*EndpointSpec),
		warned:  make(map[warnKey]int),
		subnets: parseSubnets(f.Network.RemoteSubnets),
		nodePAs: make(map[netip.Addr]bool),
	}
	for _, rs := range b.subnets {
		b.nodePAs[rs.pa] = true
	}
	if overlay {
		b.addEndpoint(&EndpointSpec{IP: f.SourceVIP, Role: RoleSourceVIP, MAC: f.HostMAC})
	}
	for _, sp := range view.Sorted() {
		b.port(sp)
	}
	b.healthChecks()

	p.LoadBalancers = make([]*LBSpec, 0, len(b.lbs))
	for _, lb := range b.lbs {
		p.LoadBalancers = append(p.LoadBalancers, lb)
	}
	sort.Slice(p.LoadBalancers, func(i, j int) bool { return p.LoadBalancers[i].slot < p.LoadBalancers[j].slot })
	p.Endpoints = make([]*EndpointSpec, 0, len(b.eps))
	for _, e := range b.eps {
		p.Endpoints = append(p.Endpoints, e)
	}
	sort.Slice(p.Endpoints, func(i, j int) bool { return p.Endpoints[i].IP.Less(p.Endpoints[j].IP) })
	p.Warnings = b.warnings
	sort.SliceStable(p.Warnings, func(i, j int) bool {
		a, c := p.Warnings[i], p.Warnings[j]
		if a.Service != c.Service {
			return a.Service.String() < c.Service.String()
		}
		return a.Reason < c.Reason
	})
	return p
}

type warnKey struct {
	svc    types.NamespacedName
	reason string
}

type subnet struct {
	prefix netip.Prefix
	pa     netip.Addr
}

func parseSubnets(rs []RemoteSubnet) []subnet {
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

type planner struct {
	facts    *Facts
	overlay  bool
	lbs      map[string]*LBSpec
	eps      map[netip.Addr]*EndpointSpec
	subnets  []subnet
	nodePAs  map[netip.Addr]bool // provider addresses: the other nodes' IPs
	warnings []Warning
	warned   map[warnKey]int
	// pending health check load balancers, added after every service port.
	health []*LBSpec
}

func (b *planner) warn(svc types.NamespacedName, reason, format string, args ...any) {
	k := warnKey{svc, reason}
	if _, ok := b.warned[k]; ok {
		return
	}
	b.warned[k] = len(b.warnings)
	b.warnings = append(b.warnings, Warning{Service: svc, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

func (b *planner) addEndpoint(e *EndpointSpec) {
	if _, ok := b.eps[e.IP]; !ok {
		b.eps[e.IP] = e
	}
}

func protocolNumber(p v1.Protocol) uint32 {
	switch p {
	case v1.ProtocolTCP:
		return ProtocolTCP
	case v1.ProtocolUDP:
		return ProtocolUDP
	case v1.ProtocolSCTP:
		return ProtocolSCTP
	}
	return 0
}

func protocolName(p uint32) string {
	switch p {
	case ProtocolTCP:
		return "TCP"
	case ProtocolUDP:
		return "UDP"
	case ProtocolSCTP:
		return "SCTP"
	}
	return "proto" + strconv.Itoa(int(p))
}

func (b *planner) familyOK(a netip.Addr) bool {
	return a.IsValid() && a.Is6() == (b.facts.Family == v1.IPv6Protocol) && !a.Is4In6()
}

// backends is the endpoint set of one load balancer.
type backends struct {
	ips  []netip.Addr
	port uint16
	// nodeOrPublic: some remote backend is another node's IP or outside every
	// remote subnet, so overlay load balancers must use the node IP as source.
	nodeOrPublic bool
}

// backends turns the cache's endpoint list into load balancer backends:
// valid addresses of the family, one target port (HNS load balancers have a
// single internal port), at most MaxEndpointsPerLB. Remote backends become
// desired remote endpoints.
func (b *planner) backends(sp *proxy.ServicePort, eps []proxy.Endpoint) backends {
	svc := sp.Name.NamespacedName
	var out backends
	if len(eps) == 0 {
		return out
	}
	// The most common target port wins; ties go to the lowest port.
	counts := make(map[int32]int, 1)
	for _, e := range eps {
		if b.familyOK(e.IP) && e.Port > 0 && e.Port <= 65535 {
			counts[e.Port]++
		}
	}
	var best int32
	for port, n := range counts {
		if n > counts[best] || (n == counts[best] && port < best) {
			best = port
		}
	}
	if len(counts) > 1 {
		b.warn(svc, ReasonMixedTargetPorts,
			"port %q: endpoints use %d different target ports; an HNS load balancer has one internal port, so only endpoints on port %d get traffic",
			sp.Name.Port, len(counts), best)
	}
	out.port = uint16(best)
	out.ips = make([]netip.Addr, 0, len(eps))
	for _, e := range eps {
		if !b.familyOK(e.IP) || e.Port <= 0 || e.Port > 65535 {
			b.warn(svc, ReasonInvalidEndpoint, "port %q: endpoint %s skipped: address or port invalid for %s", sp.Name.Port, e.String(), b.facts.Family)
			continue
		}
		if e.Port != best {
			continue
		}
		if n := len(out.ips); n > 0 && out.ips[n-1] == e.IP {
			continue // the cache sorts by address; one address once
		}
		if len(out.ips) == MaxEndpointsPerLB {
			b.warn(svc, ReasonTooManyEndpoints,
				"port %q: %d endpoints; HNS load balancers take at most %d, the rest get no traffic", sp.Name.Port, len(eps), MaxEndpointsPerLB)
			break
		}
		out.ips = append(out.ips, e.IP)
		if !e.Local {
			if b.remote(e.IP) {
				out.nodeOrPublic = true
			}
		}
	}
	return out
}

// remote registers a remote endpoint and reports whether its address is
// another node's IP or outside every remote subnet (overlay only).
func (b *planner) remote(ip netip.Addr) (nodeOrPublic bool) {
	spec := &EndpointSpec{IP: ip, Role: RoleRemote, MAC: RemoteMAC(ip)}
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
	if old, ok := b.eps[ip]; ok && old.Role != RoleRemote {
		// The address is also a service or source VIP: a configuration
		// error outside our control; the VIP endpoint wins.
		return nodeOrPublic
	}
	b.eps[ip] = spec
	return nodeOrPublic
}

func (b *planner) sourceVIP(be backends) netip.Addr {
	if !b.overlay {
		return netip.Addr{}
	}
	if be.nodeOrPublic {
		return b.facts.NodeIP
	}
	return b.facts.SourceVIP
}

// port plans the load balancers of one service port.
func (b *planner) port(sp *proxy.ServicePort) {
	f := b.facts
	svc := sp.Name.NamespacedName
	proto := protocolNumber(sp.Protocol)
	switch {
	case proto == 0:
		b.warn(svc, ReasonInvalid, "port %q skipped: protocol %q is not TCP, UDP or SCTP", sp.Name.Port, sp.Protocol)
		return
	case !b.familyOK(sp.ClusterIP):
		b.warn(svc, ReasonInvalid, "port %q skipped: clusterIP %q is not a valid %s address", sp.Name.Port, sp.ClusterIP, f.Family)
		return
	case sp.Port <= 0 || sp.Port > 65535:
		b.warn(svc, ReasonInvalid, "port %q skipped: port %d out of range", sp.Name.Port, sp.Port)
		return
	case sp.NodePort < 0 || sp.NodePort > 65535:
		b.warn(svc, ReasonInvalid, "port %q skipped: nodePort %d out of range", sp.Name.Port, sp.NodePort)
		return
	}

	// What HNS cannot express.
	if len(sp.LoadBalancerSourceRanges) > 0 {
		b.warn(svc, ReasonSourceRangesIgnored,
			"loadBalancerSourceRanges cannot be enforced by HNS load balancers: the LoadBalancer IPs accept traffic from every source")
	}
	dist := DistributionNone
	if sp.AffinityTimeoutSeconds > 0 {
		if f.Caps.SessionAffinity {
			dist = DistributionSourceIP
			if sp.AffinityTimeoutSeconds != defaultAffinitySeconds {
				b.warn(svc, ReasonAffinityTimeoutIgnored,
					"sessionAffinity ClientIP timeout %ds cannot be set on HNS load balancers; HNS keeps a client on one endpoint for as long as it sees its traffic",
					sp.AffinityTimeoutSeconds)
			}
		} else {
			b.warn(svc, ReasonAffinityUnsupported, "sessionAffinity ClientIP needs HNS 12.0 or later; connections are balanced without affinity")
		}
	}
	extDSR := false
	if sp.ExternalPolicyLocal && sp.ExternallyAccessible() {
		if f.Caps.DSR {
			extDSR = true
		} else {
			b.warn(svc, ReasonLocalPolicyWithoutDSR,
				"externalTrafficPolicy Local without DSR support in HNS: traffic still goes only to endpoints on this node, but the client source IP is not preserved")
		}
	}
	var famFlag LoadBalancerFlags
	if f.Family == v1.IPv6Protocol {
		famFlag = LBFlagIPv6
	}

	// ClusterIP.
	internal := b.backends(sp, sp.InternalEndpoints())
	if len(internal.ips) > 0 {
		flags := famFlag
		if f.EnableDSR && f.Caps.DSR {
			flags |= LBFlagDSR
		}
		b.add(sp, &LBSpec{
			Kind: KindClusterIP, FrontendVIPs: []netip.Addr{sp.ClusterIP}, SourceVIP: b.sourceVIP(internal),
			Protocol: proto, InternalPort: internal.port, ExternalPort: uint16(sp.Port), Distribution: dist,
			Flags: flags, Endpoints: internal.ips,
		})
		if b.overlay {
			mac := f.HostMAC
			if mac == "" {
				mac = RemoteMAC(sp.ClusterIP) // a remote endpoint needs one
			}
			b.addEndpoint(&EndpointSpec{IP: sp.ClusterIP, Role: RoleServiceVIP, MAC: mac, ProviderAddress: f.NodeIP})
		}
	}
	if !sp.ExternallyAccessible() {
		return
	}

	// External frontends share one endpoint set.
	var external backends
	if sp.ExternalPolicyLocal == sp.InternalPolicyLocal {
		external = internal
	} else {
		external = b.backends(sp, sp.ExternalEndpoints())
	}
	for _, ip := range sp.LoadBalancerIPs {
		if b.familyOK(ip) {
			// Even without endpoints here: the health server then tells the
			// cloud load balancer to avoid this node.
			b.healthCheck(sp, ip, famFlag)
		}
	}
	if len(external.ips) == 0 {
		return
	}
	flags := famFlag
	if extDSR {
		flags |= LBFlagDSR
	}
	src := b.sourceVIP(external)
	mk := func(kind LBKind, vip netip.Addr, port int32, pflags PortMappingFlags) *LBSpec {
		lb := &LBSpec{
			Kind: kind, SourceVIP: src, Protocol: proto, InternalPort: external.port, ExternalPort: uint16(port),
			Distribution: dist, PortFlags: pflags, Flags: flags, Endpoints: external.ips,
		}
		if vip.IsValid() {
			lb.FrontendVIPs = []netip.Addr{vip}
		}
		return lb
	}
	if sp.NodePort > 0 {
		b.add(sp, mk(KindNodePort, netip.Addr{}, sp.NodePort, PortFlagVIPExternalIP|PortFlagLocalRoutedVIP))
	}
	for _, ip := range sp.ExternalIPs {
		if !b.familyOK(ip) {
			b.warn(svc, ReasonInvalid, "port %q: externalIP %s skipped: not a valid %s address", sp.Name.Port, ip, f.Family)
			continue
		}
		b.add(sp, mk(KindExternalIP, ip, sp.Port, PortFlagVIPExternalIP))
	}
	for _, ip := range sp.LoadBalancerIPs {
		if !b.familyOK(ip) {
			b.warn(svc, ReasonInvalid, "port %q: LoadBalancer IP %s skipped: not a valid %s address", sp.Name.Port, ip, f.Family)
			continue
		}
		b.add(sp, mk(KindLoadBalancerIP, ip, sp.Port, PortFlagVIPExternalIP))
	}
}

// healthCheck queues the load balancer that lets a cloud load balancer's
// health probe to the ingress IP reach the node's health server.
func (b *planner) healthCheck(sp *proxy.ServicePort, ip netip.Addr, famFlag LoadBalancerFlags) {
	f := b.facts
	if !f.ForwardHealthCheckVIP {
		return
	}
	port := uint16(sp.HealthCheckNodePort)
	if port == 0 {
		port = f.HealthzPort
	}
	if port == 0 {
		return
	}
	if !f.RootEndpointIP.IsValid() {
		b.warn(sp.Name.NamespacedName, ReasonHealthCheckNotForwarded,
			"forwardHealthCheckVip is set but the root HNS endpoint is not known: health checks to %s are not forwarded", ip)
		return
	}
	lb := &LBSpec{
		Kind: KindHealthCheck, Owners: []proxy.ServicePortName{sp.Name}, FrontendVIPs: []netip.Addr{ip},
		Protocol: ProtocolTCP, InternalPort: port, ExternalPort: port, Flags: famFlag,
		Endpoints: []netip.Addr{f.RootEndpointIP},
	}
	b.health = append(b.health, lb.finish())
}

// healthChecks adds the queued health check load balancers after every
// service port, so a real service port always wins a conflicting frontend.
func (b *planner) healthChecks() {
	for _, lb := range b.health {
		b.add(nil, lb)
	}
}

// add places a load balancer in its slot. An identical load balancer already
// there just gains an owner; a different one keeps the slot (the first service
// port in name order wins) and the newcomer's Service gets a warning.
func (b *planner) add(sp *proxy.ServicePort, lb *LBSpec) {
	if lb.key == "" {
		lb.finish()
	}
	if sp != nil {
		lb.Owners = []proxy.ServicePortName{sp.Name}
	}
	old, ok := b.lbs[lb.slot]
	if !ok {
		b.lbs[lb.slot] = lb
		return
	}
	if old.key == lb.key {
		for _, o := range lb.Owners {
			if !containsOwner(old.Owners, o) {
				old.Owners = append(old.Owners, o)
			}
		}
		return
	}
	for _, o := range lb.Owners {
		b.warn(o.NamespacedName, ReasonFrontendConflict,
			"%s frontend %s is already used by %s; this one is not programmed", lb.Kind, lb.slot, ownerNames(old.Owners))
	}
}

func containsOwner(list []proxy.ServicePortName, n proxy.ServicePortName) bool {
	for _, o := range list {
		if o == n {
			return true
		}
	}
	return false
}

func ownerNames(list []proxy.ServicePortName) string {
	s := make([]string, len(list))
	for i, o := range list {
		s[i] = o.String()
	}
	return strings.Join(s, ", ")
}

// String renders the plan, one object per line, for logs and golden tests.
func (p *Plan) String() string {
	var b strings.Builder
	if p.Err != nil {
		fmt.Fprintf(&b, "error: %v\n", p.Err)
	}
	for _, e := range p.Endpoints {
		fmt.Fprintf(&b, "endpoint %s %s mac=%s", e.Role, e.IP, e.MAC)
		if e.ProviderAddress.IsValid() {
			fmt.Fprintf(&b, " pa=%s", e.ProviderAddress)
		}
		b.WriteByte('\n')
	}
	for _, lb := range p.LoadBalancers {
		fmt.Fprintf(&b, "lb %s [%s %s]\n", lb.key, lb.Kind, ownerNames(lb.Owners))
	}
	for _, w := range p.Warnings {
		fmt.Fprintf(&b, "warning %s %s: %s\n", w.Service, w.Reason, w.Message)
	}
	return b.String()
}
