package netns

import (
	"context"
	"fmt"
	"net/netip"
)

// AddLANHost adds a host that the topology does not describe (a control
// plane, for example) to the node network: a namespace named after host,
// with loopback up, eth0 on the lan bridge carrying v4 and v6, and default
// routes via the lan router, like the outside client but without its
// Service routes. Both addresses must be free addresses of the node
// network. Close removes the namespace with the others, after killing
// whatever still runs in it.
func (c *Cluster) AddLANHost(ctx context.Context, host string, v4, v6 netip.Addr) (*NS, error) {
	t := c.Topology
	port := "p-" + host
	switch {
	case host == "" || len(port) > 15:
		return nil, fmt.Errorf("netns: LAN host name %q: want 1-13 characters (interface p-<host>)", host)
	case c.NS(host) != nil:
		return nil, fmt.Errorf("netns: host %q already exists in %s", host, c.ID)
	case !v4.Is4() || !t.NodeNetwork4.Contains(v4) || !v6.Is6() || !t.NodeNetwork6.Contains(v6):
		return nil, fmt.Errorf("netns: LAN host %s: addresses %s, %s must be in the node network %s, %s",
			host, v4, v6, t.NodeNetwork4, t.NodeNetwork6)
	}
	for _, a := range []netip.Addr{v4, v6} {
		if a == lastHost(t.NodeNetwork4) || a == lastHost(t.NodeNetwork6) {
			return nil, fmt.Errorf("netns: LAN host %s: %s is the lan router's address", host, a)
		}
		if owner := t.HostByAddr(a); owner != "" {
			return nil, fmt.Errorf("netns: LAN host %s: %s belongs to %s", host, a, owner)
		}
	}
	lan, err := c.MustNS(LAN)
	if err != nil {
		return nil, err
	}
	ns, err := c.add(ctx, host)
	if err != nil {
		return nil, err
	}
	if err := lan.IP(ctx,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", port, ns.Name),
		fmt.Sprintf("link set %s master br0 up", port),
	); err != nil {
		return nil, err
	}
	if err := ns.IP(ctx,
		"link set lo up",
		"link set eth0 up",
		fmt.Sprintf("addr add %s/%d dev eth0", v4, t.NodeNetwork4.Bits()),
		fmt.Sprintf("addr add %s/%d dev eth0 nodad", v6, t.NodeNetwork6.Bits()),
		fmt.Sprintf("route add default via %s dev eth0", lastHost(t.NodeNetwork4)),
		fmt.Sprintf("route add default via %s dev eth0", lastHost(t.NodeNetwork6)),
	); err != nil {
		return nil, err
	}
	c.logf("netns: LAN host %s (%s, %s) added to %s", host, v4, v6, c.ID)
	return ns, nil
}
