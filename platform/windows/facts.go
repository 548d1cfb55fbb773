package windows

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// facts gathers the node facts for a plan from the backend's record (or the
// listing being adopted).
func (b *Backend) facts(node proxy.Node, fresh *listing) *plan.Facts {
	var caps hns.Capabilities
	if b.caps != nil {
		caps = *b.caps
	}
	f := GatherFacts(&b.opts, caps, b.network, b.ifaces, b.recordState(fresh), node)
	if !f.SourceVIP.IsValid() {
		f.SourceVIP = b.sourceVIP
	}
	return f
}

// GatherFacts derives the node facts of a plan from the backend's options,
// what HNS said (capabilities, network, its endpoints: st, which may be
// nil) and the Node object.
func GatherFacts(opts *Options, caps hns.Capabilities, network *hns.Network, ifaces []HostInterface, rec *reconcile.State, node proxy.Node) *plan.Facts {
	f := &plan.Facts{
		Family:                opts.Family,
		SourceVIP:             opts.SourceVIP,
		EnableDSR:             opts.EnableDSR,
		Caps:                  caps,
		ForwardHealthCheckVIP: opts.ForwardHealthCheckVIP,
		HealthzPort:           uint16(opts.HealthzPort),
	}
	if network != nil {
		f.Network = *network
	}
	f.NodeIP = nodeIP(opts, ifaces, node)
	f.HostMAC = opts.HostMAC
	if f.HostMAC == "" && f.NodeIP.IsValid() {
		f.HostMAC = macOf(ifaces, f.NodeIP)
	}
	if rec != nil && opts.ForwardHealthCheckVIP {
		f.RootEndpointIP = RootEndpointIP(rec, opts.RootHNSEndpointName)
	}
	return f
}

// nodeIP is Options.NodeIP, else the Node's first address of the family held
// by a host interface, else its first address of the family.
func nodeIP(opts *Options, ifaces []HostInterface, node proxy.Node) netip.Addr {
	v6 := opts.Family == v1.IPv6Protocol
	if ip := opts.NodeIP.Unmap(); ip.IsValid() && ip.Is6() == v6 {
		return ip
	}
	var first netip.Addr
	for _, a := range node.Addresses {
		a = a.Unmap()
		if !a.IsValid() || a.Is6() != v6 {
			continue
		}
		if hasAddr(ifaces, a) {
			return a
		}
		if !first.IsValid() {
			first = a
		}
	}
	return first
}

func hasAddr(ifaces []HostInterface, ip netip.Addr) bool {
	for _, i := range ifaces {
		for _, a := range i.Addrs {
			if a == ip {
				return true
			}
		}
	}
	return false
}

func macOf(ifaces []HostInterface, ip netip.Addr) string {
	for _, i := range ifaces {
		for _, a := range i.Addrs {
			if a == ip {
				return i.MAC
			}
		}
	}
	return ""
}

// RootEndpointIP is the address of the local endpoint named name (the
// root HNS endpoint forwarded health checks go to); invalid when none.
func RootEndpointIP(st *reconcile.State, name string) netip.Addr {
	var found []netip.Addr
	for ip, ep := range st.Endpoints {
		if !ep.Remote && strings.EqualFold(ep.Name, name) {
			found = append(found, ip)
		}
	}
	if len(found) == 0 {
		return netip.Addr{}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Less(found[j]) })
	return found[0]
}

// HostInterfaces lists the host's interfaces with package net (the
// default of Options.Interfaces).
func HostInterfaces() ([]HostInterface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []HostInterface
	for _, i := range ifs {
		hi := HostInterface{Name: i.Name, MAC: strings.ReplaceAll(i.HardwareAddr.String(), ":", "-")}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					hi.Addrs = append(hi.Addrs, ip.Unmap())
				}
			}
		}
		out = append(out, hi)
	}
	return out, nil
}
