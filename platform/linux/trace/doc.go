// Package trace is the core the packet tracers of both Linux modes share
// (the iptables model's and the nftables model's): the packet traced and
// the host it meets (Packet, Host), the fates it may have (Verdict,
// Outcome, Step), the routing decision after the DNAT (Route), one branch
// of a trace and how its walk of a chain ended (State, Branch, End, the
// jump depth limit), and the kernel's hash of a connection's source into
// the slots of a source-hash table (ClusterSlot).
//
// Each model keeps what is its own: the rule language it reads, the order
// of its tables or base chains, the words of its path.
package trace
