package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables"
)

// Options configures a Backend.
type Options struct {
	// Rules configures the rules (family, mark bits, masqueradeAll, cluster
	// CIDRs, NodePort addresses, localhost NodePorts, capabilities).
	Rules facts.Config
	// KeepUpstream disables the take-over of upstream kube-proxy's rules:
	// by default, after the first successful full sync, kube-proxy's
	// iptables chains and its nftables table of this family are removed.
	KeepUpstream bool
	// Iptables, NFTables, Conntrack and Host are the seams to the system.
	// New fills nil ones with the real implementations (Linux only; see
	// NewSystem). Tests pass fakes.
	Iptables  Iptables
	NFTables  NFTables
	Conntrack Conntrack
	Host      Host
	// Metrics receives what each sync did (nil: none).
	Metrics Metrics
	// Logger receives the backend's log lines (zero: klog's global one).
	Logger klog.Logger
	// RuleBudget caps the iptables rules one Service may need (estimated;
	// 0: DefaultRuleBudget, negative: no cap). A Service over it is left
	// out and reported.
	RuleBudget int
}

// Metrics receives the iptables-specific results of syncs.
type Metrics interface {
	// RestoreFailed counts a failed iptables-restore (partial: of a partial
	// sync, which is then retried as a full one).
	RestoreFailed(partial bool)
	// Rules records, after a successful sync, the rules kproxy owns in a
	// table ("nat", "filter") and how many the sync wrote there.
	Rules(table string, total, written int)
	// Conntrack records one round of stale-flow cleanup: the entries
	// deleted, how long it took, and whether it failed (failed rounds are
	// retried with the next sync and never fail one).
	Conntrack(deleted int, d time.Duration, failed bool)
}

type noMetrics struct{}

func (noMetrics) RestoreFailed(bool)                 {}
func (noMetrics) Rules(string, int, int)             {}
func (noMetrics) Conntrack(int, time.Duration, bool) {}

// SyncResult describes the last sync, for logs and metrics.
type SyncResult struct {
	Full     bool
	Duration time.Duration
	Stats    iptables.Stats
	// ConntrackDeleted counts the stale flows deleted.
	ConntrackDeleted int
}

// Backend programs one IP family's iptables rules. It implements
// proxy.Backend and proxy.DryRunner. Dual-stack nodes run two Backends
// behind the lead's fan-out.
//
// Ownership: a Backend owns the chains whose names start with KPROXY- in the
// nat and filter tables and its jump rules in the built-in chains (listed by
// iptables.Jumps); it touches nothing else, except when taking over from
// kube-proxy (see Options.KeepUpstream).
type Backend struct {
	opts    Options
	family  v1.IPFamily
	planner *iptables.Planner
	log     klog.Logger

	mu         sync.Mutex
	needFull   bool
	tookOver   bool
	localAddrs []netip.Addr
	// quarantine holds the service ports the kernel rejected (left out,
	// retried with backoff); budgeted those over the rule budget.
	quarantine map[proxy.ServicePortName]*quarantined
	budgeted   map[proxy.ServicePortName]string
	// excluded is what the last successful sync left out: a change of it
	// makes the next sync full.
	excluded map[proxy.ServicePortName]bool
	// pendingCT holds the conntrack cleanups still to do: those of plans
	// whose cleanup failed, one per frontend (see conntrackQueue).
	pendingCT conntrackQueue
	last      SyncResult
	// lastSnap is the snapshot of the last successful sync (what
	// RunLeastConnection syncs again); lc the least-connection counts.
	lastSnap *proxy.Snapshot
	lc       leastConn
	// primary: NodePorts' primary address while the Node is unknown (see
	// planNode).
	primary primaryKeeper
}

var (
	_ proxy.Backend             = (*Backend)(nil)
	_ proxy.DryRunner           = (*Backend)(nil)
	_ proxy.UnsupportedReporter = (*Backend)(nil)
)

// Unsupported lists what the committed plans left out (invalid input,
// what the rules cannot express as asked): see proxy.UnsupportedReporter.
func (b *Backend) Unsupported() []proxy.Unsupported {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.planner.Problems()
}

// New returns a Backend. The real seams (filled in for nil ones) need Linux
// and, for the iptables tools, probe the flavour the host uses.
func New(opts Options) (*Backend, error) {
	planner, err := iptables.NewPlanner(opts.Rules)
	if err != nil {
		return nil, fmt.Errorf("linux backend: %w", err)
	}
	if opts.Iptables == nil || opts.NFTables == nil || opts.Conntrack == nil || opts.Host == nil {
		sys, err := NewSystem(opts.Rules.Family, FlavourAuto)
		if err != nil {
			return nil, fmt.Errorf("linux backend: %w", err)
		}
		if opts.Iptables == nil {
			opts.Iptables = sys.Iptables
		}
		if opts.NFTables == nil {
			opts.NFTables = sys.NFTables
		}
		if opts.Conntrack == nil {
			opts.Conntrack = sys.Conntrack
		}
		if opts.Host == nil {
			opts.Host = sys.Host
		}
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	if opts.RuleBudget == 0 {
		opts.RuleBudget = DefaultRuleBudget
	}
	log := opts.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	return &Backend{opts: opts, family: opts.Rules.Family, planner: planner, needFull: true, log: log,
		quarantine: map[proxy.ServicePortName]*quarantined{}, lc: leastConn{family: opts.Rules.Family, ct: opts.Conntrack, log: log}}, nil
}

// Family returns the backend's IP family.
func (b *Backend) Family() v1.IPFamily { return b.family }

// Last returns what the last successful sync did.
func (b *Backend) Last() SyncResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// Sync makes the kernel match snap (see proxy.Backend).
//
// A partial sync writes only the chains that changed; its restore input
// also deletes and re-adds the canary rule, so if someone flushed the table
// or deleted kproxy's chains the restore fails as a whole and Sync goes on
// with a full sync at once. A partial sync with nothing to write (the
// runner's periodic sync) lists the canary chains instead. A full sync reads the tables (iptables-save),
// rewrites every owned chain whose rules differ from what kproxy wants,
// deletes stale ones, ensures the jump rules, and (once) takes over from
// upstream kube-proxy. Stale UDP conntrack flows are deleted last.
func (b *Backend) Sync(ctx context.Context, snap *proxy.Snapshot, ch proxy.Changes) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := time.Now()
	addrs, err := b.opts.Host.LocalAddresses()
	if err != nil {
		// Keep programming with the last known addresses: NodePorts on a
		// stale address list beat no sync at all.
		b.log.Error(err, "Listing local addresses failed, using the last known ones", "family", b.family)
	} else {
		b.localAddrs = addrs
	}
	view := snap.Family(b.family)
	if view == nil {
		view = proxy.NewFamilyView(b.family, nil)
	}
	ch = withPorts(ch, b.lc.refresh(view, ch, start))
	exclude := b.exclusions(ctx, view, start)
	full := ch.Full || b.needFull || !sameSet(exclude, b.excluded)
	plan, err := b.apply(ctx, snap, ch, full, exclude)
	if err == nil && !full && plan.Stats.WrittenChains == 0 && plan.Stats.DeletedChains == 0 && !b.canaryOK(ctx) {
		// Nothing to write, so no restore carried the canary check: look.
		err = errCanary
	}
	if err != nil && ctx.Err() != nil {
		// kproxy is stopping: the restore was interrupted, not refused. No
		// retry, no failure counted; the rules written so far stay.
		b.fail()
		return fmt.Errorf("sync interrupted (%w): %w", context.Cause(ctx), err)
	}
	if err != nil && !full {
		if errors.Is(err, errRestore) {
			b.opts.Metrics.RestoreFailed(true)
		}
		b.log.Info("Partial sync failed (kproxy's chains flushed or changed behind its back?): full sync", "family", b.family, "err", err)
		full = true
		plan, err = b.apply(ctx, snap, ch, true, exclude)
	}
	if err != nil && errors.Is(err, errRestore) {
		b.opts.Metrics.RestoreFailed(false)
		// Maybe some service ports' rules are what the kernel rejects:
		// find and quarantine them, program everything else.
		if ctx.Err() == nil && b.quarantineFailure(ctx, view, exclude, start) > 0 {
			exclude = b.exclusions(ctx, view, start)
			plan, err = b.apply(ctx, snap, ch, true, exclude)
			if err != nil && errors.Is(err, errRestore) {
				b.opts.Metrics.RestoreFailed(false)
			}
		}
	}
	if err != nil {
		b.fail()
		return err
	}
	st := plan.Stats
	b.opts.Metrics.Rules(iptables.TableNAT, st.Rules-st.FilterRules, st.WrittenRules-st.WrittenFilterRules)
	b.opts.Metrics.Rules(iptables.TableFilter, st.FilterRules, st.WrittenFilterRules)
	var errs []error
	if full && plan.RouteLocalnet {
		if err := b.opts.Host.SetSysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
			errs = append(errs, fmt.Errorf("enabling localhost NodePorts: %w", err))
		}
	}
	deleted := b.cleanConntrack(plan.Conntrack)
	if len(errs) > 0 {
		b.needFull = true
		return errors.Join(errs...)
	}
	b.needFull = false
	b.excluded = exclude
	b.lastSnap = snap
	b.last = SyncResult{Full: full, Duration: time.Since(start), Stats: plan.Stats, ConntrackDeleted: deleted}
	b.log.V(2).Info("Synced iptables rules", "family", b.family, "full", full, "servicePorts", plan.Stats.ServicePorts,
		"chains", plan.Stats.Chains, "rules", plan.Stats.Rules, "writtenChains", plan.Stats.WrittenChains,
		"writtenRules", plan.Stats.WrittenRules, "deletedChains", plan.Stats.DeletedChains,
		"conntrackDeleted", deleted, "duration", b.last.Duration)
	return nil
}

// apply plans and runs one restore. A full one first reads the tables, adds
// the missing jump rules to the same restore and, the first time, the
// take-over of kube-proxy's rules (so kproxy's rules replace kube-proxy's in
// one atomic step). A take-over that fails never blocks kproxy's own rules:
// the restore is retried without it and the take-over with a later full sync.
func (b *Backend) apply(ctx context.Context, snap *proxy.Snapshot, ch proxy.Changes, full bool, exclude map[proxy.ServicePortName]bool) (*iptables.Plan, error) {
	in := iptables.Input{View: snap.Family(b.family), LocalAddrs: b.localAddrs, Changes: ch, Exclude: exclude,
		Connections: b.lc.conns}
	in.Changes.Full = full
	var to *takeoverPlan
	var natSave []byte
	if full {
		tables := []string{iptables.TableNAT, iptables.TableFilter}
		takeOver := !b.tookOver && !b.opts.KeepUpstream
		if takeOver {
			tables = TakeoverTables
		}
		saves, err := b.save(ctx, tables...)
		if err != nil {
			return nil, err
		}
		in.Existing = map[string]map[string]uint64{}
		in.Extra = map[string][]string{}
		in.Referenced = map[string]map[string]bool{}
		for _, t := range []string{iptables.TableNAT, iptables.TableFilter} {
			in.Existing[t] = iptables.KernelChains(saves[t])
			in.Referenced[t] = foreignReferences(saves[t])
		}
		in.Extra = missingJumps(saves)
		if takeOver {
			to = planTakeovers(saves)
		}
		natSave = saves[iptables.TableNAT]
	}
	in.Node = b.planNode(snap.Node, natSave)
	plan, restore := b.plan(in, to)
	if len(restore) > 0 {
		err := b.opts.Iptables.Restore(ctx, restore)
		if err != nil && to != nil && !to.empty() {
			b.log.Error(err, "Taking over from kube-proxy failed; syncing without it, will retry with the next full sync", "family", b.family, "chains", to.chains())
			plan, restore = b.plan(in, nil)
			to = nil
			err = b.opts.Iptables.Restore(ctx, restore)
		}
		if err != nil {
			// The plan is not committed: the next one starts from what
			// the last applied plan wrote (and is full). Keep the
			// cleanups the failed plan computed.
			b.pendingCT.add(plan.Conntrack)
			return nil, fmt.Errorf("%w: %s: writing %d chains (%d bytes): %w", errRestore, b.opts.Iptables.Describe(), plan.Stats.WrittenChains, len(restore), err)
		}
	}
	b.planner.Commit(plan)
	if to != nil {
		b.tookOver = true
		if !to.empty() {
			b.log.Info("Took over from kube-proxy: removed its iptables chains", "family", b.family, "chains", len(to.chains()))
		}
		if len(to.kept) > 0 {
			b.log.Info("Take-over: kept kube-proxy chains still used by other chains", "family", b.family, "chains", to.kept)
		}
		b.deleteNFTable(ctx)
	}
	return plan, nil
}

// plan runs the planner with the take-over's lines and returns the plan and
// the full restore input (the plan's, plus a mangle section for the
// take-over).
func (b *Backend) plan(in iptables.Input, to *takeoverPlan) (*iptables.Plan, []byte) {
	if to != nil {
		extra := map[string][]string{}
		for t, l := range in.Extra {
			extra[t] = append(extra[t], l...)
		}
		for t, l := range to.lines {
			if t == iptables.TableNAT || t == iptables.TableFilter {
				extra[t] = append(extra[t], l...)
			}
		}
		in.Extra = extra
	}
	plan := b.planner.Plan(in)
	restore := plan.Restore
	if to != nil && len(to.lines["mangle"]) > 0 {
		restore = append(slices.Clip(restore), []byte("*mangle\n"+strings.Join(to.lines["mangle"], "\n")+"\nCOMMIT\n")...)
	}
	return plan, restore
}

// missingJumps returns, per table, the restore lines that insert the jump
// rules iptables-save does not show.
func missingJumps(saves map[string][]byte) map[string][]string {
	extra := map[string][]string{}
	jumps := iptables.Jumps()
	for i := len(jumps) - 1; i >= 0; i-- {
		j := jumps[i]
		spec := j.Rule()
		if !bytes.Contains(saves[j.Table], []byte("\n-A "+j.Chain+" "+spec+"\n")) {
			extra[j.Table] = append(extra[j.Table], "-I "+j.Chain+" 1 "+spec)
		}
	}
	return extra
}

// deleteNFTable deletes kube-proxy's nftables table of this family, if any.
// Failures are logged: the table does not disturb kproxy's rules (it only
// holds stale DNAT kube-proxy no longer maintains).
func (b *Backend) deleteNFTable(ctx context.Context) {
	family := "ip"
	if b.family == v1.IPv6Protocol {
		family = "ip6"
	}
	tables, err := b.opts.NFTables.ListTables(ctx)
	if err != nil {
		b.log.Error(err, "Take-over: listing nftables tables failed", "family", b.family)
		return
	}
	for _, t := range tables {
		if t != family+" kube-proxy" {
			continue
		}
		if err := b.opts.NFTables.DeleteTable(ctx, family, "kube-proxy"); err != nil && !IsNotExist(err) {
			b.log.Error(err, "Take-over: deleting kube-proxy's nftables table failed", "table", t)
		} else {
			b.log.Info("Took over from kube-proxy: deleted its nftables table", "table", t)
		}
	}
}

// errCanary says the canary rule or a jump rule is gone: someone flushed a
// table or a built-in chain, or deleted kproxy's chains.
var errCanary = errors.New("the canary rule or a jump rule is gone")

// errRestore marks a failed iptables-restore run.
var errRestore = errors.New("iptables-restore failed")

// canaryOK reports whether both canary chains still hold their rule and
// every built-in chain its jump into kproxy's chains. A sync that writes
// nothing checks them this way (one iptables -S per chain); a sync that
// writes checks them inside its restore.
func (b *Backend) canaryOK(ctx context.Context) bool {
	for _, t := range []string{iptables.TableNAT, iptables.TableFilter} {
		lines, err := b.opts.Iptables.List(ctx, t, iptables.ChainCanary)
		if err != nil || !slices.Contains(lines, "-A "+iptables.ChainCanary+" -j RETURN") {
			return false
		}
	}
	for _, j := range iptables.Jumps() {
		lines, err := b.opts.Iptables.List(ctx, j.Table, j.Chain)
		if err != nil || !slices.Contains(lines, "-A "+j.Chain+" "+j.Rule()) {
			return false
		}
	}
	return true
}

// fail records a failed sync: the next one is full.
func (b *Backend) fail() {
	b.needFull = true
}

func (b *Backend) save(ctx context.Context, tables ...string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, t := range tables {
		s, err := b.opts.Iptables.Save(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("%s: reading table %s: %w", b.opts.Iptables.Describe(), t, err)
		}
		out[t] = s
	}
	return out, nil
}

// cleanConntrack deletes stale flows once the rules are in place and
// returns how many it deleted. A failure (netlink's dump interrupted by a
// busy table, say) never fails the sync: it is logged and counted, and the
// filters wait, merged per frontend, for the next sync.
func (b *Backend) cleanConntrack(filters []conntrack.Filter) int {
	b.pendingCT.add(filters)
	if b.pendingCT.empty() {
		return 0
	}
	start := time.Now()
	m := conntrack.NewMatcher(b.pendingCT.filters())
	n, err := b.opts.Conntrack.DeleteFlows(b.family, m.Match)
	b.opts.Metrics.Conntrack(n, time.Since(start), err != nil)
	if err != nil {
		b.log.Error(err, "Deleting stale conntrack flows failed; retrying with the next sync", "family", b.family,
			"frontends", b.pendingCT.len(), "deleted", n)
		return n
	}
	b.pendingCT.clear()
	return n
}

// DryRun writes the exact iptables-restore input a full sync of snap would
// use (see proxy.DryRunner), preceded by comments naming the family and the
// jump rules that are ensured separately. It reads the node's addresses but
// changes nothing.
func (b *Backend) DryRun(w io.Writer, snap *proxy.Snapshot) error {
	p, err := iptables.NewPlanner(b.opts.Rules)
	if err != nil {
		return err
	}
	addrs, err := b.opts.Host.LocalAddresses()
	if err != nil {
		return fmt.Errorf("dry run: listing local addresses: %w", err)
	}
	plan := p.Plan(iptables.Input{View: snap.Family(b.family), Node: snap.Node, LocalAddrs: addrs, Changes: proxy.Changes{Full: true}})
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# kproxy %s rules: input of %s --noflush\n", b.family, CommandsFor(b.family, "<flavour>").Restore)
	fmt.Fprintf(&buf, "# %d service ports, %d chains, %d rules\n", plan.Stats.ServicePorts, plan.Stats.Chains, plan.Stats.Rules)
	for _, j := range plan.Jumps {
		fmt.Fprintf(&buf, "# ensured first in %s/%s: %s\n", j.Table, j.Chain, j.Rule())
	}
	for _, p := range plan.Problems {
		fmt.Fprintf(&buf, "# skipped: %s\n", p.Message)
	}
	buf.Write(plan.Restore)
	_, err = w.Write(buf.Bytes())
	return err
}

// Cleanup removes everything kproxy owns in this family: its jump rules and
// every KPROXY- chain of the nat and filter tables (including chains of
// earlier runs). Afterwards iptables-save of nat and filter shows what was
// there before kproxy ran (route_localnet, a sysctl, is left as it is).
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, j := range iptables.Jumps() {
		// Delete every copy (bounded, in case a broken seam never says "gone").
		for range 64 {
			err := b.opts.Iptables.Delete(ctx, j.Table, j.Chain, j.Spec...)
			if IsNotExist(err) {
				break
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing jump from %s %s: %w", j.Table, j.Chain, err))
				break
			}
		}
	}
	saves, err := b.save(ctx, iptables.TableNAT, iptables.TableFilter)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: %w", err))...)
	}
	var input bytes.Buffer
	for _, t := range []string{iptables.TableNAT, iptables.TableFilter} {
		var owned []string
		for _, c := range ChainNames(saves[t]) {
			if iptables.Owned(c) {
				owned = append(owned, c)
			}
		}
		if len(owned) == 0 {
			continue
		}
		input.WriteString("*" + t + "\n")
		for _, c := range owned {
			input.WriteString(":" + c + " - [0:0]\n")
		}
		for _, c := range owned {
			input.WriteString("-X " + c + "\n")
		}
		input.WriteString("COMMIT\n")
	}
	if input.Len() > 0 {
		if err := b.opts.Iptables.Restore(ctx, input.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: deleting kproxy chains: %w", err))
		}
	}
	b.needFull = true
	return errors.Join(errs...)
}
