package nftables

import (
	"fmt"
	"net/netip"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
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
	rules    []string
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
	ip := r.f.ip
	services := []string{ip + " daddr . meta l4proto . th dport vmap @" + MapFrontends}
	switch {
	case n.NodePortsAll && n.Localhost:
		services = append(services, "fib daddr type local meta l4proto . th dport vmap @"+MapNodePorts)
	case n.NodePortsAll:
		services = append(services, fmt.Sprintf("fib daddr type local %s daddr != %s meta l4proto . th dport vmap @%s", ip, r.f.loopback, MapNodePorts))
	default:
		services = append(services, fmt.Sprintf("%s daddr @%s meta l4proto . th dport vmap @%s", ip, SetNodePorts, MapNodePorts))
	}
	mark := fmt.Sprintf("0x%08x", uint32(1)<<r.cfg.MasqueradeBit)
	masq := "masquerade"
	if r.cfg.RandomFully {
		masq += " fully-random"
	}
	out := []baseChain{
		{name: ChainServices, rules: services},
		{name: ChainMarkMasq, rules: []string{"meta mark set meta mark | " + mark}},
		{name: ChainMasquerading, rules: []string{
			// Hairpin: a pod reaching itself through a Service is
			// masqueraded so that the answer comes back through the node.
			"ct status dnat " + ip + " saddr . " + ip + " daddr @" + SetHairpin + " " + masq,
			"meta mark & " + mark + " == 0 return",
			"meta mark set meta mark ^ " + mark + " " + masq,
		}},
		{name: ChainReject, rules: []string{
			// TCP gets a reset (refused at once on both families), the
			// rest an ICMP port unreachable.
			"meta l4proto tcp reject with tcp reset",
			"reject",
		}},
		{name: ChainNATPrerouting, typ: knftables.NATType, hook: knftables.PreroutingHook, priority: knftables.DNATPriority,
			rules: []string{"jump " + ChainServices}},
		{name: ChainNATOutput, typ: knftables.NATType, hook: knftables.OutputHook, priority: "-100",
			rules: []string{"jump " + ChainServices}},
		{name: ChainNATPostrouting, typ: knftables.NATType, hook: knftables.PostroutingHook, priority: knftables.SNATPriority,
			rules: []string{"jump " + ChainMasquerading}},
	}
	var forward, guard []string
	if !r.cfg.TCPBeLiberal {
		forward = append(forward, "ct state invalid drop")
	}
	if n.Localhost {
		// CVE-2020-8558: with route_localnet, packets to 127.0.0.0/8 from
		// elsewhere are dropped unless they are DNATed NodePort traffic or
		// its replies.
		guard = append(guard, "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status & dnat == 0 drop")
	}
	out = append(out,
		baseChain{name: ChainFilterForward, typ: knftables.FilterType, hook: knftables.ForwardHook, priority: knftables.FilterPriority,
			rules: append(slices.Clone(guard), forward...)},
		baseChain{name: ChainFilterInput, typ: knftables.FilterType, hook: knftables.InputHook, priority: knftables.FilterPriority,
			rules: guard},
	)
	return out
}

// canaries are elements no packet can match (destination port 0 of the
// unspecified address, NodePort 0) in the dispatch maps: every partial
// transaction deletes and adds them again, so it fails if someone flushed
// a map or deleted the table, and the next sync is full.
func (r *renderer) canaries() []elem {
	unspec := "0.0.0.0"
	if r.f.ip == "ip6" {
		unspec = "::"
	}
	return []elem{
		{set: MapFrontends, key: unspec + " . tcp . 0", val: "drop"},
		{set: MapNodePorts, key: "tcp . 0", val: "drop"},
	}
}

// fixedElems are the elements of the fixed sets: the canaries, and what
// depends on the node (the pod CIDRs and the NodePort addresses).
func (r *renderer) fixedElems(n Node) []elem {
	out := r.canaries()
	if n.PodSources && r.podMatch == r.f.ip+" saddr @"+SetPodCIDRs {
		for _, p := range n.PodCIDRs {
			out = append(out, elem{set: SetPodCIDRs, key: p.String()})
		}
	}
	if !n.NodePortsAll {
		for _, a := range n.NodePortIPs {
			out = append(out, elem{set: SetNodePorts, key: a.String()})
		}
	}
	return out
}
