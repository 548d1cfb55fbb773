// Package linux is kproxy's iptables backend: one Backend per IP family
// programs the nat and filter tables so that Service traffic reaches the
// endpoints the shared cache selected (see docs/linux.md for the chain layout
// and the path of a packet for each Service type).
//
// # Using it
//
//	b, err := linux.New(linux.Options{Rules: cfg})  // cfg: rules.Config for one family
//	err = b.Sync(ctx, snap, changes)                // proxy.Backend
//	err = b.DryRun(os.Stdout, snap)                 // proxy.DryRunner: the exact restore input
//	err = b.Cleanup(ctx)                            // kproxy --cleanup
//
// rules.DefaultConfig(family) gives upstream kube-proxy's defaults; set
// ClusterCIDRs (--cluster-cidr), MasqueradeAll, NodePortAddresses and
// NodePortPrimary (rules.ParseNodePortAddresses parses the flag),
// LocalhostNodePorts, MasqueradeBit, and RandomFully (HasRandomFully probes
// it). With nil seams, New uses the real ones (NewSystem): the iptables
// tools of the flavour the host already uses (DetectFlavour, like
// iptables-wrapper: never both), conntrack and addresses over netlink, and
// sysctls under /proc/sys, all in the calling thread's network namespace.
// Tests pass the fakes of this package (FakeIptables enforces the kernel's
// rules on restore input).
//
// # What a sync does
//
// The pure planner (package rules) renders iptables-restore input; the
// Backend applies it with one iptables-restore --noflush per sync (nat and
// filter together), then does what restore cannot: a full sync inserts the
// jump rules from the built-in chains (go-iptables), sets route_localnet
// for localhost NodePorts, and the first one takes over from kube-proxy
// (removes its KUBE-* chains and jumps, and its "ip kube-proxy" or
// "ip6 kube-proxy" nftables table) unless Options.KeepUpstream. After the
// rules are in place, stale UDP conntrack flows are deleted over netlink.
//
// A partial sync rewrites only the chains of the service ports that changed
// and first checks the canary chains (KPROXY-CANARY in nat and filter hold
// one rule): when a flush or deletion removed them, the sync becomes full.
// A full sync (first sync, after any failure, periodically) reads the
// tables with iptables-save, rewrites every owned chain and deletes the
// stale ones, including those of earlier runs.
//
// # Ownership
//
// kproxy owns the chains whose names start with KPROXY- in nat and filter,
// and its jump rules (rules.Jumps). Cleanup removes exactly those, so
// iptables-save of nat and filter is back to what it was before kproxy ran.
package linux
