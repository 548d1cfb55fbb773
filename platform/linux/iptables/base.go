package iptables

// The fixed chains every node has (dispatch entry points, masquerade,
// filter hooks) and the jumps into them from the built-in chains.

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
)

// writeBase renders the fixed chains and writes those whose content changed.
func (p *planning) writeBase(w *planWriter, in Input, full bool, modeChanged [2]bool, plan *Plan) {
	r := p.r
	var nat, filter []chainOut

	// KPROXY-SERVICES: dispatch, then the jump to NodePorts. The dispatch
	// parents are rendered again only when their entries, mode or tail
	// changed (a flat parent may hold up to ShardThreshold rules).
	node := in.View.Node
	if in.Node != nil {
		node = *in.Node
	}
	all, ips := r.cfg.NodePortDestinations(node, in.View.LocalAddrs)
	tail := &builder{chain: ChainServices}
	switch {
	case all && r.cfg.LocalhostNodePortsOn():
		tail.add("-m addrtype --dst-type LOCAL -j", ChainNodePorts)
	case all:
		tail.add("! -d", r.loopback.String(), "-m addrtype --dst-type LOCAL -j", ChainNodePorts)
	default:
		for _, ip := range ips {
			tail.add("-d", r.host(ip), "-j", ChainNodePorts)
		}
	}
	localhost := r.cfg.LocalhostNodePortsOn() && (all || slices.ContainsFunc(ips, netip.Addr.IsLoopback))
	plan.RouteLocalnet = localhost
	for i, name := range []string{ChainServices, ChainNodePorts} {
		d := p.disp[i]
		fresh := full || modeChanged[i] || len(d.dirty) > 0 || p.parents[i].name == ""
		if i == 0 && !bytes.Equal(tail.b, p.svcTail) {
			fresh = true
		}
		if fresh {
			b := &builder{chain: name}
			p.dispatchBody(b, d)
			if i == 0 {
				b.b = append(b.b, tail.b...)
			}
			p.parents[i] = b.out()
		}
		nat = append(nat, p.parents[i])
		d.dirty = map[uint16]bool{}
	}
	p.svcTail = tail.b

	// Hairpin: a pod reaching itself through a Service must be masqueraded
	// so that the answer comes back through the node.
	hp := &builder{chain: ChainHairpin}
	addrs := make([]netip.Addr, 0, len(p.hairpin))
	for a := range p.hairpin {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		hp.add("-s", r.host(a), "-d", r.host(a), r.masquerade)
	}
	nat = append(nat, hp.out())

	post := &builder{chain: ChainPostrouting}
	post.add("-m conntrack --ctstate DNAT -j", ChainHairpin)
	post.add("-m mark !", r.matchMasq[len("-m mark "):], "-j RETURN")
	post.add(r.clearMasq)
	post.add(r.masquerade)
	nat = append(nat, post.out())

	rej := &builder{chain: ChainReject}
	rej.add(r.setReject)
	rej.add("-j ACCEPT")
	drop := &builder{chain: ChainDrop}
	drop.add(r.setDrop)
	drop.add("-j ACCEPT")
	nat = append(nat, rej.out(), drop.out())
	if len(r.local) > 1 && !r.cfg.MasqueradeAll {
		oc := &builder{chain: ChainOffCluster}
		for _, m := range r.local {
			oc.add(m.is, "-j RETURN")
		}
		oc.add(r.setMasq)
		nat = append(nat, oc.out())
	}
	canary := &builder{chain: ChainCanary}
	canary.add("-j RETURN")
	nat = append(nat, canary.out())

	// filter
	fw := &builder{chain: ChainFirewall}
	// TCP gets a reset: an ICMPv6 port-unreachable only fails a connect()
	// on its retransmission a second later (ICMPv4 fails it at once), and
	// clients of a Service without endpoints must be refused at once.
	fw.add("-p tcp", r.matchReject, "-j REJECT --reject-with tcp-reset")
	fw.add(r.matchReject, "-j REJECT --reject-with", r.rejectWith)
	fw.add(r.matchDrop, "-j DROP")
	if localhost {
		// CVE-2020-8558: with route_localnet, never accept packets to
		// 127.0.0.0/8 from elsewhere unless they are our DNATed NodePort
		// traffic or its replies.
		fw.add("! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP")
		// A counting rule (no target) for
		// kubeproxy_iptables_localhost_nodeports_accepted_packets_total:
		// the first packet of each localhost NodePort connection DNATed to
		// an endpoint (a local process's packet from 127.0.0.0/8, seen in
		// OUTPUT before masquerading), counted once.
		fw.add(LocalhostNodePortsCounted)
	}
	filter = append(filter, fw.out())
	inp := &builder{chain: ChainInput}
	inp.add("-j", ChainFirewall)
	hcs := make([]int32, 0, len(p.hcPorts))
	for port := range p.hcPorts {
		hcs = append(hcs, port)
	}
	slices.Sort(hcs)
	for _, port := range hcs {
		inp.add(portMatch("tcp", port), "-j ACCEPT")
	}
	filter = append(filter, inp.out())
	fwd := &builder{chain: ChainForward}
	fwd.add("-j", ChainFirewall)
	if !r.cfg.TCPBeLiberal {
		// Its packet counter is
		// kubeproxy_iptables_ct_state_invalid_dropped_packets_total.
		fwd.add(InvalidDropRule)
	}
	fwd.add(r.matchMasq, "-j ACCEPT")
	fwd.add("-m conntrack --ctstate DNAT -j ACCEPT")
	filter = append(filter, fwd.out())
	fcanary := &builder{chain: ChainCanary}
	fcanary.add("-j RETURN")
	filter = append(filter, fcanary.out())

	p.baseRules, p.baseChains, p.filterRules = 0, 0, 0
	for ti, list := range [][]chainOut{nat, filter} {
		for _, c := range list {
			p.emit(w, ti, c)
			n := bytes.Count(c.body, []byte{'\n'})
			p.baseRules += n
			p.baseChains++
			if ti == 1 {
				p.filterRules += n
			}
		}
	}
	p.drop(w, 0, ChainOffCluster)
}

// Rule renders the jump's spec as iptables-save prints it (arguments with
// blanks quoted), without "-A CHAIN".
func (j Jump) Rule() string {
	parts := make([]string, len(j.Spec))
	for i, a := range j.Spec {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// Jumps lists the rules kproxy needs in built-in chains (also in every Plan).
func Jumps() []Jump {
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	return []Jump{
		{TableNAT, "PREROUTING", append(c("kproxy service portals"), "-j", ChainServices)},
		{TableNAT, "OUTPUT", append(c("kproxy service portals"), "-j", ChainServices)},
		{TableNAT, "POSTROUTING", append(c("kproxy postrouting"), "-j", ChainPostrouting)},
		{TableFilter, "INPUT", append(c("kproxy input"), "-j", ChainInput)},
		{TableFilter, "FORWARD", append(c("kproxy forward"), "-j", ChainForward)},
		{TableFilter, "OUTPUT", append(c("kproxy output"), "-j", ChainFirewall)},
	}
}
