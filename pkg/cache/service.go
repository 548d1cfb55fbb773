package cache

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Problem is one piece of bad input found while reading an object: the object
// and field it came from and why it was skipped. The cache logs each problem
// once per object change.
type Problem struct {
	Kind   string // "Service", "EndpointSlice" or "Node"
	Object types.NamespacedName
	Field  string
	Reason string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s %s: %s: %s", p.Kind, p.Object, p.Field, p.Reason)
}

// defaultAffinityTimeout is the ClientIP affinity timeout when none is given (3 hours).
const defaultAffinityTimeout = 10800

// maxAffinityTimeout is the largest timeout the API accepts (1 day).
const maxAffinityTimeout = 86400

// annotationPreserveDestination is the annotation upstream's Windows proxy
// reads to keep the destination IP of external traffic (see
// proxy.ServicePort.PreserveDestination).
const annotationPreserveDestination = "preserve-destination"

// annotationSourceRanges is the legacy annotation upstream honours when
// spec.loadBalancerSourceRanges is empty.
const annotationSourceRanges = "service.beta.kubernetes.io/load-balancer-source-ranges"

// AnnotationLoadBalancing names the Service annotation that picks the
// load-balancing algorithm of all its ports (see proxy.Algorithm).
const AnnotationLoadBalancing = proxy.AnnotationLoadBalancing

// ServiceAnnotations are the Service annotations the cache reads; a source
// that trims objects must keep them.
var ServiceAnnotations = []string{annotationPreserveDestination, annotationSourceRanges, AnnotationLoadBalancing}

const annotationLoadBalancingField = "metadata.annotations[" + AnnotationLoadBalancing + "]"

// svcInfo is the part of a Service the proxy needs, parsed and validated once
// when the Service arrives. It holds no endpoints.
type svcInfo struct {
	name types.NamespacedName
	typ  v1.ServiceType
	// clusterIPs by family index (see familyIndex); invalid when absent.
	clusterIPs   [2]netip.Addr
	ports        []svcPortInfo
	externalIPs  []netip.Addr // sorted, both families
	lbIPs        []netip.Addr // sorted, both families, ipMode VIP or unset
	sourceRanges []netip.Prefix
	// affinityTimeout > 0 means ClientIP affinity.
	affinityTimeout     int32
	externalLocal       bool // externalTrafficPolicy: Local
	internalLocal       bool // internalTrafficPolicy: Local
	healthCheckNodePort int32
	trafficDistribution string
	preserveDestination bool
	algorithm           proxy.Algorithm
}

type svcPortInfo struct {
	name     string
	port     int32
	protocol v1.Protocol
	nodePort int32
}

func familyIndex(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

var families = [2]v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// parseIP parses one address as the API spells it; IPv4-mapped IPv6 and zones are refused.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("not an IP address: %q", s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("IP address with a zone: %q", s)
	}
	if a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("IPv4-mapped IPv6 address: %q", s)
	}
	if a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("unspecified address: %q", s)
	}
	return a, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not a CIDR: %q", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("IPv4-mapped IPv6 CIDR: %q", s)
	}
	return p.Masked(), nil
}

func validPort(p int32) bool { return p >= 1 && p <= 65535 }

func validProtocol(p v1.Protocol) bool {
	return p == v1.ProtocolTCP || p == v1.ProtocolUDP || p == v1.ProtocolSCTP
}

// parseService reads a Service. It returns nil when the Service produces
// nothing on a node (ExternalName, headless, no usable ClusterIP, no usable
// port), with the problems found on the way. Bad parts of a Service (one junk
// externalIP, one out-of-range port) are dropped, the rest is kept.
func parseService(svc *v1.Service) (*svcInfo, []Problem) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	var problems []Problem
	bad := func(field, format string, args ...any) {
		problems = append(problems, Problem{Kind: "Service", Object: name, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if p := nameProblem("Service", name,
		nameCheck{"metadata.namespace", svc.Namespace, dnsLabel},
		nameCheck{"metadata.name", svc.Name, dnsLabel}); p != nil {
		return nil, []Problem{*p}
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return nil, nil
	}
	if svc.Spec.ClusterIP == v1.ClusterIPNone {
		return nil, nil // headless
	}
	info := &svcInfo{name: name, typ: svc.Spec.Type}
	if info.typ == "" {
		info.typ = v1.ServiceTypeClusterIP
	}

	ips := svc.Spec.ClusterIPs
	field := "spec.clusterIPs"
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips, field = []string{svc.Spec.ClusterIP}, "spec.clusterIP"
	}
	for i, s := range ips {
		a, err := parseIP(s)
		if err != nil {
			bad(fmt.Sprintf("%s[%d]", field, i), "%v", err)
			continue
		}
		if info.clusterIPs[familyIndex(a)].IsValid() {
			bad(fmt.Sprintf("%s[%d]", field, i), "second ClusterIP of the same family %s ignored", a)
			continue
		}
		info.clusterIPs[familyIndex(a)] = a
	}
	if !info.clusterIPs[0].IsValid() && !info.clusterIPs[1].IsValid() {
		return nil, problems // none allocated yet, or none usable
	}

	exposesNodePorts := info.typ == v1.ServiceTypeNodePort || info.typ == v1.ServiceTypeLoadBalancer
	seen := map[string]bool{}
	for i, p := range svc.Spec.Ports {
		f := func(sub string) string { return fmt.Sprintf("spec.ports[%d].%s", i, sub) }
		proto := p.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if !validProtocol(proto) {
			bad(f("protocol"), "unsupported protocol %q", p.Protocol)
			continue
		}
		if !validPort(p.Port) {
			bad(f("port"), "port %d out of range 1-65535", p.Port)
			continue
		}
		if p.Name != "" {
			if msgs := dnsLabel(p.Name); len(msgs) > 0 {
				bad(f("name"), "invalid port name %q: %s", p.Name, strings.Join(msgs, "; "))
				continue
			}
		}
		key := p.Name + "/" + string(proto)
		if seen[key] {
			bad(f("name"), "duplicate port name %q for %s", p.Name, proto)
			continue
		}
		seen[key] = true
		pi := svcPortInfo{name: p.Name, port: p.Port, protocol: proto}
		if exposesNodePorts && p.NodePort != 0 {
			if validPort(p.NodePort) {
				pi.nodePort = p.NodePort
			} else {
				bad(f("nodePort"), "nodePort %d out of range 1-65535, ignored", p.NodePort)
			}
		}
		info.ports = append(info.ports, pi)
	}
	if len(info.ports) == 0 {
		return nil, problems
	}

	for i, s := range svc.Spec.ExternalIPs {
		a, err := parseIP(s)
		if err != nil {
			bad(fmt.Sprintf("spec.externalIPs[%d]", i), "%v", err)
			continue
		}
		info.externalIPs = append(info.externalIPs, a)
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress: nothing to capture on the node
		}
		if ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP {
			continue // ipMode Proxy: the load balancer forwards to the node, not to the VIP
		}
		a, err := parseIP(ing.IP)
		if err != nil {
			bad(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), "%v", err)
			continue
		}
		info.lbIPs = append(info.lbIPs, a)
	}
	info.externalIPs = sortUniqueAddrs(info.externalIPs)
	info.lbIPs = sortUniqueAddrs(info.lbIPs)

	ranges, rangesField := svc.Spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	if len(ranges) == 0 && svc.Annotations[annotationSourceRanges] != "" {
		ranges = strings.Split(svc.Annotations[annotationSourceRanges], ",")
		rangesField = "metadata.annotations[" + annotationSourceRanges + "]"
	}
	for i, s := range ranges {
		p, err := parsePrefix(s)
		if err != nil {
			bad(fmt.Sprintf("%s[%d]", rangesField, i), "%v", err)
			continue
		}
		info.sourceRanges = append(info.sourceRanges, p)
	}
	info.sourceRanges = sortUniquePrefixes(info.sourceRanges)

	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		info.affinityTimeout = defaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t >= 1 && t <= maxAffinityTimeout {
				info.affinityTimeout = t
			} else {
				bad("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d out of range 1-%d, using %d", t, maxAffinityTimeout, defaultAffinityTimeout)
			}
		}
	}
	info.externalLocal = svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	info.internalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	if info.typ == v1.ServiceTypeLoadBalancer && info.externalLocal && svc.Spec.HealthCheckNodePort != 0 {
		if validPort(svc.Spec.HealthCheckNodePort) {
			info.healthCheckNodePort = svc.Spec.HealthCheckNodePort
		} else {
			bad("spec.healthCheckNodePort", "%d out of range 1-65535, ignored", svc.Spec.HealthCheckNodePort)
		}
	}
	if svc.Spec.TrafficDistribution != nil {
		info.trafficDistribution = *svc.Spec.TrafficDistribution
	}
	info.preserveDestination = svc.Annotations[annotationPreserveDestination] == "true"
	if v, set := svc.Annotations[AnnotationLoadBalancing]; set {
		a, ok := proxy.ParseAlgorithm(v)
		if !ok {
			bad(annotationLoadBalancingField, "unknown algorithm %q (want random, round-robin, source-hash or least-connection), using random", v)
		}
		info.algorithm = a // set explicitly (random too): wins over the node's default

	}
	return info, problems
}

func sortUniqueAddrs(in []netip.Addr) []netip.Addr {
	if len(in) == 0 {
		return nil
	}
	slices.SortFunc(in, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(in)
}

func sortUniquePrefixes(in []netip.Prefix) []netip.Prefix {
	if len(in) == 0 {
		return nil
	}
	slices.SortFunc(in, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(in)
}

// addrsOf keeps the addresses of one family.
func addrsOf(in []netip.Addr, fam int) []netip.Addr {
	var out []netip.Addr
	for _, a := range in {
		if familyIndex(a) == fam {
			out = append(out, a)
		}
	}
	return out
}

func prefixesOf(in []netip.Prefix, fam int) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range in {
		if familyIndex(p.Addr()) == fam {
			out = append(out, p)
		}
	}
	return out
}
