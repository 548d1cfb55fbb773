package app

import (
	"net"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// withBindAddress applies bindAddress the way upstream kube-proxy does: a
// specific address (not 0.0.0.0 or ::) is this node's primary IP of its
// family, whatever the Node object says. It returns snap itself when there
// is nothing to change, else a shallow copy whose Node.Addresses start with
// bind (the cache puts each family's primary address first; the backends
// take the first address of a family as the primary one).
func withBindAddress(snap *proxy.Snapshot, bind netip.Addr) *proxy.Snapshot {
	if snap == nil || !bind.IsValid() || bind.IsUnspecified() {
		return snap
	}
	bind = bind.Unmap()
	if len(snap.Node.Addresses) > 0 && snap.Node.Addresses[0] == bind {
		return snap
	}
	out := *snap
	addrs := make([]netip.Addr, 0, len(snap.Node.Addresses)+1)
	addrs = append(addrs, bind)
	for _, a := range snap.Node.Addresses {
		if a != bind {
			addrs = append(addrs, a)
		}
	}
	out.Node.Addresses = addrs
	return &out
}

// primaryIP returns the node's primary IP of family: the first address of
// the family in node.Addresses (bindAddress already applied), or an invalid
// address when there is none.
func primaryIP(node proxy.Node, family v1.IPFamily) netip.Addr {
	for _, a := range node.Addresses {
		if a.Is4() == (family == v1.IPv4Protocol) {
			return a
		}
	}
	return netip.Addr{}
}

// healthCheckIPs returns the addresses the health check node ports listen
// on, as upstream kube-proxy v1.37 chooses them, for each family kproxy
// programs: the unspecified address of the family when nodePortAddresses
// accepts every address of it; otherwise the local addresses (local) inside
// its CIDRs of the family, which may be none. "primary" stands for the
// node's primary IP of the family, and for every address when the node has
// none (or only a loopback one) in that family.
func healthCheckIPs(np config.NodePortAddresses, families []v1.IPFamily, node proxy.Node, local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, f := range families {
		unspecified := netip.IPv4Unspecified()
		if f == v1.IPv6Protocol {
			unspecified = netip.IPv6Unspecified()
		}
		var cidrs []netip.Prefix
		all := false
		if np.Primary {
			if ip := primaryIP(node, f); ip.IsValid() && !ip.IsLoopback() {
				cidrs = []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}
			} else {
				all = true
			}
		} else {
			cidrs, all = np.ForFamily(f)
		}
		if all {
			out = append(out, unspecified)
			continue
		}
		for _, a := range local {
			for _, p := range cidrs {
				if p.Contains(a) {
					out = append(out, a)
					break
				}
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// interfaceAddrs lists the node's local addresses (net.InterfaceAddrs).
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}
