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
	"github.com/kproxy/kproxy/platform/linux/rules"
)

// Options configures a Backend.
type Options struct {
	// Rules configures the rules (family, mark bits, masqueradeAll, cluster
	// CIDRs, NodePort addresses, localhost NodePorts, capabilities).
	Rules rules.Config
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
}

// SyncResult describes the last sync, for logs and metrics.
type SyncResult struct {
	Full     bool
	Duration time.Duration
	Stats    rules.Stats
	// ConntrackDeleted counts the stale flows deleted.
	ConntrackDeleted int
}

// Backend programs one IP family's iptables rules. It implements
// proxy.Backend and proxy.DryRunner. Dual-stack nodes run two Backends
// behind the lead's fan-out.
//
// Ownership: a Backend owns the chains whose names start with KPROXY- in the
// nat and filter tables and its jump rules in the built-in chains (listed by
// rules.Jumps); it touches nothing else, except when taking over from
// kube-proxy (see Options.KeepUpstream).
type Backend struct {
	opts    Options
	family  v1.IPFamily
	planner *rules.Planner

	mu         sync.Mutex
	needFull   bool
	tookOver   bool
	localAddrs []netip.Addr
	// pendingCT holds conntrack filters of plans whose cleanup failed.
	pendingCT []rules.ConntrackFilter
	last      SyncResult
}

var (
	_ proxy.Backend   = (*Backend)(nil)
	_ proxy.DryRunner = (*Backend)(nil)
)

// New returns a Backend. The real seams (filled in for nil ones) need Linux
// and, for the iptables tools, probe the flavour the host uses.
func New(opts Options) (*Backend, error) {
	planner, err := rules.NewPlanner(opts.Rules)
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
	return &Backend{opts: opts, family: opts.Rules.Family, planner: planner, needFull: true}, nil
}

// Family returns the backend's IP family.
func (b *Backend) Family() v1.IPFamily { return b.family }

// Last returns what the last successful sync did.
func (b *Backend) Last() SyncResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// Sync makes the kernel match snap (see proxy.Backend). A partial sync
// rewrites only the chains that changed; it first checks the canary chains
// and turns into a full sync when they were flushed or deleted. A full sync
// rewrites every owned chain, deletes stale ones, ensures the jump rules,
// and (once) takes over from upstream kube-proxy.
func (b *Backend) Sync(ctx context.Context, snap *proxy.Snapshot, ch proxy.Changes) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := time.Now()
	full := ch.Full || b.needFull
	if !full && !b.canaryOK(ctx) {
		klog.InfoS("kproxy chains were flushed or deleted: full sync", "family", b.family)
		full = true
	}
	addrs, err := b.opts.Host.LocalAddresses()
	if err != nil {
		// Keep programming with the last known addresses: NodePorts on a
		// stale address list beat no sync at all.
		klog.ErrorS(err, "Listing local addresses failed, using the last known ones", "family", b.family)
	} else {
		b.localAddrs = addrs
	}
	in := rules.Input{View: snap.Family(b.family), Node: snap.Node, LocalAddrs: b.localAddrs, Changes: ch}
	in.Changes.Full = full
	var saves map[string][]byte
	if full {
		if saves, err = b.save(ctx, rules.TableNAT, rules.TableFilter); err != nil {
			b.fail()
			return err
		}
		in.Existing = map[string][]string{}
		for t, s := range saves {
			in.Existing[t] = ChainNames(s)
		}
	}
	plan := b.planner.Plan(in)
	for _, p := range plan.Problems {
		klog.InfoS("Skipping invalid input", "family", b.family, "problem", p)
	}
	if len(plan.Restore) > 0 {
		if err := b.opts.Iptables.Restore(ctx, plan.Restore); err != nil {
			b.fail()
			return fmt.Errorf("%s: writing %d chains (%d bytes): %w", b.opts.Iptables.Describe(), plan.Stats.WrittenChains, len(plan.Restore), err)
		}
	}
	var errs []error
	if full {
		if err := b.ensureJumps(ctx, plan.Jumps); err != nil {
			errs = append(errs, err)
		}
		if plan.RouteLocalnet {
			if err := b.opts.Host.SetSysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
				errs = append(errs, fmt.Errorf("enabling localhost NodePorts: %w", err))
			}
		}
		if !b.tookOver && !b.opts.KeepUpstream && len(errs) == 0 {
			if err := b.takeOver(ctx); err != nil {
				errs = append(errs, err)
			} else {
				b.tookOver = true
			}
		}
	}
	deleted, err := b.cleanConntrack(plan.Conntrack)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		b.needFull = true
		return errors.Join(errs...)
	}
	b.needFull = false
	b.last = SyncResult{Full: full, Duration: time.Since(start), Stats: plan.Stats, ConntrackDeleted: deleted}
	klog.V(2).InfoS("Synced iptables rules", "family", b.family, "full", full, "servicePorts", plan.Stats.ServicePorts,
		"chains", plan.Stats.Chains, "rules", plan.Stats.Rules, "writtenChains", plan.Stats.WrittenChains,
		"writtenRules", plan.Stats.WrittenRules, "deletedChains", plan.Stats.DeletedChains,
		"conntrackDeleted", deleted, "duration", b.last.Duration)
	return nil
}

// fail records a failed sync: the next one is full.
func (b *Backend) fail() {
	b.planner.Invalidate()
	b.needFull = true
}

// canaryOK reports whether the canary chains still hold their rule: a
// flush of a table or a deletion of kproxy's chains removes it.
func (b *Backend) canaryOK(ctx context.Context) bool {
	for _, t := range []string{rules.TableNAT, rules.TableFilter} {
		lines, err := b.opts.Iptables.List(ctx, t, rules.ChainCanary)
		if err != nil || !slices.Contains(lines, "-A "+rules.ChainCanary+" -j RETURN") {
			return false
		}
	}
	return true
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

// ensureJumps puts each jump rule at the top of its built-in chain unless it
// is already there somewhere. Jumps are inserted last-first so that they end
// up in the listed order.
func (b *Backend) ensureJumps(ctx context.Context, jumps []rules.Jump) error {
	var errs []error
	for i := len(jumps) - 1; i >= 0; i-- {
		j := jumps[i]
		ok, err := b.opts.Iptables.Exists(ctx, j.Table, j.Chain, j.Spec...)
		if err == nil && !ok {
			err = b.opts.Iptables.Insert(ctx, j.Table, j.Chain, 1, j.Spec...)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("jump from %s %s: %w", j.Table, j.Chain, err))
		}
	}
	return errors.Join(errs...)
}

// takeOver removes upstream kube-proxy's iptables chains and jump rules
// (now that kproxy's own rules are in place and first in every built-in
// chain) and its nftables table of this family.
func (b *Backend) takeOver(ctx context.Context) error {
	saves, err := b.save(ctx, TakeoverTables...)
	if err != nil {
		return fmt.Errorf("take-over: %w", err)
	}
	var input []byte
	var removed, kept []string
	for _, t := range TakeoverTables {
		to := planTakeover(t, saves[t])
		input = append(input, to.restore()...)
		for _, c := range to.remove {
			removed = append(removed, t+"/"+c)
		}
		for _, c := range to.kept {
			kept = append(kept, t+"/"+c)
		}
	}
	var errs []error
	if len(input) > 0 {
		if err := b.opts.Iptables.Restore(ctx, input); err != nil {
			errs = append(errs, fmt.Errorf("take-over: removing kube-proxy's iptables rules: %w", err))
		} else {
			klog.InfoS("Took over from kube-proxy: removed its iptables chains", "family", b.family, "chains", len(removed))
		}
	}
	if len(kept) > 0 {
		klog.InfoS("Take-over: kept kube-proxy chains still used by other chains", "family", b.family, "chains", kept)
	}
	family := "ip"
	if b.family == v1.IPv6Protocol {
		family = "ip6"
	}
	tables, err := b.opts.NFTables.ListTables(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("take-over: listing nftables tables: %w", err))
	}
	for _, t := range tables {
		if t == family+" kube-proxy" {
			if err := b.opts.NFTables.DeleteTable(ctx, family, "kube-proxy"); err != nil && !IsNotExist(err) {
				errs = append(errs, fmt.Errorf("take-over: deleting nftables table %s: %w", t, err))
			} else {
				klog.InfoS("Took over from kube-proxy: deleted its nftables table", "table", t)
			}
		}
	}
	return errors.Join(errs...)
}

// cleanConntrack deletes stale flows once the rules are in place. Filters
// of a failed cleanup are retried with the next sync.
func (b *Backend) cleanConntrack(filters []rules.ConntrackFilter) (int, error) {
	filters = append(b.pendingCT, filters...)
	b.pendingCT = nil
	if len(filters) == 0 {
		return 0, nil
	}
	m := rules.NewConntrackMatcher(filters)
	n, err := b.opts.Conntrack.DeleteFlows(b.family, m.Match)
	if err != nil {
		b.pendingCT = filters
		return n, fmt.Errorf("deleting stale %s conntrack flows: %w", b.family, err)
	}
	return n, nil
}

// DryRun writes the exact iptables-restore input a full sync of snap would
// use (see proxy.DryRunner), preceded by comments naming the family and the
// jump rules that are ensured separately. It reads the node's addresses but
// changes nothing.
func (b *Backend) DryRun(w io.Writer, snap *proxy.Snapshot) error {
	p, err := rules.NewPlanner(b.opts.Rules)
	if err != nil {
		return err
	}
	addrs, err := b.opts.Host.LocalAddresses()
	if err != nil {
		return fmt.Errorf("dry run: listing local addresses: %w", err)
	}
	plan := p.Plan(rules.Input{View: snap.Family(b.family), Node: snap.Node, LocalAddrs: addrs, Changes: proxy.Changes{Full: true}})
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# kproxy %s rules: input of %s --noflush\n", b.family, CommandsFor(b.family, "<flavour>").Restore)
	fmt.Fprintf(&buf, "# %d service ports, %d chains, %d rules\n", plan.Stats.ServicePorts, plan.Stats.Chains, plan.Stats.Rules)
	for _, j := range plan.Jumps {
		fmt.Fprintf(&buf, "# ensured first in %s/%s: %s\n", j.Table, j.Chain, strings.Join(quote(j.Spec), " "))
	}
	for _, p := range plan.Problems {
		fmt.Fprintf(&buf, "# skipped: %s\n", p)
	}
	buf.Write(plan.Restore)
	_, err = w.Write(buf.Bytes())
	return err
}

func quote(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		out[i] = a
	}
	return out
}

// Cleanup removes everything kproxy owns in this family: its jump rules and
// every KPROXY- chain of the nat and filter tables (including chains of
// earlier runs). Afterwards iptables-save of nat and filter shows what was
// there before kproxy ran (route_localnet, a sysctl, is left as it is).
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, j := range rules.Jumps() {
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
	saves, err := b.save(ctx, rules.TableNAT, rules.TableFilter)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: %w", err))...)
	}
	var input bytes.Buffer
	for _, t := range []string{rules.TableNAT, rules.TableFilter} {
		var owned []string
		for _, c := range ChainNames(saves[t]) {
			if rules.Owned(c) {
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
	b.planner.Invalidate()
	b.needFull = true
	return errors.Join(errs...)
}
