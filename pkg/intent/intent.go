// Package intent holds every routing decision kproxy makes, once, for every
// platform: for each service port and IP family, its frontends, and for each
// frontend and class of client (a pod, the node itself, anything routed in
// from outside) what a new connection gets — DNAT to one of an endpoint set,
// REJECT or DROP — and whether its source is masqueraded; plus the source
// ranges, session affinity and load-balancing algorithm.
//
// The package is pure: it reads a service port of the cache's snapshot and a
// small Config, and returns plain values. Input that cannot be programmed (an
// address of the wrong family, a port out of range) is validated here, once:
// it is left out and reported as a proxy.Unsupported with the object and
// field named, and renderers trust what they get. Every renderer (iptables,
// nftables, HNS) renders a Port; what a platform cannot express it reports
// as a proxy.Unsupported too, so the app turns both into the same logs,
// Events and metric on every OS.
//
// Decide answers, for one frontend, class and source address, what the
// intent is; the shared behaviour table checks it once, and each renderer is
// checked against it (a packet traced through its rules, or resolved over its
// load balancers, must reach what Decide says).
package intent

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Source is a class of client, as the node receiving a connection tells it.
type Source uint8

// Sources. Their order indexes Frontend.Routes.
const (
	// FromPod is a pod: traffic the node's detect-local mode recognises as
	// coming from the cluster's pods (a pod of this node, or of another node
	// routed through this one). Without a detect-local mode pods cannot be
	// told from other clients: their routes are FromOutside's.
	FromPod Source = iota
	// FromNode is the node itself: a host process or a hostNetwork pod.
	FromNode
	// FromOutside is every other client routed to the node.
	FromOutside
	numSources
)

// Sources lists every source class, in order.
var Sources = [numSources]Source{FromPod, FromNode, FromOutside}

func (s Source) String() string {
	switch s {
	case FromPod:
		return "pod"
	case FromNode:
		return "node"
	case FromOutside:
		return "outside"
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Verdict is what a new connection gets.
type Verdict uint8

// Verdicts.
const (
	// DNAT sends the connection to one endpoint of Route.Set.
	DNAT Verdict = iota
	// Reject refuses it at once (a TCP reset, an ICMP port unreachable): the
	// Service has no usable endpoint anywhere.
	Reject
	// Drop discards it silently: there are endpoints, but none this
	// connection may use (a Local policy with none on this node, a source
	// outside the load balancer's source ranges).
	Drop
)

func (v Verdict) String() string {
	switch v {
	case DNAT:
		return "DNAT"
	case Reject:
		return "REJECT"
	case Drop:
		return "DROP"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// Set names one of a port's two endpoint sets.
type Set uint8

// Endpoint sets.
const (
	// Cluster is the set for cluster-scoped traffic (Port.Cluster).
	Cluster Set = iota
	// Local is the set for node-local traffic: endpoints on this node
	// (Port.Local).
	Local
)

func (s Set) String() string {
	if s == Local {
		return "local"
	}
	return "cluster"
}

// Route is the fate of a new connection of one source class to one frontend.
type Route struct {
	Verdict Verdict
	// Set is the endpoint set a DNAT picks from (meaningless otherwise).
	Set Set
	// Masquerade rewrites the source to a node address, so that the answer
	// comes back through this node. Only meaningful for DNAT.
	Masquerade bool
	// PreserveDestination: the frontend keeps its address as the
	// connection's destination (the Service's preserve-destination
	// annotation, on a platform that honours it: HNS's direct server
	// return). A DNAT then picks from Local only; whatever the verdict, the
	// frontend's forwarded health check keeps the destination too.
	PreserveDestination bool
}

// FrontendKind is the kind of Service address a frontend is.
type FrontendKind uint8

// Frontend kinds.
const (
	ClusterIP FrontendKind = iota
	NodePort
	ExternalIP
	LoadBalancerIP
)

func (k FrontendKind) String() string {
	switch k {
	case ClusterIP:
		return "ClusterIP"
	case NodePort:
		return "NodePort"
	case ExternalIP:
		return "externalIP"
	case LoadBalancerIP:
		return "LoadBalancer IP"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// External reports whether the kind is reachable from outside the cluster
// network (every kind but ClusterIP).
func (k FrontendKind) External() bool { return k != ClusterIP }

// Frontend is one address and port where the Service is reached.
type Frontend struct {
	Kind FrontendKind
	// Addr is the destination address; invalid for a NodePort, which
	// answers on the node's NodePort addresses (a node-wide setting).
	Addr netip.Addr
	// Port is the destination port: the Service port, or the NodePort.
	Port int32
	// Routes holds the route of each source class, indexed by Source.
	Routes [numSources]Route
	// SourceRanges, when not empty, admit only sources inside one of them
	// (loadBalancerSourceRanges, load balancer IPs only): any other source
	// is dropped before Routes apply. AllowedSources are admitted too: the
	// load balancer IPs themselves, when the node is inside a range (a load
	// balancer IP assigned on the node is the source of the node's own
	// traffic to it).
	SourceRanges   []netip.Prefix
	AllowedSources []netip.Addr
}

// Route returns the route of source class s.
func (f *Frontend) Route(s Source) Route { return f.Routes[s] }

// Uniform reports whether every source class gets the same route.
func (f *Frontend) Uniform() bool {
	return f.Routes[FromPod] == f.Routes[FromNode] && f.Routes[FromNode] == f.Routes[FromOutside]
}

// Admits reports whether the frontend's source ranges let src through.
func (f *Frontend) Admits(src netip.Addr) bool {
	if len(f.SourceRanges) == 0 {
		return true
	}
	for _, p := range f.SourceRanges {
		if p.Contains(src) {
			return true
		}
	}
	return slices.Contains(f.AllowedSources, src)
}

// String renders "kind addr:port" ("NodePort :30080").
func (f *Frontend) String() string {
	if f.Kind == NodePort {
		return fmt.Sprintf("%s :%d", f.Kind, f.Port)
	}
	return fmt.Sprintf("%s %s", f.Kind, netip.AddrPortFrom(f.Addr, uint16(f.Port)))
}

// Port is the intent for one service port in one family.
type Port struct {
	Name     proxy.ServicePortName
	Family   v1.IPFamily
	Protocol v1.Protocol
	// From is the cache's value this intent was made from. A renderer may
	// compare it by identity (an unchanged port keeps its pointer).
	From *proxy.ServicePort
	// Frontends lists the ClusterIP first, then the NodePort, the
	// externalIPs and the load balancer IPs (each in address order). A
	// frontend whose routes are all Drop for lack of endpoints is still
	// listed: renderers decide whether a platform needs an object for it.
	Frontends []Frontend
	// Cluster and Local are the endpoint sets, validated and sorted by
	// address (nil when empty). A set no route uses may still be filled.
	Cluster, Local []proxy.Endpoint
	// ClusterWeights and LocalWeights give each endpoint of the set its
	// relative weight (least connection); nil means equal weights.
	ClusterWeights, LocalWeights []float64
	// Algorithm is the effective load-balancing algorithm (session
	// affinity, when set, wins: random).
	Algorithm proxy.Algorithm
	// AffinitySeconds > 0 is sessionAffinity ClientIP with that timeout:
	// a client's new connections go to the endpoint its last one went to,
	// for that long after its last connection.
	AffinitySeconds int32
	// HealthCheckNodePort is the Service's healthCheckNodePort (0: none).
	HealthCheckNodePort int32
	// HasAnyEndpoints: a usable endpoint exists somewhere in the cluster.
	HasAnyEndpoints bool
	// Problems lists the input left out (fields named).
	Problems []proxy.Unsupported
}

// Endpoints returns set s.
func (p *Port) Endpoints(s Set) []proxy.Endpoint {
	if s == Local {
		return p.Local
	}
	return p.Cluster
}

// AlgorithmOf returns the algorithm that spreads set s: the port's, except
// that a source-hash set of more endpoints than the source-hash table has
// slots is spread at random (reported once among the port's Problems).
func (p *Port) AlgorithmOf(s Set) proxy.Algorithm {
	if p.Algorithm == proxy.AlgorithmSourceHash && len(p.Endpoints(s)) > proxy.MaxSourceHashEndpoints {
		return proxy.AlgorithmRandom
	}
	return p.Algorithm
}

// Weights returns the weights of set s (nil: equal).
func (p *Port) Weights(s Set) []float64 {
	if s == Local {
		return p.LocalWeights
	}
	return p.ClusterWeights
}

// ClusterIP returns the ClusterIP frontend (always the first).
func (p *Port) ClusterIP() *Frontend { return &p.Frontends[0] }

// External returns the external frontends (NodePort, externalIPs, load
// balancer IPs). They share their routes, but for preserve-destination:
// there the NodePort's and the load balancer IPs' routes keep the
// destination (Route.PreserveDestination) and the externalIPs' do not.
func (p *Port) External() []Frontend { return p.Frontends[1:] }

// ExternalRoutes returns the routes of the first external frontend, which
// every external frontend shares on a platform that does not honour
// preserve-destination, and false when the port has no external frontend.
func (p *Port) ExternalRoutes() ([numSources]Route, bool) {
	if len(p.Frontends) < 2 {
		return [numSources]Route{}, false
	}
	return p.Frontends[1].Routes, true
}

// NodePort returns the NodePort frontend, or nil.
func (p *Port) NodePort() *Frontend {
	for i := range p.Frontends {
		if p.Frontends[i].Kind == NodePort {
			return &p.Frontends[i]
		}
	}
	return nil
}

// Uses reports whether some route of some frontend DNATs to set s.
func (p *Port) Uses(s Set) bool {
	for i := range p.Frontends {
		for _, r := range p.Frontends[i].Routes {
			if r.Verdict == DNAT && r.Set == s {
				return true
			}
		}
	}
	return false
}

// Hairpin lists the addresses of this node's endpoints in either set
// (sorted, once each): a pod reaching itself through the Service must be
// masqueraded so that its answer comes back through the node.
func (p *Port) Hairpin() []netip.Addr {
	var out []netip.Addr
	for _, list := range [][]proxy.Endpoint{p.Cluster, p.Local} {
		for _, ep := range list {
			if ep.Local {
				out = append(out, ep.IP)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// String names the port and family, for logs.
func (p *Port) String() string { return fmt.Sprintf("%s/%s(%s)", p.Name, p.Protocol, p.Family) }
