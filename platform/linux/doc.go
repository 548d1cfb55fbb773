// Package linux holds kproxy's two Linux backends, the iptables mode and
// the nftables mode, and the one Driver (driver.go) that owns the sync
// protocol they share: full or partial syncs, the check of a partial sync,
// a failed partial sync retried full, isolation of a rejected port,
// route_localnet, conntrack cleanup, least-connection counts, dry run and
// cleanup. Each mode is a thin adapter (iptables_mode.go, nftables_mode.go)
// over a pure renderer: platform/linux/iptables renders iptables-restore
// input, platform/linux/nftables renders nftables transactions. Both take
// the intent View the app builds at each sync (pkg/intent); see
// docs/linux.md and docs/nftables.md for the rules and the path of a packet
// for each Service type.
//
// # Using it
//
//	b, err := linux.New(linux.Options{Rules: cfg})  // iptables mode; cfg: facts.Config for one family
//	n, err := linux.NewNFT(linux.NFTOptions{...})    // nftables mode
//	err = b.Sync(ctx, view)                          // intent.Backend
//	err = b.DryRun(os.Stdout, view)                  // intent.DryRunner: the exact restore input
//	err = b.Cleanup(ctx)                             // kproxy --cleanup
//
// facts.DefaultConfig(family) gives upstream kube-proxy's defaults; set
// ClusterCIDRs (--cluster-cidr), MasqueradeAll, NodePortAddresses and
// NodePortPrimary (facts.ParseNodePortAddresses parses the flag),
// LocalhostNodePorts, MasqueradeBit, and RandomFully (HasRandomFully probes
// it). With nil seams, New uses the real ones (NewSystem): the iptables
// tools of the flavour the host already uses (DetectFlavour, like
// iptables-wrapper: never both), conntrack and addresses over netlink, and
// sysctls under /proc/sys, all in the calling thread's network namespace.
// Tests pass the fakes of this package (FakeIptables enforces the kernel's
// rules on restore input).
//
// # What an iptables-mode sync does
//
// The pure planner (package iptables) renders iptables-restore input; the
// Backend applies it with one iptables-restore --noflush per sync (nat and
// filter together) and no other iptables command.
//
// A partial sync rewrites only the chains whose content changed among those
// of the service ports that changed. Its restore input also deletes and
// re-adds the rule of the canary chain (KPROXY-CANARY, in nat and filter):
// if someone flushed the table or deleted kproxy's chains, the restore
// fails as a whole and the Backend goes on with a full sync at once.
//
// A full sync (first sync, after any failure, periodically) reads the
// tables with iptables-save and writes only the owned chains whose rules
// differ from the kernel's (kproxy spells rules exactly as iptables-save
// prints them), deletes stale ones (including those of earlier runs), and,
// in the same restore, inserts the missing jump rules from the built-in
// chains and, the first time, takes over from kube-proxy: its KUBE-* chains
// and jumps go away in the same atomic step, then its "ip kube-proxy" or
// "ip6 kube-proxy" nftables table is deleted (unless Options.KeepUpstream).
// It also sets route_localnet for localhost NodePorts. After the rules are
// in place, stale UDP conntrack flows are deleted over netlink. go-iptables
// serves Cleanup (deleting jump rules) and the tools' version and
// --random-fully probe.
//
// # Ownership
//
// kproxy owns the chains whose names start with KPROXY- in nat and filter,
// and its jump rules (rules.Jumps). Cleanup removes exactly those, so
// iptables-save of nat and filter is back to what it was before kproxy ran.
package linux
