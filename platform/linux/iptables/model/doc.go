// Package ruleset is an in-memory model of the iptables tables kproxy
// programs, with the semantics of the real tools, and a virtual-packet tracer.
//
// It is pure Go with no kernel access, so it runs on every OS. It serves two
// purposes:
//
//   - a fake for the applier: Ruleset.Restore applies iptables-restore input
//     (with --noflush semantics) atomically and rejects what the kernel
//     rejects: rules in or jumps to chains that do not exist, deleting a chain
//     that is still referenced or not empty, deleting a built-in chain, and
//     options the model does not understand. Insert, Exists, Delete and List
//     mirror the single-rule commands (iptables -I/-C/-D/-S). Save renders
//     iptables-save text, deterministically (built-in chains first, then user
//     chains in name order);
//   - a tracer: Ruleset.Trace follows one packet through the nat and filter
//     tables the way netfilter would for the first packet of a connection,
//     exploring every branch of "-m statistic --mode random" rules with its
//     probability, and reports each possible outcome (a trace.Outcome):
//     DNATed, accepted, rejected or dropped; the destination after DNAT;
//     whether it is masqueraded.
//
// The model understands the subset of iptables that kproxy and upstream
// kube-proxy use: -s, -d (with prefix or arbitrary dotted/colon masks), -p,
// -i, -o, and the matches comment, tcp, udp, sctp (--dport, --sport),
// addrtype (--src-type/--dst-type LOCAL), mark, conntrack (--ctstate),
// statistic (random, and nth with a per-rule counter shared by successive
// traces, reset when a restore rewrites the rule), cluster (the kernel's jhash
// of the source address; see ClusterSlot), recent and multiport (--dports);
// the targets ACCEPT,
// DROP, RETURN, REJECT, DNAT, SNAT, MARK, MASQUERADE and jumps (-j) or gotos
// (-g) to user chains.
package model
