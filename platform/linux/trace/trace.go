package trace

import (
	"fmt"
	"net/netip"
	"slices"
)

// Packet is the first packet of a new connection, as a tracer sees it.
type Packet struct {
	Src, Dst netip.Addr
	// Proto is "tcp", "udp" or "sctp".
	Proto            string
	SrcPort, DstPort uint16
	// Local: the node itself sends it (it meets hook output); otherwise it
	// arrives on an interface (hook prerouting).
	Local bool
	// InIface is the interface it arrives on, for input interface matches
	// ("" when Local, or not known).
	InIface string
	// OutIface is the interface it leaves by, for output interface matches
	// (optional; the iptables model reads it, the nftables model derives
	// it from the route).
	OutIface string
}

// String renders the packet for messages.
func (p Packet) String() string {
	where := "arriving"
	if p.Local {
		where = "local"
	} else if p.InIface != "" {
		where = "arriving on " + p.InIface
	}
	return fmt.Sprintf("%s %s %s -> %s", where, p.Proto, netip.AddrPortFrom(p.Src, p.SrcPort), netip.AddrPortFrom(p.Dst, p.DstPort))
}

// Host holds the facts about the node that rules match on.
type Host struct {
	// LocalAddrs are the node's addresses (iptables' addrtype LOCAL,
	// nftables' fib type local); loopback addresses are always local.
	LocalAddrs []netip.Addr
	// AffinityHit names the affinity lists (iptables' recent lists,
	// nftables' sets) that already hold the packet's source (optional).
	AffinityHit map[string]bool
	// Counters holds the nftables numgen inc counters by the model's
	// counter key: non-nil, the trace evaluates each counter as the kernel
	// does and every outcome carries the counters after the packet; nil,
	// numgen inc branches like random. The iptables model ignores it.
	Counters map[string]uint32
}

// IsLocal reports whether a is one of the host's own addresses (or loopback).
func (h Host) IsLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(h.LocalAddrs, a)
}

// Verdict is the fate of a traced packet.
type Verdict string

// Verdicts.
const (
	// VerdictDNAT: the destination was rewritten and the packet goes on
	// (to Outcome.Delivered).
	VerdictDNAT Verdict = "DNAT"
	// VerdictReject: refused at once (a TCP reset, an ICMP unreachable).
	VerdictReject Verdict = "REJECT"
	// VerdictDrop: discarded silently.
	VerdictDrop Verdict = "DROP"
	// VerdictAccept: no rule handled it; it goes on unchanged (to
	// Outcome.Delivered).
	VerdictAccept Verdict = "ACCEPT"
	// VerdictUnknown: the packet met a rule the tracer does not simulate
	// (an nftables rule read back from a node that could not be read): the
	// tracer does not go past it, what happens next is not known.
	VerdictUnknown Verdict = "UNKNOWN"
)

// Where a packet goes after the routing decision (Outcome.Delivered).
const (
	// DeliveredLocal: to a local address (hook input).
	DeliveredLocal = "local"
	// DeliveredForward: routed through the node (hooks forward and
	// postrouting).
	DeliveredForward = "forward"
	// DeliveredOut: sent by the node to another host (hook postrouting).
	DeliveredOut = "out"
)

// Route is the routing decision, taken after the DNAT, for a packet like p
// whose destination is now dst: where it is delivered and the hooks it
// meets from there, in order ("forward", "postrouting", "input"). A packet
// the node sends meets postrouting, then input when dst is local.
func Route(h Host, p Packet, dst netip.Addr) (delivered string, hooks []string) {
	local := h.IsLocal(dst)
	switch {
	case p.Local && local:
		return DeliveredLocal, []string{"postrouting", "input"}
	case p.Local:
		return DeliveredOut, []string{"postrouting"}
	case local:
		return DeliveredLocal, []string{"input"}
	}
	return DeliveredForward, []string{"forward", "postrouting"}
}

// Outcome is one possible fate of a traced packet.
type Outcome struct {
	Verdict Verdict
	// Dst is the destination after DNAT (the original when not DNATed).
	Dst netip.AddrPort
	// DNAT tells whether the destination was rewritten, whatever the
	// verdict (a DNATed packet may still be dropped further on).
	DNAT bool
	// Masquerade: the source is masqueraded (or SNATed) in postrouting.
	Masquerade bool
	// Probability of this outcome (1 when no rule branches).
	Probability float64
	// Delivered is where the packet goes after the rules: DeliveredLocal,
	// DeliveredForward or DeliveredOut. The nftables model leaves it empty
	// for a packet dropped, rejected or not simulated; the iptables model
	// says where it was headed.
	Delivered string
	// Mark is the packet mark after the last rule.
	Mark uint32
	// Path is the trace a human reads, in the words of the model: the
	// iptables model lists each chain entered ("table/chain"); the
	// nftables model each chain entered, each rule taken ("services #1:
	// <rule> → <what it did>") and each branch chosen.
	Path []string
	// Steps lists, in order, every rule whose target was taken (a jump, a
	// verdict, a mark, a NAT); the iptables model fills it.
	Steps []Step
	// AffinitySets lists the affinity lists or sets the source is added to
	// (iptables' recent --set, nftables' update @set), in order.
	AffinitySets []string
	// Counters holds the numgen inc counters after this packet (only when
	// Host.Counters was given).
	Counters map[string]uint32
}

// String renders an outcome for messages.
func (o Outcome) String() string {
	s := fmt.Sprintf("%.4g %s %s", o.Probability, o.Verdict, o.Dst)
	if o.Masquerade {
		s += " masq"
	}
	if o.Delivered != "" {
		s += " (" + o.Delivered + ")"
	}
	return s
}

// Step is one rule a traced packet matched and whose target it took.
type Step struct {
	Table, Chain string
	// Rule is the rule's position in its chain, from 1.
	Rule int
	// Spec is the rule's text after "-A CHAIN ".
	Spec string
	// Target is the rule's target (a built-in target or a chain).
	Target string
}
