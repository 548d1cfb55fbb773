// Package facts holds what both Linux renderers (iptables and nftables)
// are configured with and the node facts they derive from it: the Config
// (flags, capabilities probed once), where NodePorts answer, the node's
// own addresses, the pod CIDRs of a family. It is pure and OS-free.
package facts

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Defaults for Config.
const (
	// DefaultMasqueradeBit is upstream kube-proxy's default masquerade bit (0x4000).
	DefaultMasqueradeBit = 14
	// DefaultFilterBit is the mark bit the iptables mode uses, together
	// with the masquerade bit, to tell the filter table to reject (0x8000)
	// or drop (0xc000) a packet the nat table has judged (upstream's old
	// drop bit).
	DefaultFilterBit = 15
	// DefaultShardThreshold is the number of dispatch rules above which an
	// iptables dispatch chain is split into shards.
	DefaultShardThreshold = 1000
)

// Config holds what is fixed for the life of a Linux backend: flags and the
// capabilities probed once at start. The nftables mode ignores the
// iptables-only fields (FilterBit, ShardThreshold).
type Config struct {
	// Family is the IP family of every address the backend renders.
	Family v1.IPFamily
	// MasqueradeBit is the mark bit (0-31) for "masquerade this packet".
	MasqueradeBit int
	// FilterBit is a second mark bit (0-31, not MasqueradeBit): set alone it
	// means "reject", set with MasqueradeBit it means "drop" (iptables).
	FilterBit int
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// ClusterCIDRs are the pod networks. With LocalDetect ClusterCIDR (the
	// default), traffic to a ClusterIP from outside them is masqueraded, and
	// pod traffic to an external address of an externalTrafficPolicy Local
	// service short-circuits to the cluster endpoints. Prefixes of the other
	// family are ignored.
	ClusterCIDRs []netip.Prefix
	// LocalDetect says how traffic from pods is told from other traffic
	// (kube-proxy's detectLocalMode): LocalClusterCIDR (ClusterCIDRs),
	// LocalNodeCIDR (this node's spec.podCIDRs, from the snapshot),
	// LocalBridgeInterface (packets entering through LocalInterface) or
	// LocalInterfaceNamePrefix (packets entering through an interface whose
	// name starts with LocalInterface). Empty means LocalClusterCIDR.
	LocalDetect    string
	LocalInterface string
	// NodePortAddresses restricts NodePorts to the node's addresses in these
	// prefixes (--nodeport-addresses); NodePortPrimary adds the node's primary
	// address ("primary"). Both empty means every local address.
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool
	// LocalhostNodePorts makes NodePorts answer on 127.0.0.1 too (IPv4 only;
	// needs route_localnet, and installs the CVE-2020-8558 martian guard).
	LocalhostNodePorts bool
	// RandomFully masquerades with fully random source ports (probed
	// capability in the iptables mode).
	RandomFully bool
	// TCPBeLiberal is conntrack.tcpBeLiberal: the kernel does not mark
	// out-of-window TCP packets INVALID, so, as upstream, the forward chain
	// drops no INVALID packets either.
	TCPBeLiberal bool
	// ShardThreshold is the number of dispatch rules above which the
	// iptables service and nodeport dispatch chains are split into shards
	// (0: DefaultShardThreshold; negative: never shard).
	ShardThreshold int
}

// DefaultConfig returns the defaults for family f, as upstream kube-proxy
// (localhost NodePorts on for IPv4).
func DefaultConfig(f v1.IPFamily) Config {
	return Config{
		Family:             f,
		MasqueradeBit:      DefaultMasqueradeBit,
		FilterBit:          DefaultFilterBit,
		LocalhostNodePorts: true,
		RandomFully:        true,
	}
}

// Detect-local modes (Config.LocalDetect), named as kube-proxy's detectLocalMode.
const (
	LocalClusterCIDR         = intent.LocalClusterCIDR
	LocalNodeCIDR            = intent.LocalNodeCIDR
	LocalBridgeInterface     = intent.LocalBridgeInterface
	LocalInterfaceNamePrefix = intent.LocalInterfaceNamePrefix
)

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Family != v1.IPv4Protocol && c.Family != v1.IPv6Protocol {
		errs = append(errs, fmt.Errorf("family %q: want IPv4 or IPv6", c.Family))
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		errs = append(errs, fmt.Errorf("masquerade bit %d: want 0-31", c.MasqueradeBit))
	}
	switch c.LocalDetect {
	case "", LocalClusterCIDR, LocalNodeCIDR:
	case LocalBridgeInterface, LocalInterfaceNamePrefix:
		if c.LocalInterface == "" || strings.ContainsAny(c.LocalInterface, " \t\"'+") || len(c.LocalInterface) > 15 {
			errs = append(errs, fmt.Errorf("detect-local %s: interface %q: want an interface name (1-15 characters, no blanks, quotes or '+')", c.LocalDetect, c.LocalInterface))
		}
	default:
		errs = append(errs, fmt.Errorf("detect-local mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", c.LocalDetect))
	}
	if c.FilterBit < 0 || c.FilterBit > 31 || c.FilterBit == c.MasqueradeBit {
		errs = append(errs, fmt.Errorf("filter bit %d: want 0-31 and not the masquerade bit", c.FilterBit))
	}
	return errors.Join(errs...)
}

// Is6 reports whether the config's family is IPv6.
func (c *Config) Is6() bool { return c.Family == v1.IPv6Protocol }

// OfFamily keeps the prefixes of the config's family, masked.
func (c *Config) OfFamily(ps []netip.Prefix) []netip.Prefix { return intent.OfFamily(c.Family, ps) }

// DetectLocal returns the detect-local setting as the intent reads it.
func (c *Config) DetectLocal() intent.DetectLocal {
	return intent.DetectLocal{Mode: c.LocalDetect, ClusterCIDRs: c.ClusterCIDRs, Interface: c.LocalInterface}
}

// AddrOK reports whether a is a usable unicast address of the family.
func (c *Config) AddrOK(a netip.Addr) bool {
	ic := intent.Config{Family: c.Family}
	return ic.AddrOK(a)
}

// LocalhostNodePortsOn reports whether NodePorts answer on 127.0.0.1 (IPv4
// with localhost NodePorts on).
func (c *Config) LocalhostNodePortsOn() bool {
	return c.Family == v1.IPv4Protocol && c.LocalhostNodePorts
}

// PodCIDRs returns the prefixes that tell pods from other clients (see
// intent.DetectLocal.PodCIDRs).
func (c *Config) PodCIDRs(node proxy.Node) []netip.Prefix {
	return c.DetectLocal().PodCIDRs(c.Family, node)
}

// PodSources reports whether pods can be told from other clients (see
// intent.DetectLocal.PodSources).
func (c *Config) PodSources(node proxy.Node) bool {
	return c.DetectLocal().PodSources(c.Family, node)
}

// NodePortDestinations returns where NodePorts answer: every local address
// (all), or the node's addresses in the configured prefixes plus its
// primary address, sorted (loopback only with localhost NodePorts).
func (c *Config) NodePortDestinations(node proxy.Node, local []netip.Addr) (all bool, ips []netip.Addr) {
	if len(c.NodePortAddresses) == 0 && !c.NodePortPrimary {
		return true, nil
	}
	prefixes := c.OfFamily(c.NodePortAddresses)
	for _, a := range local {
		if !c.AddrOK(a) {
			continue
		}
		for _, p := range prefixes {
			if p.Contains(a) {
				ips = append(ips, a)
				break
			}
		}
	}
	if c.NodePortPrimary {
		for _, a := range node.Addresses {
			if c.AddrOK(a) {
				ips = append(ips, a) // the first of the family is the primary
				break
			}
		}
	}
	ips = slices.DeleteFunc(ips, func(a netip.Addr) bool { return a.IsLoopback() && !c.LocalhostNodePortsOn() })
	slices.SortFunc(ips, netip.Addr.Compare)
	return false, slices.Compact(ips)
}

// NodeIPs returns the node's own addresses of the family (see
// intent.NodeIPs).
func (c *Config) NodeIPs(node proxy.Node, local []netip.Addr) []netip.Addr {
	return intent.NodeIPs(c.Family, node, local)
}

// ParseNodePortAddresses parses --nodeport-addresses values: CIDRs and the
// keyword "primary".
func ParseNodePortAddresses(values []string) (prefixes []netip.Prefix, primary bool, err error) {
	var errs []error
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "primary" {
			primary = true
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("--nodeport-addresses %q: %w", v, err))
			continue
		}
		prefixes = append(prefixes, p.Masked())
	}
	return prefixes, primary, errors.Join(errs...)
}
