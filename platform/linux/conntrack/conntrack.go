// Package conntrack computes which conntrack flows a Linux backend deletes
// after a sync (stale UDP flows of changed service ports) and matches flows
// against those filters. It is pure; reading and deleting flows is the
// driver's seam.
package conntrack

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// Filter selects stale flows to delete after a sync: flows of
// Protocol to OrigDst (a Service frontend) whose reply source — the endpoint
// the flow was DNATed to, or the frontend itself when it was never NATed — is
// not one of Keep. Flows to live endpoints survive; flows black-holed to a
// removed endpoint, or recorded without NAT while the Service had no
// endpoints, are deleted so the next packet is load-balanced afresh.
type Filter struct {
	Protocol v1.Protocol
	OrigDst  netip.AddrPort
	Keep     []netip.AddrPort
}

// Flow is the part of a conntrack entry the filters look at.
type Flow struct {
	Protocol v1.Protocol
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
	// Established is true for a TCP flow in the ESTABLISHED state (read
	// for least connection; the stale-flow cleanup ignores it).
	Established bool
}

type ctKey struct {
	proto v1.Protocol
	dst   netip.AddrPort
}

// Matcher matches flows against a set of filters in constant time.
type Matcher struct {
	keep map[ctKey]map[netip.AddrPort]bool
}

// NewMatcher indexes filters. Filters on the same frontend merge:
// a flow survives when any of them keeps it.
func NewMatcher(filters []Filter) *Matcher {
	m := &Matcher{keep: make(map[ctKey]map[netip.AddrPort]bool, len(filters))}
	for _, f := range filters {
		k := ctKey{f.Protocol, f.OrigDst}
		set := m.keep[k]
		if set == nil {
			set = map[netip.AddrPort]bool{}
			m.keep[k] = set
		}
		for _, a := range f.Keep {
			set[a] = true
		}
	}
	return m
}

// Empty reports whether no flow can match.
func (m *Matcher) Empty() bool { return len(m.keep) == 0 }

// Match reports whether f must be deleted.
func (m *Matcher) Match(f Flow) bool {
	set, ok := m.keep[ctKey{f.Protocol, unmap(f.OrigDst)}]
	return ok && !set[unmap(f.ReplySrc)]
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// frontends lists the addresses:ports a UDP service port is reached on.
func frontends(cfg *facts.Config, sp *proxy.ServicePort, local []netip.Addr) []netip.AddrPort {
	if sp == nil || !cfg.AddrOK(sp.ClusterIP) || sp.Port <= 0 || sp.Port > 65535 {
		return nil
	}
	port := uint16(sp.Port)
	out := []netip.AddrPort{netip.AddrPortFrom(sp.ClusterIP, port)}
	for _, list := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range list {
			if cfg.AddrOK(a) {
				out = append(out, netip.AddrPortFrom(a, port))
			}
		}
	}
	if sp.NodePort > 0 && sp.NodePort <= 65535 {
		for _, a := range local {
			if cfg.AddrOK(a) {
				out = append(out, netip.AddrPortFrom(a, uint16(sp.NodePort)))
			}
		}
	}
	return out
}

func endpointSet(sp *proxy.ServicePort) []netip.AddrPort {
	if sp == nil {
		return nil
	}
	eps := sp.AllReachableEndpoints()
	out := make([]netip.AddrPort, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.AddrPort())
	}
	return out
}

// StaleFlows returns the conntrack filters for one UDP service port of
// family that changed from old to cur (either may be nil; old is nil the
// first time a backend sees the port, when every flow to it is checked);
// local are the node's addresses (NodePorts are reached on them). Every
// Linux mode cleans the same flows.
func StaleFlows(family v1.IPFamily, old, cur *proxy.ServicePort, local []netip.Addr) []Filter {
	cfg := facts.Config{Family: family}
	return conntrackFor(&cfg, old, cur, local)
}

// conntrackFor returns the filters for one UDP service port that changed
// from old to cur (either may be nil; old is nil the first time a planner
// sees the port, when every flow to it is checked).
func conntrackFor(cfg *facts.Config, old, cur *proxy.ServicePort, local []netip.Addr) []Filter {
	isUDP := func(sp *proxy.ServicePort) bool { return sp != nil && sp.Protocol == v1.ProtocolUDP }
	if !isUDP(old) && !isUDP(cur) {
		return nil
	}
	var curFront, oldFront, keep []netip.AddrPort
	if isUDP(cur) {
		curFront = frontends(cfg, cur, local)
		keep = endpointSet(cur)
	}
	if isUDP(old) {
		oldFront = frontends(cfg, old, local)
	}
	if old != nil && cur != nil && slices.Equal(curFront, oldFront) && slices.Equal(keep, endpointSet(old)) {
		return nil // neither the frontends nor the endpoints changed
	}
	var out []Filter
	for _, f := range curFront {
		out = append(out, Filter{Protocol: v1.ProtocolUDP, OrigDst: f, Keep: keep})
	}
	for _, f := range oldFront {
		if !slices.Contains(curFront, f) {
			out = append(out, Filter{Protocol: v1.ProtocolUDP, OrigDst: f})
		}
	}
	return out
}
