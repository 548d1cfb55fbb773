package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
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

// Backend is the iptables mode of one IP family: the Driver over iptMode.
// Dual-stack nodes run two Backends.
//
// Ownership: a Backend owns the chains whose names start with KPROXY- in the
// nat and filter tables and its jump rules in the built-in chains (listed by
// iptables.Jumps); it touches nothing else, except when taking over from
// kube-proxy (see Options.KeepUpstream).
type Backend struct {
	*Driver
	m *iptMode
}

// iptMode renders the intent as iptables-restore input and runs one
// iptables-restore --noflush per sync (see the package doc).
type iptMode struct {
	opts    Options
	family  v1.IPFamily
	planner *iptables.Planner
	log     klog.Logger

	tookOver bool
	// quarantine holds the service ports the kernel rejected (left out,
	// retried with backoff); budgeted those over the rule budget.
	quarantine map[proxy.ServicePortName]*quarantined
	budgeted   map[proxy.ServicePortName]string
	// excluded is what the last successful sync left out: a change of it
	// makes the next sync full.
	excluded map[proxy.ServicePortName]bool
	// exclude is what the sync in progress leaves out.
	exclude map[proxy.ServicePortName]bool
	stats   iptables.Stats
	// primary: NodePorts' primary address while the Node is unknown (see
	// planNode).
	primary primaryKeeper
}

var (
	_ intent.Backend    = (*Backend)(nil)
	_ intent.DryRunner  = (*Backend)(nil)
	_ proxy.Quarantiner = (*Backend)(nil)
)

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
	m := &iptMode{opts: opts, family: opts.Rules.Family, planner: planner, log: log,
		quarantine: map[proxy.ServicePortName]*quarantined{}}
	return &Backend{Driver: newDriver(m, opts.Rules.Family, log, opts.Conntrack, opts.Host, opts.Metrics.Conntrack), m: m}, nil
}

// SyncResult describes the last sync, for logs and tests.
type SyncResult struct {
	Result
	Stats iptables.Stats
}

// Last returns what the last successful sync did.
func (b *Backend) Last() SyncResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	return SyncResult{Result: b.result, Stats: b.m.stats}
}

// Quarantined lists the service ports the last sync left out (see
// proxy.Quarantiner): rejected by the kernel, or over the rule budget.
func (b *Backend) Quarantined() []proxy.QuarantinedPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m.quarantined()
}

// apply plans and runs one restore. The ports to leave out (over the rule
// budget, quarantined) are decided first; a change of them makes the sync
// full. A full one first reads the tables, adds the missing jump rules to
// the same restore and, the first time, the take-over of kube-proxy's rules
// (so kproxy's rules replace kube-proxy's in one atomic step). A take-over
// that fails never blocks kproxy's own rules: the restore is retried
// without it and the take-over with a later full sync.
func (m *iptMode) apply(ctx context.Context, v *intent.View, full bool) (applied, error) {
	m.exclude = m.exclusions(ctx, v, time.Now())
	upgraded := !full && !sameSet(m.exclude, m.excluded)
	full = full || upgraded
	in := iptables.Input{View: v, Full: full, Exclude: m.exclude}
	var to *takeoverPlan
	var natSave []byte
	if full {
		tables := []string{iptables.TableNAT, iptables.TableFilter}
		takeOver := !m.tookOver && !m.opts.KeepUpstream
		if takeOver {
			tables = TakeoverTables
		}
		saves, err := m.save(ctx, tables...)
		if err != nil {
			return applied{}, err
		}
		in.Existing = map[string]map[string]uint64{}
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
	node := m.planNode(v.Node, natSave)
	in.Node = &node
	plan, restore := m.plan(in, to)
	if len(restore) > 0 {
		err := m.opts.Iptables.Restore(ctx, restore)
		if err != nil && to != nil && !to.empty() {
			m.log.Error(err, "Taking over from kube-proxy failed; syncing without it, will retry with the next full sync", "family", m.family, "chains", to.chains())
			plan, restore = m.plan(in, nil)
			to = nil
			err = m.opts.Iptables.Restore(ctx, restore)
		}
		if err != nil {
			// The plan is not committed: the next one starts from what
			// the last applied plan wrote (and is full).
			return applied{}, fmt.Errorf("%w: %s: writing %d chains (%d bytes): %w", errRestore, m.opts.Iptables.Describe(), plan.Stats.WrittenChains, len(restore), err)
		}
	}
	m.planner.Commit(plan)
	m.excluded = m.exclude
	m.stats = plan.Stats
	if to != nil {
		m.tookOver = true
		if !to.empty() {
			m.log.Info("Took over from kube-proxy: removed its iptables chains", "family", m.family, "chains", len(to.chains()))
		}
		if len(to.kept) > 0 {
			m.log.Info("Take-over: kept kube-proxy chains still used by other chains", "family", m.family, "chains", to.kept)
		}
		m.deleteNFTable(ctx)
	}
	st := plan.Stats
	return applied{full: upgraded, wrote: st.WrittenChains > 0 || st.DeletedChains > 0, routeLocalnet: plan.RouteLocalnet,
		log: []any{"mode", "iptables", "chains", st.Chains, "rules", st.Rules, "writtenChains", st.WrittenChains,
			"writtenRules", st.WrittenRules, "deletedChains", st.DeletedChains}}, nil
}

// check: a sync that wrote nothing carried no canary check in a restore.
func (m *iptMode) check(ctx context.Context) error {
	if !m.canaryOK(ctx) {
		return errCanary
	}
	return nil
}

// failed counts a failed restore.
func (m *iptMode) failed(err error, partial bool) {
	if errors.Is(err, errRestore) {
		m.opts.Metrics.RestoreFailed(partial)
	}
}

// isolate looks for the service ports whose rules the kernel rejects and
// quarantines them (see quarantineFailure): applying again, without them,
// may then succeed.
func (m *iptMode) isolate(ctx context.Context, v *intent.View, err error) bool {
	return errors.Is(err, errRestore) && m.quarantineFailure(ctx, v, m.exclude, time.Now()) > 0
}

// synced records the rules kproxy owns after a sync.
func (m *iptMode) synced(context.Context, bool) {
	st := m.stats
	m.opts.Metrics.Rules(iptables.TableNAT, st.Rules-st.FilterRules, st.WrittenRules-st.WrittenFilterRules)
	m.opts.Metrics.Rules(iptables.TableFilter, st.FilterRules, st.WrittenFilterRules)
}

// plan runs the planner with the take-over's lines and returns the plan and
// the full restore input (the plan's, plus a mangle section for the
// take-over).
func (m *iptMode) plan(in iptables.Input, to *takeoverPlan) (*iptables.Plan, []byte) {
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
	plan := m.planner.Plan(in)
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
func (m *iptMode) deleteNFTable(ctx context.Context) {
	family := "ip"
	if m.family == v1.IPv6Protocol {
		family = "ip6"
	}
	tables, err := m.opts.NFTables.ListTables(ctx)
	if err != nil {
		m.log.Error(err, "Take-over: listing nftables tables failed", "family", m.family)
		return
	}
	for _, t := range tables {
		if t != family+" kube-proxy" {
			continue
		}
		if err := m.opts.NFTables.DeleteTable(ctx, family, "kube-proxy"); err != nil && !IsNotExist(err) {
			m.log.Error(err, "Take-over: deleting kube-proxy's nftables table failed", "table", t)
		} else {
			m.log.Info("Took over from kube-proxy: deleted its nftables table", "table", t)
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
func (m *iptMode) canaryOK(ctx context.Context) bool {
	for _, t := range []string{iptables.TableNAT, iptables.TableFilter} {
		lines, err := m.opts.Iptables.List(ctx, t, iptables.ChainCanary)
		if err != nil || !slices.Contains(lines, "-A "+iptables.ChainCanary+" -j RETURN") {
			return false
		}
	}
	for _, j := range iptables.Jumps() {
		lines, err := m.opts.Iptables.List(ctx, j.Table, j.Chain)
		if err != nil || !slices.Contains(lines, "-A "+j.Chain+" "+j.Rule()) {
			return false
		}
	}
	return true
}

func (m *iptMode) save(ctx context.Context, tables ...string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, t := range tables {
		s, err := m.opts.Iptables.Save(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("%s: reading table %s: %w", m.opts.Iptables.Describe(), t, err)
		}
		out[t] = s
	}
	return out, nil
}

// dryRun writes the exact iptables-restore input a full sync of v would
// use, preceded by comments naming the family and the jump rules that are
// ensured separately. It changes nothing.
func (m *iptMode) dryRun(w io.Writer, v *intent.View) error {
	p, err := iptables.NewPlanner(m.opts.Rules)
	if err != nil {
		return err
	}
	plan := p.Plan(iptables.Input{View: v, Full: true})
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# kproxy %s rules: input of %s --noflush\n", m.family, CommandsFor(m.family, "<flavour>").Restore)
	fmt.Fprintf(&buf, "# %d service ports, %d chains, %d rules\n", plan.Stats.ServicePorts, plan.Stats.Chains, plan.Stats.Rules)
	for _, j := range plan.Jumps {
		fmt.Fprintf(&buf, "# ensured first in %s/%s: %s\n", j.Table, j.Chain, j.Rule())
	}
	for _, p := range v.Problems() {
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
func (m *iptMode) cleanup(ctx context.Context) error {
	var errs []error
	for _, j := range iptables.Jumps() {
		// Delete every copy (bounded, in case a broken seam never says "gone").
		for range 64 {
			err := m.opts.Iptables.Delete(ctx, j.Table, j.Chain, j.Spec...)
			if IsNotExist(err) {
				break
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing jump from %s %s: %w", j.Table, j.Chain, err))
				break
			}
		}
	}
	saves, err := m.save(ctx, iptables.TableNAT, iptables.TableFilter)
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
		if err := m.opts.Iptables.Restore(ctx, input.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: deleting kproxy chains: %w", err))
		}
	}
	return errors.Join(errs...)
}
