// Package conntrack computes which conntrack flows a Linux backend deletes
// after a sync (stale UDP flows of changed service ports) and matches flows
// against those filters. It is pure; reading and deleting flows is the
// driver's seam.
package conntrack

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
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

// frontends lists the addresses and ports a service port's intent is
// reached on: its ClusterIP, externalIPs and load balancer IPs, and its
// NodePort on each of local (the node's addresses of the family).
func frontends(p *intent.Port, local []netip.Addr) []netip.AddrPort {
	var out []netip.AddrPort
	c := intent.Config{Family: p.Family}
	for i := range p.Frontends {
		fe := &p.Frontends[i]
		if fe.Kind != intent.NodePort {
			out = append(out, netip.AddrPortFrom(fe.Addr, uint16(fe.Port)))
			continue
		}
		for _, a := range local {
			if c.AddrOK(a) {
				out = append(out, netip.AddrPortFrom(a, uint16(fe.Port)))
			}
		}
	}
	return out
}

// endpointSet lists the endpoints of both of p's sets, once each, sorted.
func endpointSet(p *intent.Port) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(p.Cluster)+len(p.Local))
	for _, list := range [][]proxy.Endpoint{p.Cluster, p.Local} {
		for _, ep := range list {
			out = append(out, ep.AddrPort())
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// StaleFlows returns the conntrack filters for one UDP service port whose
// intent changed from old to cur (either may be nil; old is nil the first
// time a backend sees the port, when every flow to it is checked); local
// are the node's addresses (NodePorts are reached on them). Flows to a
// frontend are kept when they go to an endpoint of cur; flows to a
// frontend cur no longer has are deleted. Every Linux mode cleans the same
// flows.
func StaleFlows(old, cur *intent.Port, local []netip.Addr) []Filter {
	isUDP := func(p *intent.Port) bool { return p != nil && p.Protocol == v1.ProtocolUDP }
	if !isUDP(old) && !isUDP(cur) {
		return nil
	}
	var curFront, oldFront, keep []netip.AddrPort
	if isUDP(cur) {
		curFront = frontends(cur, local)
		keep = endpointSet(cur)
	}
	if isUDP(old) {
		oldFront = frontends(old, local)
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
