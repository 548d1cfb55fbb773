package plan

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sort"

	"github.com/kproxy/kproxy/platform/windows/hns"
)

// Origin says where a connection starts, relative to the node whose load
// balancers are resolved.
type Origin string

// Origins.
const (
	// OriginPod is a pod on this node (behind its HNS network).
	OriginPod Origin = "pod"
	// OriginNode is the node itself (a host process).
	OriginNode Origin = "node"
	// OriginRemote is anything routed in from elsewhere: a pod on another
	// node, another node, a client outside the cluster.
	OriginRemote Origin = "remote"
)

// Conn is the first packet of a new connection, as Resolve sees it.
type Conn struct {
	// Protocol is HNS's protocol number (ProtocolTCP, ...).
	Protocol uint32
	Src      netip.Addr
	Dst      netip.AddrPort
	From     Origin
	// NodeAddrs are this node's addresses: a load balancer without a
	// frontend VIP (a NodePort) serves each of them.
	NodeAddrs []netip.Addr
}

// Resolution is where HNS sends a connection, under the model of Resolve.
type Resolution struct {
	// LB is the load balancer that takes the connection; nil when none does
	// (HNS then leaves the packet alone: for a Service address nobody owns,
	// it is lost).
	LB *LBSpec
	// Endpoints are LB's endpoint addresses, sorted (the backend port is
	// LB.InternalPort).
	Endpoints []netip.Addr
	// Pick is, with the SourceIP distribution (session affinity), the
	// endpoint this client address is kept on; invalid otherwise (every
	// endpoint is equally likely).
	Pick netip.Addr
	// SNAT is true when the backend sees a node address instead of the
	// client's (an external frontend without DSR). A backend reached by its
	// own connection (hairpin) always sees a node address: see SeesNode.
	SNAT bool
	// Reasons explain, in order, why each load balancer was skipped or taken.
	Reasons []string
}

// SeesNode reports whether backend be sees a node address as the source of
// the connection (rather than the client's own).
func (r *Resolution) SeesNode(c Conn, be netip.Addr) bool {
	return r.SNAT || be == c.Src
}

// Resolve answers "which load balancer takes this connection, and where may it
// go" from a list of load balancers (a Plan's, or the ones HNS holds through
// LiveLoadBalancers), under this model of HNS (VFP):
//   - a load balancer matches by family, protocol, frontend VIP and external
//     port; one without frontend VIP (a NodePort) matches every address of
//     the node, and from the node itself only with the LocalRoutedVIP flag;
//   - a load balancer without the VIPExternalIP flag (a ClusterIP) applies
//     to traffic from this node's pods and from the node, not to traffic
//     routed in from elsewhere;
//   - the SourceIP distribution keeps a client address on one endpoint (the
//     model picks it by a hash of the address);
//   - the backend sees the client's address through ClusterIP and DSR load
//     balancers, a node address through other external frontends (and when
//     a pod reaches itself).
//
// The first matching load balancer wins; HNS holds at most one per slot.
func Resolve(lbs []*LBSpec, c Conn) Resolution {
	var r Resolution
	v6 := c.Dst.Addr().Is6()
	for _, lb := range lbs {
		if (lb.Flags&hns.LBFlagIPv6 != 0) != v6 || lb.Protocol != c.Protocol || lb.ExternalPort != c.Dst.Port() {
			continue
		}
		external := lb.PortFlags&hns.PortFlagVIPExternalIP != 0
		switch {
		case len(lb.FrontendVIPs) == 0:
			if !slices.Contains(c.NodeAddrs, c.Dst.Addr()) {
				continue
			}
			if !external {
				r.Reasons = append(r.Reasons, fmt.Sprintf("skipped %s: a node-wide load balancer without the VIPExternalIP flag", lb.Slot()))
				continue
			}
			if c.From == OriginNode && lb.PortFlags&hns.PortFlagLocalRoutedVIP == 0 {
				r.Reasons = append(r.Reasons, fmt.Sprintf("skipped %s: NodePort without the LocalRoutedVIP flag does not apply to the node's own traffic", lb.Slot()))
				continue
			}
		case !slices.Contains(lb.FrontendVIPs, c.Dst.Addr()):
			continue
		case !external && c.From == OriginRemote:
			r.Reasons = append(r.Reasons, fmt.Sprintf("skipped %s: a ClusterIP load balancer applies only to this node's pods and the node itself", lb.Slot()))
			continue
		}
		r.LB = lb
		break
	}
	if r.LB == nil {
		r.Reasons = append(r.Reasons, fmt.Sprintf("no load balancer takes %s/%s", c.Dst, ProtocolName(c.Protocol)))
		return r
	}
	lb := r.LB
	r.Reasons = append(r.Reasons, fmt.Sprintf("load balancer %s (%s) takes it: %d endpoints, backend port %d", lb.Slot(), kindOr(lb.Kind), len(lb.Endpoints), lb.InternalPort))
	for _, e := range lb.Endpoints {
		if e.Is6() == v6 {
			r.Endpoints = append(r.Endpoints, e)
		}
	}
	sort.Slice(r.Endpoints, func(i, j int) bool { return r.Endpoints[i].Less(r.Endpoints[j]) })
	if lb.Distribution == hns.DistributionSourceIP && len(r.Endpoints) > 0 {
		h := fnv.New32a()
		h.Write(c.Src.AsSlice())
		r.Pick = r.Endpoints[int(h.Sum32()%uint32(len(r.Endpoints)))]
		r.Reasons = append(r.Reasons, "distribution SourceIP (session affinity): one client address stays on one endpoint")
	}
	switch {
	case lb.Flags&hns.LBFlagDSR != 0:
		r.Reasons = append(r.Reasons, "direct server return: the backend sees the client's address")
	case lb.PortFlags&hns.PortFlagVIPExternalIP != 0:
		r.SNAT = true
		r.Reasons = append(r.Reasons, "external frontend without DSR: the backend sees a node address")
	default:
		r.Reasons = append(r.Reasons, "ClusterIP load balancer: the backend sees the client's address (a node address when a pod reaches itself)")
	}
	return r
}

func kindOr(k LBKind) string {
	if k == "" {
		return "not made by this kproxy's plan"
	}
	return string(k)
}
