package plan

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
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
	Network hns.Network
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
	Caps      hns.Capabilities
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
// named by address. Its key is its whole content: a load balancer found in
// HNS is kept only if every field matches, those HNS leaves out aside (echo.go).
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
	Distribution hns.Distribution
	PortFlags    hns.PortMappingFlags
	Flags        hns.LoadBalancerFlags
	// Endpoints are the endpoint addresses, sorted and unique.
	Endpoints []netip.Addr

	slot, key string
}

// Finish computes the slot and the key; call it after setting or changing
// any field (Slot, Key and String read them).
func (s *LBSpec) Finish() *LBSpec {
	b := make([]byte, 0, 64+16*len(s.Endpoints))
	if s.Flags&hns.LBFlagIPv6 != 0 {
		b = append(b, "v6 "...)
	} else {
		b = append(b, "v4 "...)
	}
	b = append(b, ProtocolName(s.Protocol)...)
	b = append(b, ' ')
	if len(s.FrontendVIPs) == 0 {
		b = append(b, '*')
	}
	for i, v := range s.FrontendVIPs {
		if i > 0 {
			b = append(b, ',')
		}
		if v.Is6() {
			b = append(b, '[')
			b = v.AppendTo(b)
			b = append(b, ']')
		} else {
			b = v.AppendTo(b)
		}
	}
	b = append(b, ':')
	b = strconv.AppendUint(b, uint64(s.ExternalPort), 10)
	slotLen := len(b)
	b = append(b, " -> "...)
	b = strconv.AppendUint(b, uint64(s.InternalPort), 10)
	b = append(b, " flags="...)
	b = strconv.AppendUint(b, uint64(s.Flags), 10)
	b = append(b, " pflags="...)
	b = strconv.AppendUint(b, uint64(s.PortFlags), 10)
	b = append(b, " dist="...)
	b = strconv.AppendUint(b, uint64(s.Distribution), 10)
	b = append(b, " src="...)
	if s.SourceVIP.IsValid() {
		b = s.SourceVIP.AppendTo(b)
	}
	b = append(b, " eps="...)
	for i, e := range s.Endpoints {
		if i > 0 {
			b = append(b, ',')
		}
		b = e.AppendTo(b)
	}
	s.key = string(b)
	s.slot = s.key[:slotLen]
	return s
}

// Slot identifies the frontend a load balancer occupies: family, protocol,
// frontend VIPs and external port. HNS holds at most one load balancer per slot.
func (s *LBSpec) Slot() string { return s.slot }

// Key is the full identity: the slot plus internal port, flags,
// distribution, source VIP and the sorted endpoint set.
func (s *LBSpec) Key() string { return s.key }

func (s *LBSpec) String() string { return s.key }

// WithEndpoints returns a copy of s with another endpoint set.
func (s *LBSpec) WithEndpoints(eps []netip.Addr) *LBSpec {
	c := *s
	c.Endpoints = eps
	return c.Finish()
}

// HNS renders the load balancer in HNS's schema with these endpoint IDs (or,
// in a dry run, the endpoint addresses).
func (s *LBSpec) HNS(endpointIDs []string) *hns.LoadBalancer {
	lb := &hns.LoadBalancer{
		HostComputeEndpoints: endpointIDs,
		PortMappings: []hns.PortMapping{{
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

// RemoteMACPrefix starts the MAC address kproxy derives for remote endpoints.
const RemoteMACPrefix = "02-11-"

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
func (e *EndpointSpec) HNS(networkID string) *hns.Endpoint {
	ep := &hns.Endpoint{
		Name:               e.Name(),
		HostComputeNetwork: networkID,
		IPConfigurations:   []hns.IPConfig{{IPAddress: e.IP.String()}},
		MacAddress:         e.MAC,
	}
	if e.Remote() {
		ep.Flags = hns.EndpointFlagRemote
		if e.ProviderAddress.IsValid() {
			ep.Policies = []hns.EndpointPolicy{hns.ProviderAddressPolicy(e.ProviderAddress)}
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
	const hex = "0123456789abcdef"
	out := make([]byte, 0, 17)
	out = append(out, RemoteMACPrefix...)
	for i, c := range b[:4] {
		if i > 0 {
			out = append(out, '-')
		}
		out = append(out, hex[c>>4], hex[c&0xf])
	}
	return string(out)
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
	ReasonHealthCheckNotForwarded = "HealthCheckNotForwarded"
	// ReasonPreserveDestinationUnsupported: the annotation needs DSR.
	ReasonPreserveDestinationUnsupported = "PreserveDestinationUnsupported"
	// ReasonAlgorithmUnsupported: HNS has no such load-balancing
	// algorithm (round robin, least connection; source hash before HNS
	// 12.0); its default distribution is used.
	ReasonAlgorithmUnsupported = "LoadBalancingAlgorithmUnsupported"
	// ReasonNoSourceVIP: the overlay network has no source VIP; nothing is
	// programmed for the Service until one is found.
	ReasonNoSourceVIP = "NoSourceVIP"
	// ReasonRejectUnsupported: the intent rejects (no endpoint anywhere);
	// HNS has no reject, so the Service's frontends get no load balancer
	// and their connections are dropped.
	ReasonRejectUnsupported = "RejectUnsupported"
)

// Warning says that HNS cannot do something a Service asks for, or that a
// piece of it was skipped. The backend reports each (Service, Reason) once.
type Warning struct {
	Service types.NamespacedName
	Reason  string
	Message string
	// FromIntent: a problem of the intent view (which the app reports
	// itself), not something only HNS cannot do.
	FromIntent bool `json:"-"`
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
	// Dropped are the frontends the intent rejects (no usable endpoint),
	// which get no load balancer: HNS cannot reject, so what reaches them
	// is dropped. In service port order.
	Dropped []Dropped
	// Err is set when no plan can be made (missing node facts); the rest is then empty.
	Err error

	// byIP indexes Endpoints (built by Build; nil for a hand-made plan).
	byIP map[netip.Addr]*EndpointSpec
	// facts and ports are what a later Build reuses: the facts the plan
	// was made under and each service port's result (never modified once
	// built).
	facts string
	ports map[proxy.ServicePortName]*portResult
}

// Dropped is a frontend of a service port without usable endpoints: the
// intent rejects connections to it, HNS has no load balancer for it, and
// what is sent there is dropped.
type Dropped struct {
	Service proxy.ServicePortName
	Kind    intent.FrontendKind
	// Addr is invalid for a NodePort (every node address).
	Addr     netip.Addr
	Port     uint16
	Protocol uint32
}

// Matches reports whether c is sent to the frontend (nodeAddrs: the node's
// addresses, where NodePorts answer).
func (d Dropped) Matches(c Conn) bool {
	if d.Protocol != c.Protocol || d.Port != c.Dst.Port() {
		return false
	}
	if !d.Addr.IsValid() {
		return slices.Contains(c.NodeAddrs, c.Dst.Addr())
	}
	return d.Addr == c.Dst.Addr()
}

// EndpointIndex returns the plan's endpoints by address.
func (p *Plan) EndpointIndex() map[netip.Addr]*EndpointSpec {
	if p.byIP != nil && len(p.byIP) == len(p.Endpoints) {
		return p.byIP
	}
	m := make(map[netip.Addr]*EndpointSpec, len(p.Endpoints))
	for _, e := range p.Endpoints {
		m[e.IP] = e
	}
	return m
}

// Errors a plan can carry.
var (
	ErrNoSourceVIP = errors.New("overlay networks need a source VIP of the proxy's IP family (--source-vip / winkernel.sourceVip, a Calico_ep endpoint, or a reservation in the node's pod subnet)")
	ErrNoNodeIP    = errors.New("overlay networks need the node IP: none of the node's addresses is of the proxy's IP family")
	ErrNoIPv6      = errors.New("this HNS version does not support IPv6 load balancers (HNS 11.10+ needed)")
)

// Build computes the desired load balancers and endpoints for one family's
// intent view, under the node facts f. It is pure: it reads prev, the plan
// of the previous sync (nil for none), and never changes it. A port's
// result is taken from prev when the view holds the very same *intent.Port
// (the intent Builder keeps the pointer of a port that did not change) and
// the facts are the same, so a sync plans only the ports that changed.
//
// Every routing decision, frontend ownership across Services included, is
// the view's; Build renders it as HNS objects and warns about what HNS
// cannot express. The view's own problems are among the plan's warnings
// (Warning.FromIntent), so that a dry run and explain show them too.
func Build(f *Facts, view *intent.View, prev *Plan) *Plan {
	p := &Plan{Family: f.Family}
	if view == nil || (view.Len() == 0 && len(view.Problems()) == 0) {
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
	p.facts = factsKey(f)
	if prev != nil && prev.facts != p.facts {
		prev = nil // nothing of it holds under other facts
	}
	pl := newPortPlanner(f, prev)
	m := &merger{
		lbs:    make(map[string]*LBSpec, view.Len()*2),
		eps:    make(map[netip.Addr]*EndpointSpec, view.Len()*4),
		warned: make(map[warnKey]bool),
	}
	if overlay {
		m.endpoint(&EndpointSpec{IP: f.SourceVIP, Role: RoleSourceVIP, MAC: f.HostMAC})
	}
	var health []*LBSpec
	p.ports = make(map[proxy.ServicePortName]*portResult, view.Len())
	for _, ip := range view.Sorted() {
		for _, pr := range view.ProblemsOf(ip.Name) {
			m.warn(fromIntent(pr))
		}
		var res *portResult
		if prev != nil {
			if old := prev.ports[ip.Name]; old != nil && old.port == ip {
				res = old
			}
		}
		if res == nil {
			res = pl.plan(ip)
		}
		p.ports[ip.Name] = res
		for _, e := range res.eps {
			m.endpoint(e)
		}
		for _, w := range res.warnings {
			m.warn(w)
		}
		p.Dropped = append(p.Dropped, res.dropped...)
		for _, lb := range res.lbs {
			m.lb(lb)
		}
		health = append(health, res.health...)
	}
	// The problems of ports the view left out entirely.
	for _, pr := range view.Problems() {
		m.warn(fromIntent(pr))
	}
	// Health check load balancers last: a real service port always wins a
	// frontend they would share.
	for _, lb := range health {
		m.lb(lb)
	}

	p.LoadBalancers = make([]*LBSpec, 0, len(m.lbs))
	for _, lb := range m.lbs {
		p.LoadBalancers = append(p.LoadBalancers, lb)
	}
	sort.Slice(p.LoadBalancers, func(i, j int) bool { return p.LoadBalancers[i].slot < p.LoadBalancers[j].slot })
	p.Endpoints = make([]*EndpointSpec, 0, len(m.eps))
	for _, e := range m.eps {
		p.Endpoints = append(p.Endpoints, e)
	}
	sort.Slice(p.Endpoints, func(i, j int) bool { return p.Endpoints[i].IP.Less(p.Endpoints[j].IP) })
	p.byIP = m.eps
	p.Warnings = m.warnings
	sort.SliceStable(p.Warnings, func(i, j int) bool {
		a, c := p.Warnings[i], p.Warnings[j]
		if a.Service != c.Service {
			return a.Service.String() < c.Service.String()
		}
		return a.Reason < c.Reason
	})
	return p
}

// fromIntent is the warning of a problem the intent view reports.
func fromIntent(pr proxy.Unsupported) Warning {
	return Warning{Service: pr.Service, Reason: pr.Reason, Message: pr.Message, FromIntent: true}
}

// factsKey renders the facts a port's result depends on.
func factsKey(f *Facts) string { return fmt.Sprintf("%+v", *f) }

type warnKey struct {
	svc    types.NamespacedName
	reason string
}

// merger assembles the per-port results into one plan.
type merger struct {
	lbs      map[string]*LBSpec
	eps      map[netip.Addr]*EndpointSpec
	warnings []Warning
	warned   map[warnKey]bool
}

func (m *merger) warn(w Warning) {
	k := warnKey{w.Service, w.Reason}
	if !m.warned[k] {
		m.warned[k] = true
		m.warnings = append(m.warnings, w)
	}
}

// endpoint adds a desired endpoint. The source and service VIP endpoints win
// over a remote endpoint with the same address (a configuration error
// outside kproxy's control).
func (m *merger) endpoint(e *EndpointSpec) {
	if old, ok := m.eps[e.IP]; ok && (old.Role != RoleRemote || e.Role == RoleRemote) {
		return
	}
	m.eps[e.IP] = e
}

// lb places a load balancer in its slot. An identical load balancer already
// there gains the owners (in a copy: per-port results are shared across
// plans); a different one keeps the slot (the first service port in name
// order wins) and the newcomer's Service gets a warning.
func (m *merger) lb(lb *LBSpec) {
	old, ok := m.lbs[lb.slot]
	if !ok {
		m.lbs[lb.slot] = lb
		return
	}
	if old.key == lb.key {
		merged := *old
		merged.Owners = append([]proxy.ServicePortName(nil), old.Owners...)
		for _, o := range lb.Owners {
			if !ContainsOwner(merged.Owners, o) {
				merged.Owners = append(merged.Owners, o)
			}
		}
		m.lbs[lb.slot] = &merged
		return
	}
	for _, o := range lb.Owners {
		m.warn(Warning{Service: o.NamespacedName, Reason: ReasonFrontendConflict,
			Message: fmt.Sprintf("%s frontend %s is already used by %s; this one is not programmed", lb.Kind, lb.slot, OwnerNames(old.Owners))})
	}
}

// ContainsOwner reports whether list holds n.
func ContainsOwner(list []proxy.ServicePortName, n proxy.ServicePortName) bool {
	for _, o := range list {
		if o == n {
			return true
		}
	}
	return false
}

// OwnerNames renders service port names, comma-separated.
func OwnerNames(list []proxy.ServicePortName) string {
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
		fmt.Fprintf(&b, "lb %s [%s %s]\n", lb.key, lb.Kind, OwnerNames(lb.Owners))
	}
	for _, w := range p.Warnings {
		fmt.Fprintf(&b, "warning %s %s: %s\n", w.Service, w.Reason, w.Message)
	}
	return b.String()
}
