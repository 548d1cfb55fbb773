// Package explain answers "where does a new connection from here to there
// go, and why" for one node: which Service frontend the address is, which
// policies chose the endpoints, and what the proxy mode's programming does
// with the packet (the verdict, each endpoint's chance, masquerade, and the
// path through chains or load balancers).
//
// The package is pure and platform-neutral: it reads a Snapshot (what the
// cache selected) and asks a Tracer, one per proxy mode, to follow the packet
// through that mode's programming, either as kproxy plans it or as it is live
// on the node. A new mode only needs a Tracer.
package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

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

// Explain answers q for the node of snap, with t following the packet.
func Explain(mode string, live bool, snap *proxy.Snapshot, q Query, t Tracer) (*Result, error) {
	tr, err := t.Trace(q)
	if err != nil {
		return nil, fmt.Errorf("tracing %s: %w", q, err)
	}
	res := &Result{Mode: mode, Live: live, Node: snap.Node.Name, To: q.To.String() + "/" + strings.ToLower(string(q.Protocol)),
		From: q.From.String(), Origin: q.Origin, Targets: tr.Targets, Algorithm: tr.Algorithm,
		Path: tr.Path, Drift: tr.Drift, Notes: tr.Notes}
	sp, fe := FindFrontend(snap.Family(q.Family()), q)
	res.Frontend = fe
	res.Verdict = verdictOf(res.Targets)
	res.Masquerade = masqueradeOf(res.Targets)
	if sp != nil {
		annotate(res.Targets, sp)
		res.Decisions = consistent(Decisions(sp, fe.Kind, q), sp, fe.Kind, q, res.Verdict)
	} else if owners := AddressOwners(snap.Family(q.Family()), q.To.Addr()); len(owners) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%s is an address of %s, but not on port %d/%s",
			q.To.Addr(), strings.Join(owners, "; "), q.To.Port(), strings.ToLower(string(q.Protocol))))
	}
	res.Decisions = append(res.Decisions, tr.Decisions...)
	if sp == nil && res.Verdict == DNAT {
		res.Notes = append(res.Notes, "the packet is rewritten although no Service of the snapshot has this address: state left from another Service or another proxy")
	}
	return res, nil
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
				ts[i].Node, ts[i].Zone, ts[i].Local, ts[i].Terminating = ep.NodeName, ep.Zone, ep.Local, ep.Terminating
			}
		}
	}
}

// FindFrontend returns the service port and frontend q is sent to, or nil.
// A ClusterIP, externalIP or LoadBalancer IP wins over a NodePort on the same
// address and port.
func FindFrontend(v *proxy.FamilyView, q Query) (*proxy.ServicePort, *Frontend) {
	if v == nil {
		return nil, nil
	}
	addr, port := q.To.Addr(), int32(q.To.Port())
	var np *proxy.ServicePort
	for _, sp := range v.Sorted() {
		if sp.Protocol != q.Protocol {
			continue
		}
		fe := func(kind string) *Frontend {
			return &Frontend{Service: sp.Name.String(), Kind: kind, Address: q.To.String(), Protocol: string(sp.Protocol)}
		}
		if sp.Port == port {
			switch {
			case sp.ClusterIP == addr:
				return sp, fe(KindClusterIP)
			case slices.Contains(sp.ExternalIPs, addr):
				return sp, fe(KindExternalIP)
			case slices.Contains(sp.LoadBalancerIPs, addr):
				return sp, fe(KindLoadBalancerIP)
			}
		}
		if sp.NodePort != 0 && sp.NodePort == port && (addr.IsLoopback() || slices.Contains(q.NodeAddrs, addr)) && np == nil {
			np = sp
		}
	}
	if np != nil {
		return np, &Frontend{Service: np.Name.String(), Kind: KindNodePort, Address: q.To.String(), Protocol: string(np.Protocol)}
	}
	return nil, nil
}

// AddressOwners lists, for each service port of v that has addr as its
// ClusterIP, an externalIP or a LoadBalancer IP, "<kind> of <service
// port> (<port>/<protocol>)", sorted: what a query missed when it names
// a Service's address with another port or protocol.
func AddressOwners(v *proxy.FamilyView, addr netip.Addr) []string {
	if v == nil {
		return nil
	}
	var out []string
	for _, sp := range v.Sorted() {
		kind := ""
		switch {
		case sp.ClusterIP == addr:
			kind = KindClusterIP
		case slices.Contains(sp.ExternalIPs, addr):
			kind = KindExternalIP
		case slices.Contains(sp.LoadBalancerIPs, addr):
			kind = KindLoadBalancerIP
		default:
			continue
		}
		out = append(out, fmt.Sprintf("%s of %s (%d/%s)", kind, sp.Name, sp.Port, strings.ToLower(string(sp.Protocol))))
	}
	return out
}

// consistent keeps the decisions from contradicting the verdict the
// tracer found: a client on the node reaching an external frontend of a
// Service with externalTrafficPolicy Local is short-circuited to the
// cluster-wide endpoints (DNAT), so "dropped: no endpoint here" does not
// apply to it; where the platform does not short-circuit (a verdict other
// than DNAT), the Local policy's lines stand.
func consistent(ds []string, sp *proxy.ServicePort, kind string, q Query, v Verdict) []string {
	if !sp.HasAnyEndpoints && v == Drop {
		// A platform without reject (HNS) drops instead.
		for i, d := range ds {
			if d == noEndpointsRejected {
				ds[i] = "no usable endpoint anywhere in the cluster: this platform cannot reject, so connections are dropped (not refused)"
			}
		}
	}
	if kind == KindClusterIP || !sp.ExternalPolicyLocal || q.Origin == FromOutside || v != DNAT {
		return ds
	}
	out := ds[:0:0]
	for _, d := range ds {
		if strings.Contains(d, "connections are dropped") || strings.HasPrefix(d, "externalTrafficPolicy Local, client on this node") {
			continue
		}
		out = append(out, d)
	}
	return append(out, fmt.Sprintf("externalTrafficPolicy Local, client on this node: short-circuited to the cluster-wide endpoints (%d), as kube-proxy does",
		len(sp.ClusterEndpoints)))
}

// Decisions names, in words, the policies that decide where q goes: traffic
// policy, topology, terminating fallback, source ranges, affinity. They come
// from the snapshot (the cache's selection), the same on every platform.
func Decisions(sp *proxy.ServicePort, kind string, q Query) []string {
	var out []string
	var eps []proxy.Endpoint
	if kind == KindClusterIP {
		eps = sp.InternalEndpoints()
		if sp.InternalPolicyLocal {
			out = append(out, fmt.Sprintf("internalTrafficPolicy Local: only this node's endpoints (%d)", len(eps)))
		} else {
			out = append(out, fmt.Sprintf("internalTrafficPolicy Cluster: endpoints anywhere in the cluster (%d)", len(eps)))
		}
	} else {
		eps = sp.ExternalEndpoints()
		if sp.ExternalPolicyLocal {
			out = append(out, fmt.Sprintf("externalTrafficPolicy Local: only this node's endpoints (%d) for traffic from outside; the client's source is kept", len(eps)))
			if q.Origin != FromOutside {
				out = append(out, "externalTrafficPolicy Local, client on this node: the platform may short-circuit to the cluster-wide endpoints (see the verdict)")
			}
		} else {
			out = append(out, fmt.Sprintf("externalTrafficPolicy Cluster: endpoints anywhere in the cluster (%d); the source is masqueraded", len(eps)))
		}
	}
	switch {
	case !sp.HasAnyEndpoints:
		out = append(out, noEndpointsRejected)
		if len(sp.SlicePortsElsewhere) > 0 {
			names := make([]string, len(sp.SlicePortsElsewhere))
			for i, n := range sp.SlicePortsElsewhere {
				names[i] = strconv.Quote(n)
			}
			out = append(out, fmt.Sprintf("the Service's EndpointSlices have ready endpoints on port(s) named %s (%s), but this Service port is named %q: "+
				"endpoints belong to the Service port of the same name (check the Service's port names, or the EndpointSlices' if written by hand)",
				strings.Join(names, ", "), strings.ToLower(string(sp.Protocol)), sp.Name.Port))
		}
	case len(eps) == 0:
		out = append(out, "no usable endpoint on this node under a Local policy: connections are dropped")
	}
	if sp.TrafficDistribution != "" {
		out = append(out, fmt.Sprintf("trafficDistribution %s: the endpoints are the ones the zone hints give this node's zone", sp.TrafficDistribution))
	}
	if len(eps) > 0 && terminatingOnly(eps) {
		out = append(out, "terminating fallback: no endpoint is ready, so serving terminating ones are used")
	}
	if kind == KindLoadBalancerIP && len(sp.LoadBalancerSourceRanges) > 0 {
		in := false
		for _, p := range sp.LoadBalancerSourceRanges {
			in = in || p.Contains(q.From)
		}
		var rs []string
		for _, p := range sp.LoadBalancerSourceRanges {
			rs = append(rs, p.String())
		}
		if in {
			out = append(out, fmt.Sprintf("loadBalancerSourceRanges %s: %s is allowed", strings.Join(rs, ","), q.From))
		} else {
			out = append(out, fmt.Sprintf("loadBalancerSourceRanges %s: %s is not allowed (dropped)", strings.Join(rs, ","), q.From))
		}
	}
	if sp.AffinityTimeoutSeconds > 0 {
		out = append(out, fmt.Sprintf("sessionAffinity ClientIP (timeout %ds): a client address stays on the endpoint it got first", sp.AffinityTimeoutSeconds))
	}
	return out
}

const noEndpointsRejected = "no usable endpoint anywhere in the cluster: connections are rejected"

func terminatingOnly(eps []proxy.Endpoint) bool {
	for _, e := range eps {
		if !e.Terminating || e.Ready {
			return false
		}
	}
	return true
}
