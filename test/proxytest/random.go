package proxytest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Random scenarios feed the randomized differential (test/differential):
// Services and EndpointSlices drawn from a seed, with no expectation
// attached (the oracle is upstream kube-proxy). They are built with the
// same builders as the table's cases and keep to what the API server
// accepts.

// AltEchoPort is the second port runners of random scenarios serve the echo
// protocol on in every pod, answering with the name AltBackend(pod): a
// random slice may point a Service port at it, and an answer then tells
// which target port a proxy chose.
const AltEchoPort = 8081

// AltBackend is the name the echo server on AltEchoPort answers with.
func AltBackend(pod string) string { return fmt.Sprintf("%s:%d", pod, AltEchoPort) }

// RandomIndexes is the number of Service indexes one scenario may use,
// from its first index: scenarios given first indexes RandomIndexes apart
// never share an address or a port, so a runner may load several at once.
const RandomIndexes = 4

// RandomFirstIndex and RandomLastIndex bound the indexes of random
// scenarios: above the table's and the e2e sentinel's (99), and at most
// 254 so that externalIPs and LoadBalancer IPs stay in their /24.
const (
	RandomFirstIndex = 100
	RandomLastIndex  = 254
)

// RandomSlots is the number of scenarios a runner can load at once.
const RandomSlots = (RandomLastIndex - RandomFirstIndex + 1) / RandomIndexes

// SlotIndex returns the first index of slot s (0 ≤ s < RandomSlots).
func SlotIndex(s int) int { return RandomFirstIndex + s*RandomIndexes }

// Scenario is one seed's Services and EndpointSlices.
type Scenario struct {
	Seed uint64
	// FirstIndex is the index of the first Service.
	FirstIndex int
	Services   []*v1.Service
	Slices     []*discovery.EndpointSlice
	// Summary has one line per Service saying what was drawn.
	Summary []string
}

// Objects returns the scenario's Services then its slices, for Manifest.
func (s *Scenario) Objects() []any {
	return ObjectList(nil, s.Services, s.Slices)
}

// SlicesOf returns the scenario's slices of one Service.
func (s *Scenario) SlicesOf(svc string) []*discovery.EndpointSlice {
	var out []*discovery.EndpointSlice
	for _, sl := range s.Slices {
		if sl.Labels[discovery.LabelServiceName] == svc {
			out = append(out, sl)
		}
	}
	return out
}

// RandomPods are the pods random endpoints are drawn from.
var RandomPods = []string{PodA1, PodA2, PodB1, PodB2, PodB3}

// RandomScenario draws the scenario of seed, with Service indexes from
// firstIndex (at most RandomIndexes of them). The same seed gives the same
// scenario up to the addresses and NodePorts, which follow firstIndex.
//
// What is drawn, per Service: 1 to 4 Services; IPv4, IPv6 or dual-stack;
// type ClusterIP, NodePort or LoadBalancer (ingress IPs of the Service's
// families or of both, ipMode Proxy sometimes, NodePorts not allocated
// sometimes, loadBalancerSourceRanges sometimes); externalIPs; external
// and internal traffic policies; sessionAffinity ClientIP;
// publishNotReadyAddresses; trafficDistribution PreferClose with zone
// hints (on every endpoint, some or none); 1 to 3 ports, TCP or UDP,
// named or not, a number sometimes in both protocols (sharing a NodePort
// or not).
// Per endpoint: a pod of either node, ready, not ready, serving and/or
// terminating (conditions unset sometimes), its node name left out
// sometimes. Per family: one to three slices, an endpoint sometimes in two
// of them (with the same conditions, or one copy terminating: upstream's
// merge is then deterministic), slice ports that match the Service's, or
// target AltEchoPort, or mismatch it by name or protocol, or are missing,
// an extra port, sometimes a slice of the other family.
func (t *Topology) RandomScenario(seed uint64, firstIndex int) (*Scenario, error) {
	if firstIndex < RandomFirstIndex || firstIndex+RandomIndexes-1 > RandomLastIndex {
		return nil, fmt.Errorf("proxytest: random scenario first index %d outside [%d, %d]", firstIndex, RandomFirstIndex, RandomLastIndex-RandomIndexes+1)
	}
	g := &generator{t: t, r: rand.New(rand.NewPCG(seed, 0x6b70726f7879)), seed: seed}
	sc := &Scenario{Seed: seed, FirstIndex: firstIndex}
	n := 1 + g.r.IntN(RandomIndexes)
	for i := 0; i < n; i++ {
		svc, summary := g.service(fmt.Sprintf("r%d-%d", seed, i), firstIndex+i)
		slices, err := g.slices(svc)
		if err != nil {
			return nil, err
		}
		sc.Services = append(sc.Services, svc)
		sc.Slices = append(sc.Slices, slices...)
		sc.Summary = append(sc.Summary, summary)
	}
	return sc, nil
}

type generator struct {
	t    *Topology
	r    *rand.Rand
	seed uint64
}

// pct is true with probability p percent.
func (g *generator) pct(p int) bool { return g.r.IntN(100) < p }

var randomPortNumbers = []int32{80, 53, 443, 8080, 5000}

func (g *generator) service(name string, index int) (*v1.Service, string) {
	t := g.t
	var opts []ServiceOption
	var what []string
	typ := v1.ServiceTypeClusterIP
	switch v := g.r.IntN(10); {
	case v < 3:
	case v < 6:
		typ = v1.ServiceTypeNodePort
		opts = append(opts, WithNodePort())
	default:
		typ = v1.ServiceTypeLoadBalancer
		opts = append(opts, WithLoadBalancer())
	}
	what = append(what, string(typ))
	svc := t.Service(name, index, opts...)

	// Families.
	fams := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	switch v := g.r.IntN(4); {
	case v == 0:
		fams = fams[:1]
	case v == 1:
		fams = fams[1:]
	}
	if len(fams) == 1 {
		single := v1.IPFamilyPolicySingleStack
		svc.Spec.IPFamilyPolicy = &single
		i := 0
		if fams[0] == v1.IPv6Protocol {
			i = 1
		}
		svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIPs[i]}
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
		svc.Spec.IPFamilies = fams
		what = append(what, string(fams[0]))
	} else {
		what = append(what, "dual-stack")
	}

	// Ports.
	nports := 1
	if v := g.r.IntN(20); v >= 10 {
		nports = 2
		if v >= 17 {
			nports = 3
		}
	}
	svc.Spec.Ports = nil
	used := map[string]bool{}
	var portWords []string
	for j := 0; j < nports; j++ {
		proto := v1.ProtocolTCP
		if g.pct(40) {
			proto = v1.ProtocolUDP
		}
		var num int32
		// Sometimes the previous port's number in the other protocol
		// (53/TCP and 53/UDP), which may share its NodePort.
		samePort := false
		if j > 0 && g.pct(25) {
			prev := svc.Spec.Ports[j-1]
			if other := otherProtocol(prev.Protocol); !used[fmt.Sprint(other, prev.Port)] {
				proto, num, samePort = other, prev.Port, true
			}
		}
		for !samePort {
			num = randomPortNumbers[g.r.IntN(len(randomPortNumbers))]
			if !used[fmt.Sprint(proto, num)] {
				break
			}
		}
		used[fmt.Sprint(proto, num)] = true
		pname := fmt.Sprintf("p%d", j)
		if nports == 1 && g.pct(40) {
			pname = ""
		}
		sp := v1.ServicePort{Name: pname, Protocol: proto, Port: num, TargetPort: intstr.FromInt32(EchoPort)}
		if typ != v1.ServiceTypeClusterIP {
			sp.NodePort = int32(NodePortBase + RandomIndexes*index + j)
			// The API server lets ports of one number (53/TCP, 53/UDP)
			// share a NodePort, and no other two.
			if samePort && g.pct(60) {
				sp.NodePort = svc.Spec.Ports[j-1].NodePort
			}
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
		portWords = append(portWords, fmt.Sprintf("%s/%s:%d", orEmpty(pname), proto, num))
	}
	what = append(what, "ports "+strings.Join(portWords, ","))

	if typ == v1.ServiceTypeLoadBalancer {
		if g.pct(15) {
			no := false
			svc.Spec.AllocateLoadBalancerNodePorts = &no
			for i := range svc.Spec.Ports {
				svc.Spec.Ports[i].NodePort = 0
			}
			what = append(what, "no NodePorts")
		}
		if g.pct(70) {
			// Ingress IPs of the Service's families only.
			var keep []v1.LoadBalancerIngress
			for _, in := range svc.Status.LoadBalancer.Ingress {
				if hasFamily(fams, familyOf(netip.MustParseAddr(in.IP))) {
					keep = append(keep, in)
				}
			}
			svc.Status.LoadBalancer.Ingress = keep
		} else if len(fams) == 1 {
			what = append(what, "ingress IPs of both families")
		}
		if g.pct(10) {
			WithIPModeProxy()(t, svc, index)
			what = append(what, "ipMode Proxy")
		}
		if g.pct(15) {
			ranges := [][]string{
				{"192.168.50.100/32", "fd00:50::100/128"},
				{t.ClusterCIDR4.String(), t.ClusterCIDR6.String()},
				{"192.168.99.0/24"},
				{t.NodeNetwork4.String(), t.NodeNetwork6.String()},
			}[g.r.IntN(4)]
			WithSourceRanges(ranges...)(t, svc, index)
			what = append(what, "sourceRanges "+strings.Join(ranges, ","))
		}
	}
	if g.pct(30) {
		WithExternalIPs()(t, svc, index)
		what = append(what, "externalIPs")
	}
	external := typ != v1.ServiceTypeClusterIP || len(svc.Spec.ExternalIPs) > 0
	if external {
		if g.pct(50) {
			WithExternalLocal()(t, svc, index)
			what = append(what, "externalTrafficPolicy Local")
		} else {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		}
	}
	if g.pct(40) {
		WithInternalLocal()(t, svc, index)
		what = append(what, "internalTrafficPolicy Local")
	}
	if g.pct(20) {
		timeout := int32(0)
		if g.pct(50) {
			timeout = 60
		}
		WithAffinity(timeout)(t, svc, index)
		what = append(what, "sessionAffinity ClientIP")
	}
	if g.pct(15) {
		svc.Spec.PublishNotReadyAddresses = true
		what = append(what, "publishNotReadyAddresses")
	}
	if g.pct(15) {
		WithPreferClose()(t, svc, index)
		what = append(what, "trafficDistribution PreferClose")
	}
	return svc, name + ": " + strings.Join(what, ", ")
}

func orEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

func hasFamily(fams []v1.IPFamily, f v1.IPFamily) bool {
	for _, x := range fams {
		if x == f {
			return true
		}
	}
	return false
}

// randomEP is one drawn endpoint: a pod and its conditions.
type randomEP struct {
	pod                         string
	ready, serving, terminating *bool
	noNode                      bool
	hint                        string
}

func boolp(b bool) *bool { return &b }

func (g *generator) endpoint(pod string) randomEP {
	ep := randomEP{pod: pod}
	switch v := g.r.IntN(100); {
	case v < 55: // ready
		ep.ready, ep.serving, ep.terminating = boolp(true), boolp(true), boolp(false)
	case v < 67: // not ready (failing its readiness probe)
		ep.ready, ep.serving, ep.terminating = boolp(false), boolp(false), boolp(false)
	case v < 80: // terminating, still serving
		ep.ready, ep.serving, ep.terminating = boolp(false), boolp(true), boolp(true)
	case v < 88: // terminating, no longer serving
		ep.ready, ep.serving, ep.terminating = boolp(false), boolp(false), boolp(true)
	case v < 93: // conditions unset (ready and serving by the API's rules)
	default: // serving but neither ready nor terminating
		ep.ready, ep.serving, ep.terminating = boolp(false), boolp(true), boolp(false)
	}
	ep.noNode = g.pct(5)
	return ep
}

// terminatingCopy returns a copy of a non-terminating ep marked terminating.
func (g *generator) terminatingCopy(ep randomEP) randomEP {
	c := ep
	c.ready, c.serving, c.terminating = boolp(false), boolp(g.pct(50)), boolp(true)
	return c
}

func isTerminating(ep randomEP) bool { return ep.terminating != nil && *ep.terminating }

func (g *generator) slices(svc *v1.Service) ([]*discovery.EndpointSlice, error) {
	t := g.t
	// Endpoints: a subset of the pods (none sometimes).
	var eps []randomEP
	if !g.pct(10) {
		for _, p := range RandomPods {
			if g.pct(55) {
				eps = append(eps, g.endpoint(p))
			}
		}
		if len(eps) == 0 {
			eps = append(eps, g.endpoint(RandomPods[g.r.IntN(len(RandomPods))]))
		}
	}
	// Zone hints: on every endpoint, some, or none.
	if svc.Spec.TrafficDistribution != nil {
		mode := g.r.IntN(10)
		for i := range eps {
			host, _ := t.Host(eps[i].pod)
			node, _ := t.Node(host.Node)
			switch {
			case mode < 7:
				eps[i].hint = node.Zone
			case mode < 9 && g.pct(50):
				eps[i].hint = node.Zone
			case mode < 9:
			default:
				eps[i].hint = []string{Zone1, Zone2}[g.r.IntN(2)]
			}
		}
	}
	fams := append([]v1.IPFamily(nil), svc.Spec.IPFamilies...)
	if len(fams) == 1 && g.pct(5) {
		other := v1.IPv4Protocol
		if fams[0] == v1.IPv4Protocol {
			other = v1.IPv6Protocol
		}
		fams = append(fams, other)
	}
	var out []*discovery.EndpointSlice
	for _, fam := range fams {
		n := 1
		if v := g.r.IntN(10); v >= 6 {
			n = 2
			if v >= 9 {
				n = 3
			}
		}
		groups := make([][]randomEP, n)
		for _, ep := range eps {
			i := g.r.IntN(n)
			groups[i] = append(groups[i], ep)
			if n > 1 && g.pct(10) {
				// Also in another slice: the same conditions, or one copy
				// terminating and the other not (upstream keeps the
				// non-terminating one whatever the order it merges in).
				dup := ep
				if !isTerminating(ep) && g.pct(50) {
					dup = g.terminatingCopy(ep)
				}
				j := (i + 1 + g.r.IntN(n-1)) % n
				groups[j] = append(groups[j], dup)
			}
		}
		for i, group := range groups {
			s, err := g.slice(svc, fam, i, group)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (g *generator) slice(svc *v1.Service, fam v1.IPFamily, i int, eps []randomEP) (*discovery.EndpointSlice, error) {
	t := g.t
	addrType := discovery.AddressTypeIPv4
	suffix := "ipv4"
	if fam == v1.IPv6Protocol {
		addrType, suffix = discovery.AddressTypeIPv6, "ipv6"
	}
	name := fmt.Sprintf("%s-%s", svc.Name, suffix)
	if i > 0 {
		name = fmt.Sprintf("%s-%d", name, i+1)
	}
	s := &discovery.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: svc.Namespace,
			Labels: map[string]string{
				discovery.LabelServiceName: svc.Name,
				discovery.LabelManagedBy:   "proxytest",
			},
		},
		AddressType: addrType,
		Ports:       []discovery.EndpointPort{},
		Endpoints:   []discovery.Endpoint{},
	}
	for _, sp := range svc.Spec.Ports {
		name, proto, port := sp.Name, sp.Protocol, int32(EchoPort)
		switch v := g.r.IntN(100); {
		case v < 80:
		case v < 87:
			port = AltEchoPort
		case v < 92:
			name = "x" + name
		case v < 96:
			proto = otherProtocol(proto)
		default:
			continue // missing
		}
		s.Ports = append(s.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	if g.pct(10) {
		name, proto, port := "extra", v1.ProtocolTCP, int32(EchoPort)
		s.Ports = append(s.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	for _, ep := range eps {
		pod, ok := t.Host(ep.pod)
		if !ok || pod.Role != RolePod {
			return nil, fmt.Errorf("proxytest: random endpoint %q is not a pod of the topology", ep.pod)
		}
		node, _ := t.Node(pod.Node)
		nodeName, zone := node.Name, node.Zone
		e := discovery.Endpoint{
			Addresses:  []string{pod.Addr(fam).String()},
			Conditions: discovery.EndpointConditions{Ready: ep.ready, Serving: ep.serving, Terminating: ep.terminating},
			Zone:       &zone,
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: pod.Name},
		}
		if !ep.noNode {
			e.NodeName = &nodeName
		}
		if ep.hint != "" {
			e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: ep.hint}}}
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s, nil
}

func otherProtocol(p v1.Protocol) v1.Protocol {
	if p == v1.ProtocolTCP {
		return v1.ProtocolUDP
	}
	return v1.ProtocolTCP
}
