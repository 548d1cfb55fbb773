package cache

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// taintToBeDeleted is the taint the cluster autoscaler puts on a node it is
// about to remove; load balancers should stop sending traffic to it.
const taintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// topologyLabels are the Node labels endpoint selection depends on.
var topologyLabels = []string{v1.LabelTopologyZone, v1.LabelTopologyRegion}

// parseNode reads the facts kproxy needs from this node's Node object.
func parseNode(n *v1.Node) (proxy.Node, []Problem) {
	var problems []Problem
	bad := func(field, format string, args ...any) {
		problems = append(problems, Problem{Kind: "Node", Object: types.NamespacedName{Name: n.Name}, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	out := proxy.Node{Name: n.Name, Known: true, Zone: n.Labels[v1.LabelTopologyZone]}
	for _, l := range topologyLabels {
		if v, ok := n.Labels[l]; ok {
			if out.Labels == nil {
				out.Labels = map[string]string{}
			}
			out.Labels[l] = v
		}
	}
	for i, a := range n.Status.Addresses {
		if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
			continue
		}
		ip, err := parseIP(a.Address)
		if err != nil {
			bad(fmt.Sprintf("status.addresses[%d].address", i), "%v", err)
			continue
		}
		out.Addresses = append(out.Addresses, ip)
	}
	out.Addresses = primaryFirst(n, out.Addresses)
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for i, c := range cidrs {
		p, err := parsePrefix(c)
		if err != nil {
			bad(fmt.Sprintf("spec.podCIDRs[%d]", i), "%v", err)
			continue
		}
		out.PodCIDRs = append(out.PodCIDRs, p)
	}
	out.Deleting = n.DeletionTimestamp != nil
	for _, t := range n.Spec.Taints {
		if t.Key == taintToBeDeleted {
			out.Deleting = true
		}
	}
	return out, problems
}

// primaryFirst orders node addresses so that, per family, the node's primary
// address (its first InternalIP, else its first ExternalIP, as the kubelet
// reports them) comes first, followed by the others sorted. Consumers that
// want "the node IP" of a family take the first address of that family.
func primaryFirst(n *v1.Node, addrs []netip.Addr) []netip.Addr {
	if len(addrs) == 0 {
		return nil
	}
	var primary [2]netip.Addr
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			ip, err := parseIP(a.Address)
			if a.Type != typ || err != nil {
				continue
			}
			if !primary[familyIndex(ip)].IsValid() {
				primary[familyIndex(ip)] = ip
			}
		}
	}
	rest := slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool { return a == primary[0] || a == primary[1] })
	rest = sortUniqueAddrs(rest)
	var out []netip.Addr
	for _, p := range primary {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	return append(out, rest...)
}

// topologyChanged reports whether endpoint selection must be recomputed.
func topologyChanged(a, b proxy.Node) bool {
	return a.Zone != b.Zone || a.Name != b.Name || !maps.Equal(a.Labels, b.Labels)
}

func nodesEqual(a, b proxy.Node) bool {
	return a.Name == b.Name && a.Zone == b.Zone && a.Known == b.Known && a.Deleting == b.Deleting &&
		maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}
