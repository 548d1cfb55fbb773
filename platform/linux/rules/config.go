package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Defaults for Config.
const (
	// DefaultMasqueradeBit is upstream kube-proxy's default masquerade bit (0x4000).
	DefaultMasqueradeBit = 14
	// DefaultFilterBit is the mark bit kproxy uses, together with the
	// masquerade bit, to tell the filter table to reject (0x8000) or drop
	// (0xc000) a packet the nat table has judged (upstream's old drop bit).
	DefaultFilterBit = 15
	// DefaultShardThreshold is the number of dispatch rules above which a
	// dispatch chain is split into shards.
	DefaultShardThreshold = 1000
)

// Config holds what is fixed for the life of a planner: flags and the
// capabilities probed once at start.
type Config struct {
	// Family is the IP family of every address the planner renders.
	Family v1.IPFamily
	// MasqueradeBit is the mark bit (0-31) for "masquerade this packet".
	MasqueradeBit int
	// FilterBit is a second mark bit (0-31, not MasqueradeBit): set alone it
	// means "reject", set with MasqueradeBit it means "drop".
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
	// RandomFully adds --random-fully to MASQUERADE (probed capability).
	RandomFully bool
	// TCPBeLiberal is conntrack.tcpBeLiberal: the kernel does not mark
	// out-of-window TCP packets INVALID, so, as upstream, the forward chain
	// drops no INVALID packets either.
	TCPBeLiberal bool
	// ShardThreshold is the number of dispatch rules above which the
	// service and nodeport dispatch chains are split into shards (0:
	// DefaultShardThreshold; negative: never shard).
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

// Detect-local modes (Config.LocalDetect), named as kube-proxy's detectLocalMode.
const (
	LocalClusterCIDR         = "ClusterCIDR"
	LocalNodeCIDR            = "NodeCIDR"
	LocalBridgeInterface     = "BridgeInterface"
	LocalInterfaceNamePrefix = "InterfaceNamePrefix"
)

// localMatch is one way to match traffic from local pods: is matches it,
// not matches everything else; iface tells an input-interface match.
type localMatch struct {
	is, not string
	iface   bool
}

// staticLocal returns the matches known from the configuration alone (none
// for LocalNodeCIDR until the node is known).
func (c *Config) staticLocal() []localMatch {
	switch c.LocalDetect {
	case LocalBridgeInterface:
		return []localMatch{{is: "-i " + c.LocalInterface, not: "! -i " + c.LocalInterface, iface: true}}
	case LocalInterfaceNamePrefix:
		return []localMatch{{is: "-i " + c.LocalInterface + "+", not: "! -i " + c.LocalInterface + "+", iface: true}}
	case LocalNodeCIDR:
		return nil
	}
	return cidrMatches(c.ofFamily(c.ClusterCIDRs))
}

// nodeLocal returns the matches for LocalNodeCIDR: the node's pod CIDRs of
// the family.
func (c *Config) nodeLocal(n proxy.Node) []localMatch {
	return cidrMatches(c.ofFamily(n.PodCIDRs))
}

func cidrMatches(ps []netip.Prefix) []localMatch {
	var out []localMatch
	for _, p := range ps {
		out = append(out, localMatch{is: "-s " + p.String(), not: "! -s " + p.String()})
	}
	return out
}

func (c *Config) is6() bool { return c.Family == v1.IPv6Protocol }

// ofFamily keeps the prefixes of the config's family.
func (c *Config) ofFamily(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is6() == c.is6() && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
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
