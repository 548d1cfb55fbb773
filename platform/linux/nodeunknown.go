package linux

import (
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables"
)

// Start-up without the Node object.
//
// The only part of the plan that needs the Node's addresses to be right is
// where NodePorts answer when nodePortAddresses holds "primary": on the
// node's primary address (the first of its family in the Node's status).
// kproxy waits a bounded time for the Node (pkg/app) and then syncs
// anyway; a plan made then would have no NodePort destination at all, and
// a restarting kproxy would take the previous run's NodePorts away until
// the Node is read. So, while the Node's addresses are unknown (no Node
// object, or one without addresses), the backend plans with the primary
// address the kernel's rules already use: the destinations of
// KPROXY-SERVICES' jumps to KPROXY-NODEPORTS that no configured CIDR
// explains, read at each full sync. Without such rules (a node's very
// first start) NodePorts on the primary address wait for the Node: kproxy
// never answers on addresses the operator did not choose. (Everything else
// is right without the Node: the other NodePort modes use the local
// addresses, and with detect-local mode NodeCIDR kproxy does not sync
// before it has the Node's pod CIDRs.)

// nodeUnknown reports whether the snapshot's node facts lack its addresses.
func nodeUnknown(n proxy.Node) bool { return !n.Known || len(n.Addresses) == 0 }

// primaryKeeper holds, while the Node's addresses are unknown and
// NodePorts answer on the primary address only, the primary address the
// kernel's rules use. Both Linux modes keep one per family.
type primaryKeeper struct {
	keeping bool
	kept    []netip.Addr
}

// node returns the node facts to plan with (see above). inRules reads the
// primary addresses the kernel's rules use; it is called on a full sync
// only (full), a partial one uses what the last full sync read.
func (k *primaryKeeper) node(log klog.Logger, family v1.IPFamily, cfg facts.Config, n proxy.Node, full bool, inRules func() []netip.Addr) proxy.Node {
	if !cfg.NodePortPrimary || !nodeUnknown(n) {
		if k.keeping {
			log.Info("The Node's addresses are known: NodePorts follow its primary address", "family", family, "node", n.Name)
		}
		k.keeping, k.kept = false, nil
		return n
	}
	if full {
		kept := keptPrimaries(inRules(), family, cfg.NodePortAddresses)
		if !k.keeping || !slices.Equal(kept, k.kept) {
			if len(kept) > 0 {
				log.Info("The Node's addresses are unknown: NodePorts stay on the primary address the rules already use (nodePortAddresses primary)",
					"family", family, "node", n.Name, "addresses", kept)
			} else {
				log.Info("The Node's addresses are unknown: NodePorts on the node's primary address wait for the Node object (nodePortAddresses primary)",
					"family", family, "node", n.Name)
			}
		}
		k.keeping, k.kept = true, kept
	}
	if len(k.kept) == 0 {
		return n
	}
	out := n
	out.Addresses = k.kept
	return out
}

// planNode is the iptables mode's primaryKeeper.node: natSave is
// iptables-save of the nat table on a full sync, nil on a partial one.
// Called with the Driver's lock held.
func (m *iptMode) planNode(n proxy.Node, natSave []byte) proxy.Node {
	return m.primary.node(m.log, m.family, m.opts.Rules, n, natSave != nil, func() []netip.Addr { return primaryInRules(natSave) })
}

// keptPrimaries keeps, of the NodePort destinations the kernel's rules
// hold, those of family that are not loopback and that none of the
// configured prefixes contains: the node's primary address as the run that
// wrote them knew it. Sorted, without duplicates.
func keptPrimaries(addrs []netip.Addr, family v1.IPFamily, prefixes []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.Is4() != (family == v1.IPv4Protocol) || a.IsLoopback() ||
			slices.ContainsFunc(prefixes, func(c netip.Prefix) bool { return c.Contains(a) }) {
			continue
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// primaryInRules returns the single-address NodePort destinations in a
// save of the nat table (the "-d ADDR -j KPROXY-NODEPORTS" rules of
// KPROXY-SERVICES).
func primaryInRules(natSave []byte) []netip.Addr {
	head := "-A " + iptables.ChainServices + " -d "
	tail := " -j " + iptables.ChainNodePorts
	var out []netip.Addr
	for _, l := range strings.Split(string(natSave), "\n") {
		if !strings.HasPrefix(l, head) || !strings.HasSuffix(l, tail) {
			continue
		}
		p, err := netip.ParsePrefix(strings.TrimSuffix(strings.TrimPrefix(l, head), tail))
		if err != nil || !p.IsSingleIP() {
			continue
		}
		out = append(out, p.Addr())
	}
	return out
}
