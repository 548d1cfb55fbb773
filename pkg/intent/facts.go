package intent

import (
	"context"
	"io"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Detect-local modes (kube-proxy's detectLocalMode): how a node tells its
// pods' traffic from other traffic.
const (
	LocalClusterCIDR         = "ClusterCIDR"
	LocalNodeCIDR            = "NodeCIDR"
	LocalBridgeInterface     = "BridgeInterface"
	LocalInterfaceNamePrefix = "InterfaceNamePrefix"
)

// DetectLocal is the detect-local setting: the mode and what it needs.
type DetectLocal struct {
	// Mode is one of the Local* constants ("" means LocalClusterCIDR).
	Mode string
	// ClusterCIDRs are the pod networks (LocalClusterCIDR).
	ClusterCIDRs []netip.Prefix
	// Interface is the bridge or the interface name prefix (the interface
	// modes).
	Interface string
}

// PodCIDRs returns the prefixes of family f that tell pods from other
// clients when the mode matches by source address: the cluster CIDRs, or
// with LocalNodeCIDR the node's pod CIDRs (nil for the interface modes and
// until the node's are known).
func (d DetectLocal) PodCIDRs(f v1.IPFamily, node proxy.Node) []netip.Prefix {
	switch d.Mode {
	case LocalBridgeInterface, LocalInterfaceNamePrefix:
		return nil
	case LocalNodeCIDR:
		return OfFamily(f, node.PodCIDRs)
	}
	return OfFamily(f, d.ClusterCIDRs)
}

// PodSources reports whether the node can tell pods of family f from other
// clients: an interface mode, or pod CIDRs of the family known.
func (d DetectLocal) PodSources(f v1.IPFamily, node proxy.Node) bool {
	switch d.Mode {
	case LocalBridgeInterface, LocalInterfaceNamePrefix:
		return d.Interface != ""
	}
	return len(d.PodCIDRs(f, node)) > 0
}

// OfFamily keeps the prefixes of family f, masked.
func OfFamily(f v1.IPFamily, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.IsValid() && p.Addr().Is6() == (f == v1.IPv6Protocol) && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// NodeIPs returns the node's own addresses of family f: its status
// addresses and the non-loopback addresses on its interfaces, sorted.
func NodeIPs(f v1.IPFamily, node proxy.Node, local []netip.Addr) []netip.Addr {
	c := Config{Family: f}
	var out []netip.Addr
	for _, list := range [][]netip.Addr{node.Addresses, local} {
		for _, a := range list {
			if c.addrOK(a) && !a.IsLoopback() {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Settings are the node-wide settings the decisions read, derived once from
// the configuration and the platform.
type Settings struct {
	MasqueradeAll bool
	DetectLocal   DetectLocal
	// PodsAlwaysKnown: the platform tells pods from other clients whatever
	// the detect-local setting (HNS applies a ClusterIP's load balancer to
	// the traffic of this node's pods and of the node itself).
	PodsAlwaysKnown bool
	// PreserveDestination: the platform honours the Service annotation
	// preserve-destination (HNS, as upstream's Windows proxy; Linux ignores
	// it, as upstream's Linux proxies do).
	PreserveDestination bool
}

// Config returns the intent's Config of family f on a node with these
// settings, its Node object's facts and the addresses on its interfaces.
func (s Settings) Config(f v1.IPFamily, node proxy.Node, local []netip.Addr) Config {
	return Config{
		Family:        f,
		MasqueradeAll: s.MasqueradeAll,
		PodSources:    s.PodsAlwaysKnown || s.DetectLocal.PodSources(f, node),
		NodeIPs:       NodeIPs(f, node, local),

		PreserveDestination: s.PreserveDestination,
	}
}

// Backend programs one IP family of a node from intent views: the app
// builds a View per family at each sync and hands it over.
//
// Sync makes the platform match v. It may write only what v.Changed names
// unless v.Full is set. On error the app retries later with a full View; a
// backend must keep programming everything it can past one bad item and
// return the joined errors.
type Backend interface {
	Sync(ctx context.Context, v *View) error
}

// DryRunner renders, without side effects, what a backend would program
// for a full View.
type DryRunner interface {
	DryRun(w io.Writer, v *View) error
}

// ConnectionCounter is implemented by backends that balance
// least-connection ports by the established connections of each endpoint
// (read from the platform). Before each sync the app asks for the counts
// of ports' endpoints; the ports whose counts changed since the last call
// are built again.
type ConnectionCounter interface {
	// Connections returns, for the least-connection ports of ports, the
	// established connections per endpoint, read again when due (or at
	// once when ch changes one of them), and the ports whose counts
	// changed since the last call.
	Connections(ports *proxy.FamilyView, ch proxy.Changes) (conns map[proxy.ServicePortName]map[netip.AddrPort]int, changed map[proxy.ServicePortName]struct{})
	// ConnectionsDue reports whether a refresh of the counts is due: the
	// app then asks for a sync even without a change.
	ConnectionsDue() bool
}
