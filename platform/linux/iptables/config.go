package iptables

import (
	"net/netip"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// localMatch is one way to match traffic from local pods: is matches it,
// not matches everything else; iface tells an input-interface match.
type localMatch struct {
	is, not string
	iface   bool
}

// staticLocal returns the matches known from the configuration alone (none
// for LocalNodeCIDR until the node is known).
func staticLocal(c *facts.Config) []localMatch {
	switch c.LocalDetect {
	case facts.LocalBridgeInterface:
		return []localMatch{{is: "-i " + c.LocalInterface, not: "! -i " + c.LocalInterface, iface: true}}
	case facts.LocalInterfaceNamePrefix:
		return []localMatch{{is: "-i " + c.LocalInterface + "+", not: "! -i " + c.LocalInterface + "+", iface: true}}
	case facts.LocalNodeCIDR:
		return nil
	}
	return cidrMatches(c.OfFamily(c.ClusterCIDRs))
}

// nodeLocal returns the matches for LocalNodeCIDR: the node's pod CIDRs of
// the family.
func nodeLocal(c *facts.Config, n proxy.Node) []localMatch {
	return cidrMatches(c.OfFamily(n.PodCIDRs))
}

func cidrMatches(ps []netip.Prefix) []localMatch {
	var out []localMatch
	for _, p := range ps {
		out = append(out, localMatch{is: "-s " + p.String(), not: "! -s " + p.String()})
	}
	return out
}
