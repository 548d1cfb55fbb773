// Package proxy holds the plain data shared by every part of kproxy: the
// node-local desired state (Snapshot) that the cache computes and that every
// platform backend renders, and the Backend interface.
//
// Nothing here has side effects and nothing here knows about a platform.
// Values reachable from a Snapshot are immutable once published: a backend may
// keep pointers to them across syncs and compare them by identity (the cache
// reuses the same *ServicePort when nothing about a service port changed).
package proxy

import (
	"fmt"
	"net/netip"
	"sort"
	"unique"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName identifies one port of one Service.
type ServicePortName struct {
	types.NamespacedName
	// Port is the name of the port in the Service spec ("" for an unnamed port).
	Port     string
	Protocol v1.Protocol
}

// String renders "namespace/name:port" (":port" omitted for an unnamed port), the
// form upstream kube-proxy uses in logs and rule comments.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.NamespacedName.String()
	}
	return n.NamespacedName.String() + ":" + n.Port
}

// Less orders service port names by namespace, name, port name, protocol.
func (n ServicePortName) Less(o ServicePortName) bool {
	if n.Namespace != o.Namespace {
		return n.Namespace < o.Namespace
	}
	if n.Name != o.Name {
		return n.Name < o.Name
	}
	if n.Port != o.Port {
		return n.Port < o.Port
	}
	return n.Protocol < o.Protocol
}

// Endpoint is one backend of a service port, as selected by the cache.
// It is 40 bytes: a snapshot holds one per endpoint and service port, so
// what it repeats (the node and zone) is a shared handle.
type Endpoint struct {
	// IP is the endpoint address; always of the family of the view it is in.
	IP netip.Addr
	// Port is the resolved target port for this service port.
	Port int32
	// Conditions, normalized: a nil ready condition means ready; serving
	// defaults to ready when absent; terminating defaults to false.
	Ready       bool
	Serving     bool
	Terminating bool
	// Local is true when the endpoint runs on this node.
	Local bool
	// Where is the node and zone of the EndpointSlice (At; the zero handle
	// when both are unknown). NodeName and Zone read it.
	Where unique.Handle[Topology]
}

// Topology is where an endpoint runs, as its EndpointSlice says.
type Topology struct {
	NodeName, Zone string
}

// At returns the shared handle of a node and zone: the zero handle when
// both are empty, so that endpoints without placement compare equal to
// Endpoint{} literals.
func At(nodeName, zone string) unique.Handle[Topology] {
	if nodeName == "" && zone == "" {
		return unique.Handle[Topology]{}
	}
	return unique.Make(Topology{NodeName: nodeName, Zone: zone})
}

// Topology returns where the endpoint runs (zero when unknown).
func (e Endpoint) Topology() Topology {
	if e.Where == (unique.Handle[Topology]{}) {
		return Topology{}
	}
	return e.Where.Value()
}

// NodeName is the endpoint's node ("" when unknown).
func (e Endpoint) NodeName() string { return e.Topology().NodeName }

// Zone is the endpoint's zone ("" when unknown).
func (e Endpoint) Zone() string { return e.Topology().Zone }

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(e.IP, uint16(e.Port))
}

// String renders "ip:port" ("[ip]:port" for IPv6).
func (e Endpoint) String() string { return e.AddrPort().String() }

// ServiceType mirrors the Service types that reach the proxy (ExternalName and
// headless Services never do).
type ServiceType = v1.ServiceType

// ServicePort is the node-local desired state of one port of one Service, in
// one IP family: its frontends and the endpoints selected for it.
//
// The endpoint lists are already filtered by every Kubernetes rule (readiness,
// terminating fallback, traffic policies, topology); backends render them as is.
type ServicePort struct {
	Name   ServicePortName
	Family v1.IPFamily
	Type   ServiceType

	ClusterIP netip.Addr
	Port      int32
	Protocol  v1.Protocol
	// NodePort is 0 when the port has none.
	NodePort int32
	// ExternalIPs and LoadBalancerIPs hold only addresses of this family, sorted.
	// LoadBalancerIPs holds the ingress IPs with ipMode VIP (or unset); ingress
	// IPs with ipMode Proxy are not captured on the node.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges holds the ranges of this family, sorted. When it
	// is non-empty, traffic to a LoadBalancer IP from other sources is dropped.
	// Ranges of the other family are ignored, as upstream does.
	LoadBalancerSourceRanges []netip.Prefix

	// AffinityTimeoutSeconds > 0 means sessionAffinity ClientIP with that timeout.
	AffinityTimeoutSeconds int32

	// ExternalPolicyLocal is true when externalTrafficPolicy is Local and the
	// port is externally reachable (NodePort, externalIPs or LoadBalancer IPs).
	ExternalPolicyLocal bool
	// InternalPolicyLocal is true when internalTrafficPolicy is Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort is the LoadBalancer health check port (0: none).
	HealthCheckNodePort int32
	// TrafficDistribution is the Service's spec.trafficDistribution, kept for
	// display. Selection follows the EndpointSlice hints the control plane
	// derives from it, like upstream kube-proxy.
	TrafficDistribution string
	// PreserveDestination is the Service's "preserve-destination: true"
	// annotation (upstream's Windows proxy honours it): on Windows, traffic
	// to its NodePort and load balancer IPs goes only to endpoints on the
	// node, with DSR and the destination IP preserved. Linux ignores it, as
	// upstream does.
	PreserveDestination bool
	// Algorithm is the load-balancing algorithm the Service asks for with
	// the kproxy.io/load-balancing annotation ("" and random are the same).
	// Backends render EffectiveAlgorithm, where session affinity wins.
	Algorithm Algorithm

	// ClusterEndpoints are the endpoints for cluster-scoped traffic, sorted by
	// address; nil when there are none and always when the port never uses
	// cluster-scoped traffic (see UsesClusterEndpoints).
	ClusterEndpoints []Endpoint
	// LocalEndpoints are the endpoints on this node for node-local traffic,
	// sorted by address; nil when there are none and always when the port
	// never uses node-local traffic (see UsesLocalEndpoints).
	LocalEndpoints []Endpoint
	// HasAnyEndpoints reports whether a usable endpoint exists anywhere in the
	// cluster. It tells "no endpoints at all" (reject) from "none on this node"
	// (drop).
	HasAnyEndpoints bool
	// SlicePortsElsewhere, set only when no endpoint is usable anywhere
	// (HasAnyEndpoints false), names the ports of this Service's
	// EndpointSlices (this family and protocol) that have ready endpoints
	// but match no port of the Service by name: the usual cause of a
	// Service without endpoints whose pods run (kproxy explain says so).
	// Sorted; "" is an unnamed port. Nothing is programmed from it.
	SlicePortsElsewhere []string
}

// ExternallyAccessible reports whether the port has a frontend outside the
// cluster network: a NodePort, an externalIP or a LoadBalancer IP.
func (p *ServicePort) ExternallyAccessible() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || len(p.LoadBalancerIPs) > 0
}

// UsesClusterEndpoints reports whether some traffic to this port uses
// cluster-scoped endpoints: the ClusterIP's with internalTrafficPolicy
// Cluster, and every port reachable from outside, whatever its policies —
// with externalTrafficPolicy Local, pods and the node itself reaching an
// external frontend short-circuit to the cluster endpoints (upstream's
// UsesClusterEndpoints has the same rule, for the same reason).
func (p *ServicePort) UsesClusterEndpoints() bool {
	return !p.InternalPolicyLocal || p.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether some traffic to this port uses node-local
// endpoints.
func (p *ServicePort) UsesLocalEndpoints() bool {
	return p.InternalPolicyLocal || (p.ExternallyAccessible() && (p.ExternalPolicyLocal || p.PreserveDestination))
}

// InternalEndpoints are the endpoints for traffic to the ClusterIP.
func (p *ServicePort) InternalEndpoints() []Endpoint {
	if p.InternalPolicyLocal {
		return p.LocalEndpoints
	}
	return p.ClusterEndpoints
}

// ExternalEndpoints are the endpoints for traffic arriving through an external
// frontend (NodePort, externalIP, LoadBalancer IP) from outside the node.
func (p *ServicePort) ExternalEndpoints() []Endpoint {
	if p.ExternalPolicyLocal {
		return p.LocalEndpoints
	}
	return p.ClusterEndpoints
}

// AllReachableEndpoints is the union of cluster and local endpoints, sorted.
func (p *ServicePort) AllReachableEndpoints() []Endpoint {
	switch {
	case p.ClusterEndpoints == nil:
		return p.LocalEndpoints
	case p.LocalEndpoints == nil:
		return p.ClusterEndpoints
	}
	seen := make(map[netip.AddrPort]bool, len(p.ClusterEndpoints)+len(p.LocalEndpoints))
	var out []Endpoint
	for _, list := range [][]Endpoint{p.ClusterEndpoints, p.LocalEndpoints} {
		for _, ep := range list {
			if !seen[ep.AddrPort()] {
				seen[ep.AddrPort()] = true
				out = append(out, ep)
			}
		}
	}
	SortEndpoints(out)
	return out
}

// String names the port and its family, for logs.
func (p *ServicePort) String() string {
	return fmt.Sprintf("%s/%s(%s)", p.Name, p.Protocol, p.Family)
}

// FrontendString renders the ClusterIP frontend, "ip:port/proto".
func (p *ServicePort) FrontendString() string {
	return netip.AddrPortFrom(p.ClusterIP, uint16(p.Port)).String() + "/" + string(p.Protocol)
}

// SortEndpoints sorts endpoints by address then port.
func SortEndpoints(eps []Endpoint) {
	sort.Slice(eps, func(i, j int) bool {
		if c := eps[i].IP.Compare(eps[j].IP); c != 0 {
			return c < 0
		}
		return eps[i].Port < eps[j].Port
	})
}

// Node holds the facts about this node that the desired state depends on.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label ("" when unset).
	Zone string
	// Labels are the node's topology labels (zone and region).
	Labels map[string]string
	// Addresses are the node's InternalIP and ExternalIP addresses from its status, sorted.
	Addresses []netip.Addr
	// PodCIDRs are spec.podCIDRs.
	PodCIDRs []netip.Prefix
	// Deleting is true when the node has a deletion timestamp or carries the
	// ToBeDeletedByClusterAutoscaler taint: load balancers should drain it.
	Deleting bool
	// Known is false until the Node object has been seen.
	Known bool
}
