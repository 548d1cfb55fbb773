// Package explain answers "where does a new connection from here to there
// go, and why" for one node: which Service frontend the address is, which
// policies chose the endpoints, and what the proxy mode's programming does
// with the packet (the verdict, each endpoint's chance, masquerade, and the
// path through chains or load balancers).
//
// The package is pure and platform-neutral: it reads the intent View the
// running proxy builds (pkg/intent: which Service owns the frontend, which
// endpoint set each kind of client reaches) and asks a Tracer, one per
// proxy mode, to follow the packet through that mode's programming, either
// as kproxy plans it or as it is live on the node. A new mode only needs a
// Tracer.
package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Origin says where the client is, relative to the node explained.
type Origin string

// Origins.
const (
	// FromPod is a pod on this node (the default).
	FromPod Origin = "pod"
	// FromNode is a process of the node itself (host network).
	FromNode Origin = "node"
	// FromOutside is a client routed in from elsewhere: another node, a pod
	// on another node, or outside the cluster.
	FromOutside Origin = "outside"
)

// Query is one new connection to explain.
type Query struct {
	To       netip.AddrPort
	Protocol v1.Protocol
	// From is the client's address.
	From   netip.Addr
	Origin Origin
	// NodeAddrs are the node's own addresses (NodePorts are served on them).
	NodeAddrs []netip.Addr
}

// Family returns the IP family of the destination.
func (q Query) Family() v1.IPFamily {
	if q.To.Addr().Is6() {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

func (q Query) String() string {
	return fmt.Sprintf("%s %s from %s (%s)", q.To, q.Protocol, q.From, q.Origin)
}

// Frontend is the Service address a query is sent to.
type Frontend struct {
	Service  string `json:"service"`
	Kind     string `json:"kind"`
	Address  string `json:"address"`
	Protocol string `json:"protocol"`
}

// Frontend kinds.
const (
	KindClusterIP      = "ClusterIP"
	KindNodePort       = "NodePort"
	KindExternalIP     = "externalIP"
	KindLoadBalancerIP = "LoadBalancer IP"
)

// Verdict is what happens to a new connection.
type Verdict string

// Verdicts.
const (
	DNAT       Verdict = "DNAT"
	Reject     Verdict = "REJECT"
	Drop       Verdict = "DROP"
	NotHandled Verdict = "not handled by kproxy"
	// Mixed: some of the possible outcomes differ (shown per target).
	Mixed Verdict = "mixed"
	// Unknown: the packet meets programming the tracer cannot read (a
	// rule kproxy did not write, live): what happens is not simulated.
	Unknown Verdict = "not simulated"
)

// Target is one possible fate of the connection.
type Target struct {
	Verdict Verdict `json:"verdict"`
	// Endpoint is "ip:port" after DNAT ("" without DNAT).
	Endpoint string `json:"endpoint,omitempty"`
	// Probability of this target for a new connection (0..1).
	Probability float64 `json:"probability"`
	// Masquerade: the backend sees a node address instead of the client's.
	Masquerade bool `json:"masquerade"`
	// Endpoint facts from the snapshot (when the endpoint is the Service's).
	Node        string `json:"node,omitempty"`
	Zone        string `json:"zone,omitempty"`
	Local       bool   `json:"local,omitempty"`
	Terminating bool   `json:"terminating,omitempty"`
}

// Step is one place the packet went through, with the reason in words.
type Step struct {
	// Where names the chain and rule, or the load balancer.
	Where string `json:"where"`
	// What is the rule or object as the platform shows it.
	What string `json:"what,omitempty"`
	Why  string `json:"why"`
}

// Trace is what a Tracer finds for one query.
type Trace struct {
	Targets []Target
	// Algorithm names how one target is picked ("random", "source hash").
	Algorithm string
	// Decisions are platform-specific decisions (added to the policy ones).
	Decisions []string
	Path      []Step
	// Drift lists, in live mode, every difference between what is
	// programmed and kproxy's plan.
	Drift []string
	Notes []string
}

// Tracer follows a query through one proxy mode's programming of the node
// (as planned, or live). Implementations: platform/linux (iptables,
// nftables), platform/windows (kernelspace).
type Tracer interface {
	Trace(q Query) (*Trace, error)
}

// Result is the answer to a query.
type Result struct {
	Mode       string    `json:"mode"`
	Live       bool      `json:"live"`
	Node       string    `json:"node"`
	To         string    `json:"to"`
	From       string    `json:"from"`
	Origin     Origin    `json:"origin"`
	Frontend   *Frontend `json:"frontend"`
	Verdict    Verdict   `json:"verdict"`
	Targets    []Target  `json:"targets"`
	Algorithm  string    `json:"algorithm,omitempty"`
	Masquerade string    `json:"masquerade"`
	Decisions  []string  `json:"decisions"`
	Path       []Step    `json:"path"`
	Drift      []string  `json:"drift,omitempty"`
	Notes      []string  `json:"notes,omitempty"`
}

// Explain answers q for the node of v, the intent View the tracer's
// programming was made from, with t following the packet.
func Explain(mode string, live bool, v *intent.View, q Query, t Tracer) (*Result, error) {
	tr, err := t.Trace(q)
	if err != nil {
		return nil, fmt.Errorf("tracing %s: %w", q, err)
	}
	res := &Result{Mode: mode, Live: live, Node: v.Node.Name, To: q.To.String() + "/" + strings.ToLower(string(q.Protocol)),
		From: q.From.String(), Origin: q.Origin, Targets: tr.Targets, Algorithm: tr.Algorithm,
		Path: tr.Path, Drift: tr.Drift, Notes: tr.Notes}
	p, fe := FindFrontend(v, q)
	res.Verdict = verdictOf(res.Targets)
	res.Masquerade = masqueradeOf(res.Targets)
	if p != nil {
		res.Frontend = &Frontend{Service: p.Name.String(), Kind: kindName(fe.Kind), Address: q.To.String(), Protocol: string(p.Protocol)}
		annotate(res.Targets, p.From)
		res.Decisions = Decisions(p, fe, q, res.Verdict)
	} else if owners := AddressOwners(v, q.To.Addr()); len(owners) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%s is an address of %s, but not on port %d/%s",
			q.To.Addr(), strings.Join(owners, "; "), q.To.Port(), strings.ToLower(string(q.Protocol))))
	}
	res.Decisions = append(res.Decisions, tr.Decisions...)
	if p == nil && res.Verdict == DNAT {
		res.Notes = append(res.Notes, "the packet is rewritten although no Service of the snapshot has this address: state left from another Service or another proxy")
	}
	return res, nil
}

// kindName is the word for a frontend kind in an explanation.
func kindName(k intent.FrontendKind) string {
	switch k {
	case intent.NodePort:
		return KindNodePort
	case intent.ExternalIP:
		return KindExternalIP
	case intent.LoadBalancerIP:
		return KindLoadBalancerIP
	}
	return KindClusterIP
}

// source is the intent's source of a query's origin.
func source(o Origin) intent.Source {
	switch o {
	case FromNode:
		return intent.FromNode
	case FromOutside:
		return intent.FromOutside
	}
	return intent.FromPod
}

func verdictOf(ts []Target) Verdict {
	if len(ts) == 0 {
		return NotHandled
	}
	v := ts[0].Verdict
	for _, t := range ts[1:] {
		if t.Verdict != v {
			return Mixed
		}
	}
	return v
}

func masqueradeOf(ts []Target) string {
	var yes, no int
	for _, t := range ts {
		if t.Verdict != DNAT && t.Verdict != NotHandled {
			continue
		}
		if t.Masquerade {
			yes++
		} else {
			no++
		}
	}
	switch {
	case yes > 0 && no > 0:
		return "for some endpoints"
	case yes > 0:
		return "yes"
	case no > 0:
		return "no"
	}
	return "n/a"
}

// annotate fills endpoint facts from the service port's endpoints.
func annotate(ts []Target, sp *proxy.ServicePort) {
	for i := range ts {
		ap, err := netip.ParseAddrPort(ts[i].Endpoint)
		if err != nil {
			continue
		}
		for _, ep := range sp.AllReachableEndpoints() {
			if ep.AddrPort() == ap {
				ts[i].Node, ts[i].Zone, ts[i].Local, ts[i].Terminating = ep.NodeName(), ep.Zone(), ep.Local, ep.Terminating
			}
		}
	}
}

// FindFrontend returns the port of v and the frontend q is sent to, or
// nil: the intent's, so a frontend several Services claim is found where
// the proxy programs it (its owner). A ClusterIP, externalIP or
// LoadBalancer IP wins over a NodePort on the same address and port.
func FindFrontend(v *intent.View, q Query) (*intent.Port, *intent.Frontend) {
	if v == nil {
		return nil, nil
	}
	addr, port := q.To.Addr(), int32(q.To.Port())
	nodeAddr := addr.IsLoopback() || slices.Contains(q.NodeAddrs, addr)
	var np *intent.Port
	var npf *intent.Frontend
	for _, p := range v.Sorted() {
		if p.Protocol != q.Protocol {
			continue
		}
		for i := range p.Frontends {
			fe := &p.Frontends[i]
			if fe.Port != port {
				continue
			}
			if fe.Kind != intent.NodePort {
				if fe.Addr == addr {
					return p, fe
				}
			} else if nodeAddr && np == nil {
				np, npf = p, fe
			}
		}
	}
	return np, npf
}

// AddressOwners lists, for each service port of v that has addr as its
// ClusterIP, an externalIP or a LoadBalancer IP, "<kind> of <service
// port> (<port>/<protocol>)", sorted: what a query missed when it names
// a Service's address with another port or protocol.
func AddressOwners(v *intent.View, addr netip.Addr) []string {
	if v == nil {
		return nil
	}
	var out []string
	for _, p := range v.Sorted() {
		for _, fe := range p.Frontends {
			if fe.Kind != intent.NodePort && fe.Addr == addr {
				out = append(out, fmt.Sprintf("%s of %s (%d/%s)", kindName(fe.Kind), p.Name, fe.Port, strings.ToLower(string(p.Protocol))))
				break
			}
		}
	}
	return out
}

// Decisions names, in words, the policies that decide where q goes: traffic
// policy, topology, terminating fallback, source ranges, affinity. They are
// the intent's decisions (the route of q's kind of client to fe, and its
// endpoint sets), the same on every platform; verdict is what the tracer
// found, for where a platform departs from the intent (HNS cannot reject,
// nor short-circuit a node's own clients).
func Decisions(p *intent.Port, fe *intent.Frontend, q Query, verdict Verdict) []string {
	sp := p.From
	var out []string
	// policy is the route the traffic policy gives outside clients (for
	// a ClusterIP, every client).
	policy := fe.Route(intent.FromOutside)
	if fe.Kind == intent.ClusterIP {
		policy = fe.Route(source(q.Origin))
		if sp.InternalPolicyLocal {
			out = append(out, fmt.Sprintf("internalTrafficPolicy Local: only this node's endpoints (%d)", len(p.Local)))
		} else {
			out = append(out, fmt.Sprintf("internalTrafficPolicy Cluster: endpoints anywhere in the cluster (%d)", len(p.Cluster)))
		}
	} else if sp.ExternalPolicyLocal {
		out = append(out, fmt.Sprintf("externalTrafficPolicy Local: only this node's endpoints (%d) for traffic from outside; the client's source is kept", len(p.Local)))
	} else {
		out = append(out, fmt.Sprintf("externalTrafficPolicy Cluster: endpoints anywhere in the cluster (%d); the source is masqueraded", len(p.Cluster)))
	}
	// shortCircuit: the intent sends this node's own clients of an
	// external frontend under a Local policy to the cluster-wide
	// endpoints, and the platform did.
	route := fe.Route(source(q.Origin))
	shortCircuit := fe.Kind.External() && sp.ExternalPolicyLocal && q.Origin != FromOutside &&
		route.Verdict == intent.DNAT && route.Set == intent.Cluster && verdict == DNAT
	if fe.Kind.External() && sp.ExternalPolicyLocal && q.Origin != FromOutside && !shortCircuit {
		out = append(out, "externalTrafficPolicy Local, client on this node: the platform may short-circuit to the cluster-wide endpoints (see the verdict)")
	}
	switch policy.Verdict {
	case intent.Reject:
		if verdict == Drop {
			out = append(out, "no usable endpoint anywhere in the cluster: this platform cannot reject, so connections are dropped (not refused)")
		} else {
			out = append(out, "no usable endpoint anywhere in the cluster: connections are rejected")
		}
		if len(sp.SlicePortsElsewhere) > 0 {
			names := make([]string, len(sp.SlicePortsElsewhere))
			for i, n := range sp.SlicePortsElsewhere {
				names[i] = strconv.Quote(n)
			}
			out = append(out, fmt.Sprintf("the Service's EndpointSlices have ready endpoints on port(s) named %s (%s), but this Service port is named %q: "+
				"endpoints belong to the Service port of the same name (check the Service's port names, or the EndpointSlices' if written by hand)",
				strings.Join(names, ", "), strings.ToLower(string(sp.Protocol)), sp.Name.Port))
		}
	case intent.Drop:
		if !shortCircuit {
			out = append(out, "no usable endpoint on this node under a Local policy: connections are dropped")
		}
	}
	if sp.TrafficDistribution != "" {
		out = append(out, fmt.Sprintf("trafficDistribution %s: the endpoints are the ones the zone hints give this node's zone", sp.TrafficDistribution))
	}
	if eps := p.Endpoints(policy.Set); policy.Verdict == intent.DNAT && terminatingOnly(eps) {
		out = append(out, "terminating fallback: no endpoint is ready, so serving terminating ones are used")
	}
	if fe.Kind == intent.LoadBalancerIP && len(fe.SourceRanges) > 0 {
		var rs []string
		for _, r := range fe.SourceRanges {
			rs = append(rs, r.String())
		}
		if fe.Admits(q.From) {
			out = append(out, fmt.Sprintf("loadBalancerSourceRanges %s: %s is allowed", strings.Join(rs, ","), q.From))
		} else {
			out = append(out, fmt.Sprintf("loadBalancerSourceRanges %s: %s is not allowed (dropped)", strings.Join(rs, ","), q.From))
		}
	}
	if p.AffinitySeconds > 0 {
		out = append(out, fmt.Sprintf("sessionAffinity ClientIP (timeout %ds): a client address stays on the endpoint it got first", p.AffinitySeconds))
	}
	if shortCircuit {
		out = append(out, fmt.Sprintf("externalTrafficPolicy Local, client on this node: short-circuited to the cluster-wide endpoints (%d), as kube-proxy does", len(p.Cluster)))
	}
	return out
}

func terminatingOnly(eps []proxy.Endpoint) bool {
	for _, e := range eps {
		if !e.Terminating || e.Ready {
			return false
		}
	}
	return true
}
