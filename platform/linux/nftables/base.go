package nftables

import (
	"net/netip"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// Node holds the node-wide facts the fixed objects depend on.
type Node struct {
	// PodSources: pods can be told from other clients (see
	// intent.Config.PodSources); PodCIDRs are the prefixes that tell them
	// for the ClusterCIDR and NodeCIDR modes.
	PodSources bool
	PodCIDRs   []netip.Prefix
	// NodePortsAll: NodePorts answer on every local address (loopback only
	// with Localhost); otherwise on NodePortIPs.
	NodePortsAll bool
	NodePortIPs  []netip.Addr
	// Localhost: NodePorts answer on 127.0.0.1 too (IPv4, needs
	// route_localnet, installs the martian guard).
	Localhost bool
}

func (n Node) equal(o Node) bool {
	return n.PodSources == o.PodSources && slices.Equal(n.PodCIDRs, o.PodCIDRs) && n.NodePortsAll == o.NodePortsAll &&
		slices.Equal(n.NodePortIPs, o.NodePortIPs) && n.Localhost == o.Localhost
}

// setObj describes one of the fixed sets and maps.
type setObj struct {
	name   string
	isMap  bool
	typ    string // Type, or
	typeof string // TypeOf
	flags  []knftables.SetFlag
}

func (r *renderer) fixedSets() []setObj {
	ip := r.f.ip
	out := []setObj{
		{name: MapFrontends, isMap: true, typ: r.f.addr + " . inet_proto . inet_service : verdict"},
		{name: MapNodePorts, isMap: true, typ: "inet_proto . inet_service : verdict"},
	}
	for _, set := range []intent.Set{intent.Cluster, intent.Local} {
		for _, np := range []bool{false, true} {
			for _, proto := range []string{"tcp", "udp", "sctp"} {
				key := ip + " daddr . " + proto + " dport"
				if np {
					key = proto + " dport"
				}
				out = append(out, setObj{name: slotMap(set, np, proto), isMap: true,
					typeof: key + " . numgen random mod 1 : " + ip + " daddr . " + proto + " dport"})
			}
		}
	}
	return append(out,
		setObj{name: SetHairpin, typ: r.f.addr + " . " + r.f.addr},
		setObj{name: SetPodCIDRs, typ: r.f.addr, flags: []knftables.SetFlag{knftables.IntervalFlag}},
		setObj{name: SetNodePorts, typ: r.f.addr},
		setObj{name: SetNodePortRejects, typ: "inet_proto . inet_service"},
	)
}

func (s setObj) object() knftables.Object {
	if s.isMap {
		m := &knftables.Map{Name: s.name, Flags: s.flags}
		if s.typeof != "" {
			m.TypeOf = s.typeof
		} else {
			m.Type = s.typ
		}
		return m
	}
	return &knftables.Set{Name: s.name, Type: s.typ, Flags: s.flags}
}

func (s setObj) flush() knftables.Object {
	if s.isMap {
		return &knftables.Map{Name: s.name}
	}
	return &knftables.Set{Name: s.name}
}

// baseChain is a fixed chain: its hook (nil for a regular chain) and rules.
type baseChain struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
	rules    []nft.Rule
}

func (c baseChain) object() *knftables.Chain {
	ch := &knftables.Chain{Name: c.name}
	if c.hook != "" {
		ch.Type = knftables.PtrTo(c.typ)
		ch.Hook = knftables.PtrTo(c.hook)
		ch.Priority = knftables.PtrTo(c.priority)
	}
	return ch
}

// fixedChains renders the fixed chains for the node's facts.
func (r *renderer) fixedChains(n Node) []baseChain {
	// nodePort matches a packet to a NodePort address.
	nodePort := func() []nft.Stmt {
		switch {
		case n.NodePortsAll && n.Localhost:
			return []nft.Stmt{fibType("daddr", "local")}
		case n.NodePortsAll:
			return []nft.Stmt{fibType("daddr", "local"), ne(r.f.field("daddr"), r.f.loopback)}
		}
		return []nft.Stmt{inSet(SetNodePorts, r.f.field("daddr"))}
	}
	services := []nft.Rule{
		{&nft.VMap{Key: []nft.Expr{r.f.field("daddr"), l4proto(), dport("th")}, Map: MapFrontends}},
		append(nodePort(), &nft.VMap{Key: []nft.Expr{l4proto(), dport("th")}, Map: MapNodePorts}),
	}
	mark := nft.Hex32(uint32(1) << r.cfg.MasqueradeBit)
	masq := func() *nft.Masquerade {
		if r.cfg.RandomFully {
			return &nft.Masquerade{Flags: []string{"fully-random"}}
		}
		return &nft.Masquerade{}
	}
	dnat, _ := nft.CTStatus("dnat")
	markClear := eq(&nft.Meta{Key: "mark"}, nft.Num(0))
	markClear.Mask, markClear.Op = &mark, nft.OpEq
	out := []baseChain{
		{name: ChainServices, rules: services},
		{name: ChainMarkMasq, rules: []nft.Rule{{&nft.MarkSet{Op: "|", Val: mark}}}},
		{name: ChainMasquerading, rules: []nft.Rule{
			// Hairpin: a pod reaching itself through a Service is
			// masqueraded so that the answer comes back through the node.
			{eq(&nft.CT{Key: "status"}, dnat), inSet(SetHairpin, r.f.field("saddr"), r.f.field("daddr")), masq()},
			{markClear, &nft.Verdict{Kind: "return"}},
			{&nft.MarkSet{Op: "^", Val: mark}, masq()},
		}},
		{name: ChainReject, rules: []nft.Rule{
			// A process of the node sending to one of the node's own
			// addresses (its NodePorts) is refused on input, where the
			// packet arrives through loopback: rejected here, in the
			// output hook, a UDP sender would get EPERM from sendto where
			// upstream's clients get "connection refused" (issue 27).
			// Only the output hook knows the output interface.
			{eq(&nft.Meta{Key: "oifname"}, nft.Quoted("lo")), &nft.Verdict{Kind: "return"}},
			// TCP gets a reset (refused at once on both families), the
			// rest an ICMP port unreachable.
			{eq(l4proto(), nftProto("tcp")), &nft.Reject{With: "tcp reset"}},
			{&nft.Reject{}},
		}},
		{name: ChainNATPrerouting, typ: knftables.NATType, hook: knftables.PreroutingHook, priority: knftables.DNATPriority,
			rules: []nft.Rule{{nft.Jump(ChainServices)}}},
		{name: ChainNATOutput, typ: knftables.NATType, hook: knftables.OutputHook, priority: "-100",
			rules: []nft.Rule{{nft.Jump(ChainServices)}}},
		{name: ChainNATPostrouting, typ: knftables.NATType, hook: knftables.PostroutingHook, priority: knftables.SNATPriority,
			rules: []nft.Rule{{nft.Jump(ChainMasquerading)}}},
	}
	var forward, guard []nft.Rule
	if !r.cfg.TCPBeLiberal {
		forward = append(forward, nft.Rule{eq(&nft.CT{Key: "state"}, nft.Name("invalid")), &nft.Verdict{Kind: "drop"}})
	}
	if n.Localhost {
		// CVE-2020-8558: with route_localnet, packets to 127.0.0.0/8 from
		// elsewhere are dropped unless they are DNATed NodePort traffic or
		// its replies.
		loopback := nft.Prefix(netip.MustParsePrefix("127.0.0.0/8"))
		notDNAT := eq(&nft.CT{Key: "status"}, nft.Num(0))
		notDNAT.Mask, notDNAT.Op = &dnat, nft.OpEq
		guard = append(guard, nft.Rule{
			eq(&nft.Payload{Base: "ip", Field: "daddr"}, loopback),
			ne(&nft.Payload{Base: "ip", Field: "saddr"}, loopback),
			&nft.Match{Left: []nft.Expr{&nft.CT{Key: "state"}}, Op: nft.OpNe, Right: []nft.Key{{nft.Name("established")}, {nft.Name("related")}}, Anon: true},
			notDNAT,
			&nft.Verdict{Kind: "drop"},
		})
	}
	input := append(slices.Clone(guard), slices.Concat(
		[]nft.Stmt{eq(&nft.CT{Key: "state"}, nft.Name("new"))},
		nodePort(),
		[]nft.Stmt{inSet(SetNodePortRejects, l4proto(), dport("th")), nft.Goto(ChainReject)},
	))
	out = append(out,
		baseChain{name: ChainFilterForward, typ: knftables.FilterType, hook: knftables.ForwardHook, priority: knftables.FilterPriority,
			rules: append(slices.Clone(guard), forward...)},
		baseChain{name: ChainFilterInput, typ: knftables.FilterType, hook: knftables.InputHook, priority: knftables.FilterPriority,
			rules: input},
	)
	return out
}

// canaries are elements no packet can match (destination port 0 of the
// unspecified address, NodePort 0) in the dispatch maps: every partial
// transaction deletes and adds them again, so it fails if someone flushed
// a map or deleted the table, and the next sync is full.
func (r *renderer) canaries() []Elem {
	unspec := netip.IPv4Unspecified()
	if r.f.ip == "ip6" {
		unspec = netip.IPv6Unspecified()
	}
	drop := &nft.Verdict{Kind: "drop"}
	tcp := uint8(nft.Protocols["tcp"])
	return []Elem{dispatchElem(unspec, tcp, 0, drop), dispatchElem(netip.Addr{}, tcp, 0, drop)}
}

// fixedElems are the elements of the fixed sets: the canaries, and what
// depends on the node (the pod CIDRs and the NodePort addresses).
func (r *renderer) fixedElems(n Node) []Elem {
	out := r.canaries()
	if n.PodSources && r.podMatch != nil && r.podMatch.Set == SetPodCIDRs {
		for _, p := range n.PodCIDRs {
			out = append(out, podCIDRElem(p))
		}
	}
	if !n.NodePortsAll {
		for _, a := range n.NodePortIPs {
			out = append(out, nodePortIPElem(a))
		}
	}
	return out
}
