package linux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
)

// NFTOptions configures an NFTBackend.
type NFTOptions struct {
	// Rules holds the settings both Linux modes share (family, masquerade
	// bit, masqueradeAll, detect-local, NodePort addresses, capabilities);
	// the iptables-only ones (filter bit, sharding) are ignored.
	Rules facts.Config
	// NFT is the seam to nftables for kproxy's table of the family
	// (nftables.NewSystem on a node, an nftmodel.Fake in tests).
	NFT       nftables.Interface
	Conntrack Conntrack
	Host      Host
	// Metrics receives what each sync did (nil: none).
	Metrics NFTMetrics
	// TakeOver, when set, runs once after the first successful full sync,
	// in the background: it removes what another proxy left (kube-proxy's
	// iptables chains and nftables table, kproxy's own iptables chains),
	// now that kproxy's table serves the same Services. Its error is
	// logged, counted (Metrics.CleanupFailed) and it is tried again after
	// the next full sync.
	TakeOver func(ctx context.Context) error
	// Logger receives the backend's log lines (zero: klog's global one).
	Logger klog.Logger
}

// NFTMetrics receives the nftables-specific results of syncs.
type NFTMetrics interface {
	// SyncFailed counts a failed transaction.
	SyncFailed()
	// CleanupFailed counts a failed removal of what another proxy left
	// (NFTOptions.TakeOver): kproxy's table itself needs no cleanup of its
	// own, stale chains go in the sync's transaction.
	CleanupFailed()
	// Objects records what kproxy's table holds after a sync.
	Objects(chains, rules, elements int)
	// Conntrack records one round of stale-flow cleanup (see Metrics).
	Conntrack(deleted int, d time.Duration, failed bool)
}

type noNFTMetrics struct{}

func (noNFTMetrics) SyncFailed()                        {}
func (noNFTMetrics) CleanupFailed()                     {}
func (noNFTMetrics) Objects(int, int, int)              {}
func (noNFTMetrics) Conntrack(int, time.Duration, bool) {}

// NFTBackend programs one IP family's nftables table. It implements
// proxy.Backend, proxy.DryRunner and proxy.UnsupportedReporter.
//
// Ownership: the backend owns the table "kproxy" of its family (nft
// family ip or ip6) and everything in it; it touches nothing else, except
// through Options.TakeOver.
//
// Each sync builds the intent of the changed service ports (every port on
// a full sync), renders it against the record of the last successful
// transaction (nftables.Applied) and runs the one transaction that takes the
// table there; the record is kept only when the transaction succeeded. A
// full sync rewrites the table's content in place, in one transaction, so
// no connection ever meets a table without its rules.
type NFTBackend struct {
	opts     NFTOptions
	family   v1.IPFamily
	renderer *nftables.Renderer
	log      klog.Logger

	mu         sync.Mutex
	applied    *nftables.Applied
	needFull   bool
	tookOver   bool
	localAddrs []netip.Addr
	nodeIPs    []netip.Addr
	// primary: NodePorts' primary address while the Node is unknown.
	primary primaryKeeper
	// invalid holds the problems of the ports whose intent could not be
	// built at all (they are left out); problems are those of the last
	// successful sync, for Unsupported.
	invalid   map[proxy.ServicePortName][]proxy.Unsupported
	problems  []proxy.Unsupported
	pendingCT conntrackQueue
	lc        leastConn
	lastSnap  *proxy.Snapshot
	last      NFTSyncResult
}

var (
	_ proxy.Backend             = (*NFTBackend)(nil)
	_ proxy.DryRunner           = (*NFTBackend)(nil)
	_ proxy.UnsupportedReporter = (*NFTBackend)(nil)
)

// NFTSyncResult describes the last sync, for logs and tests.
type NFTSyncResult struct {
	Full             bool
	Duration         time.Duration
	Stats            nftables.Stats
	ConntrackDeleted int
}

// NewNFT returns an NFTBackend. opts.NFT, Conntrack and Host must be set.
func NewNFT(opts NFTOptions) (*NFTBackend, error) {
	if opts.NFT == nil || opts.Conntrack == nil || opts.Host == nil {
		return nil, errors.New("nftables backend: the NFT, Conntrack and Host seams are required")
	}
	r, err := nftables.NewRenderer(opts.Rules)
	if err != nil {
		return nil, err
	}
	if opts.Metrics == nil {
		opts.Metrics = noNFTMetrics{}
	}
	log := opts.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	log = log.WithValues("family", opts.Rules.Family)
	return &NFTBackend{opts: opts, family: opts.Rules.Family, renderer: r, log: log, needFull: true,
		invalid: map[proxy.ServicePortName][]proxy.Unsupported{},
		lc:      leastConn{family: opts.Rules.Family, ct: opts.Conntrack, log: log}}, nil
}

// Family returns the backend's IP family.
func (b *NFTBackend) Family() v1.IPFamily { return b.family }

// Last returns what the last successful sync did.
func (b *NFTBackend) Last() NFTSyncResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// Unsupported lists what the last successful sync left out (see
// proxy.UnsupportedReporter).
func (b *NFTBackend) Unsupported() []proxy.Unsupported {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.problems)
}

// errTableGone says kproxy's table, or a fixed chain's rules, are gone.
var errTableGone = errors.New("kproxy's nftables table or its fixed rules are gone")

// Sync makes kproxy's table match snap (see proxy.Backend). A sync with
// nothing to write checks that the table and its entry chains are still
// there (one small listing); if not, or if a partial transaction fails, it
// syncs in full at once.
func (b *NFTBackend) Sync(ctx context.Context, snap *proxy.Snapshot, ch proxy.Changes) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := time.Now()
	if addrs, err := b.opts.Host.LocalAddresses(); err != nil {
		b.log.Error(err, "Listing local addresses failed, using the last known ones")
	} else {
		b.localAddrs = addrs
	}
	view := snap.Family(b.family)
	if view == nil {
		view = proxy.NewFamilyView(b.family, nil)
	}
	ch = withPorts(ch, b.lc.refresh(view, ch, start))
	full := ch.Full || b.needFull || b.applied == nil
	plan, next, err := b.apply(ctx, snap, view, ch, full)
	if err == nil && !full && plan.Tx.NumOperations() == 0 {
		err = b.check(ctx)
	}
	if err != nil && ctx.Err() != nil {
		b.needFull = true
		return fmt.Errorf("sync interrupted (%w): %w", context.Cause(ctx), err)
	}
	if err != nil && !full {
		b.opts.Metrics.SyncFailed()
		b.log.Info("Partial sync failed (kproxy's table changed behind its back?): full sync", "err", err)
		full = true
		plan, next, err = b.apply(ctx, snap, view, ch, true)
	}
	if err != nil {
		b.opts.Metrics.SyncFailed()
		b.needFull = true
		return err
	}
	old := b.applied
	b.applied = next
	b.needFull = false
	b.lastSnap = snap
	b.opts.Metrics.Objects(plan.Stats.Chains, plan.Stats.Rules, plan.Stats.Elements)
	b.problems = b.problems[:0]
	for _, ps := range b.invalid {
		b.problems = append(b.problems, ps...)
	}
	b.problems = append(b.problems, next.Problems()...)
	proxy.SortUnsupported(b.problems)

	var errs []error
	if full && plan.RouteLocalnet {
		if err := b.opts.Host.SetSysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
			errs = append(errs, fmt.Errorf("enabling localhost NodePorts: %w", err))
		}
	}
	deleted := b.cleanConntrack(b.staleFlows(old, next, view, ch, full))
	if full && !b.tookOver && b.opts.TakeOver != nil {
		// Off the sync's path: kproxy's table already serves every
		// Service, so what the other proxy left only has to go.
		b.tookOver = true
		go func() {
			if err := b.opts.TakeOver(ctx); err != nil && ctx.Err() == nil {
				b.opts.Metrics.CleanupFailed()
				b.log.Error(err, "Taking over from another proxy failed; retrying after the next full sync")
				b.mu.Lock()
				b.tookOver = false
				b.mu.Unlock()
			}
		}()
	}
	b.last = NFTSyncResult{Full: full, Duration: time.Since(start), Stats: plan.Stats, ConntrackDeleted: deleted}
	b.log.V(2).Info("Synced nftables", "full", full, "servicePorts", plan.Stats.ServicePorts,
		"chains", plan.Stats.Chains, "rules", plan.Stats.Rules, "elements", plan.Stats.Elements,
		"writtenChains", plan.Stats.WrittenChains, "addedElements", plan.Stats.AddedElements,
		"deletedElements", plan.Stats.DeletedElements, "deletedChains", plan.Stats.DeletedChains,
		"conntrackDeleted", deleted, "duration", b.last.Duration)
	if len(errs) > 0 {
		b.needFull = true
		return errors.Join(errs...)
	}
	return nil
}

// apply builds the intents, renders and runs one transaction. A full one
// first lists what kproxy's table holds (object names only).
func (b *NFTBackend) apply(ctx context.Context, snap *proxy.Snapshot, view *proxy.FamilyView, ch proxy.Changes, full bool) (*nftables.Plan, *nftables.Applied, error) {
	// While the Node is unknown, NodePorts on the primary address stay
	// where the table has them (see nodeunknown.go).
	planned := b.primary.node(b.log, b.family, b.opts.Rules, snap.Node, full, func() []netip.Addr { return b.nodePortIPsInTable(ctx) })
	node, icfg := b.facts(planned)
	last := b.applied
	if full {
		last = nil
	}
	if last != nil && !slices.Equal(icfg.NodeIPs, b.nodeIPs) {
		// Source ranges that contain a node address change with them.
		extra := map[proxy.ServicePortName]struct{}{}
		for _, sp := range view.Sorted() {
			if intent.DependsOnNodeIPs(sp) {
				extra[sp.Name] = struct{}{}
			}
		}
		ch = withPorts(ch, extra)
	}
	in := nftables.Input{Full: full, Node: node, Ports: map[proxy.ServicePortName]*intent.Port{}}
	build := func(sp *proxy.ServicePort) {
		p, problems := intent.Build(icfg, sp, b.lc.conns[sp.Name])
		if p == nil {
			b.invalid[sp.Name] = problems
		} else {
			delete(b.invalid, sp.Name)
		}
		in.Ports[sp.Name] = p // nil: left out
	}
	if full {
		clear(b.invalid)
		for _, sp := range view.Sorted() {
			build(sp)
		}
		ex, err := b.existing(ctx)
		if err != nil {
			return nil, nil, err
		}
		in.Existing = ex
	} else {
		for n := range ch.Ports {
			if sp := view.Ports[n]; sp != nil {
				build(sp)
			} else if last.Intent(n) != nil {
				in.Ports[n] = nil
				delete(b.invalid, n)
			} else {
				delete(b.invalid, n)
			}
		}
	}
	plan, next := b.renderer.Render(in, last)
	if plan.Tx.NumOperations() > 0 {
		if err := b.opts.NFT.Run(ctx, plan.Tx); err != nil {
			return nil, nil, fmt.Errorf("nft: %d operations (%d elements added, %d deleted, %d chains written): %w",
				plan.Tx.NumOperations(), plan.Stats.AddedElements, plan.Stats.DeletedElements, plan.Stats.WrittenChains, err)
		}
	}
	b.nodeIPs = icfg.NodeIPs
	return plan, next, nil
}

// facts derives the node-wide facts of the family from the Node and the
// local addresses.
func (b *NFTBackend) facts(n proxy.Node) (nftables.Node, intent.Config) {
	return nftFacts(b.opts.Rules, n, b.localAddrs)
}

// nftFacts derives the node-wide facts of cfg's family from the Node and
// the node's local addresses.
func nftFacts(cfg facts.Config, n proxy.Node, localAddrs []netip.Addr) (nftables.Node, intent.Config) {
	icfg := intent.Config{Family: cfg.Family, MasqueradeAll: cfg.MasqueradeAll, NodeIPs: cfg.NodeIPs(n, localAddrs)}
	var node nftables.Node
	switch cfg.LocalDetect {
	case facts.LocalBridgeInterface, facts.LocalInterfaceNamePrefix:
		node.PodSources = true
	case facts.LocalNodeCIDR:
		node.PodCIDRs = cfg.OfFamily(n.PodCIDRs)
	default:
		node.PodCIDRs = cfg.OfFamily(cfg.ClusterCIDRs)
	}
	if len(node.PodCIDRs) > 0 {
		node.PodSources = true
	}
	icfg.PodSources = node.PodSources
	node.NodePortsAll, node.NodePortIPs = cfg.NodePortDestinations(n, localAddrs)
	node.Localhost = cfg.Family == v1.IPv4Protocol && cfg.LocalhostNodePorts &&
		(node.NodePortsAll || slices.ContainsFunc(node.NodePortIPs, netip.Addr.IsLoopback))
	return node, icfg
}

// nodePortIPsInTable returns the addresses of the table's NodePort
// address set (none without the table or the set).
func (b *NFTBackend) nodePortIPsInTable(ctx context.Context) []netip.Addr {
	els, err := b.opts.NFT.ListElements(ctx, "set", nftables.SetNodePorts)
	if err != nil {
		if !nftables.IsNotFound(err) {
			b.log.Info("Reading the NodePort addresses kproxy's table holds failed", "err", err)
		}
		return nil
	}
	var out []netip.Addr
	for _, e := range els {
		if len(e.Key) != 1 {
			continue
		}
		if a, err := netip.ParseAddr(e.Key[0]); err == nil {
			out = append(out, a)
		} else if p, err := netip.ParsePrefix(e.Key[0]); err == nil && p.IsSingleIP() {
			out = append(out, p.Addr())
		}
	}
	return out
}

// existing lists the chains and sets of kproxy's table (nil: no table).
func (b *NFTBackend) existing(ctx context.Context) (*nftables.Existing, error) {
	all, err := b.opts.NFT.ListAll(ctx)
	if nftables.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing kproxy's nftables table: %w", err)
	}
	ex := &nftables.Existing{Chains: all["chain"], Sets: all["set"]}
	slices.Sort(ex.Chains)
	slices.Sort(ex.Sets)
	return ex, nil
}

// check verifies, when a sync had nothing to write, that kproxy's table is
// there with its dispatch maps (their canary elements) and its entry
// chains' rules (someone may have deleted the table or flushed it).
func (b *NFTBackend) check(ctx context.Context) error {
	if err := b.opts.NFT.Run(ctx, b.renderer.Canary()); err != nil {
		return fmt.Errorf("%w: the dispatch maps' canary elements: %w", errTableGone, err)
	}
	for _, c := range []string{nftables.ChainNATPrerouting, nftables.ChainNATOutput, nftables.ChainServices} {
		rs, err := b.opts.NFT.ListRules(ctx, c)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", errTableGone, c, err)
		}
		if len(rs) == 0 {
			return fmt.Errorf("%w: chain %s is empty", errTableGone, c)
		}
	}
	return nil
}

// staleFlows lists the conntrack filters of the UDP ports that changed.
func (b *NFTBackend) staleFlows(old, next *nftables.Applied, view *proxy.FamilyView, ch proxy.Changes, full bool) []conntrack.Filter {
	var out []conntrack.Filter
	from := func(a *nftables.Applied, n proxy.ServicePortName) *proxy.ServicePort {
		if p := a.Intent(n); p != nil {
			return p.From
		}
		return nil
	}
	visit := func(n proxy.ServicePortName) {
		var o *proxy.ServicePort
		if old != nil {
			o = from(old, n)
		}
		c := from(next, n)
		if o == c && o != nil {
			return
		}
		out = append(out, conntrack.StaleFlows(b.family, o, c, b.localAddrs)...)
	}
	if full {
		for _, sp := range view.Sorted() {
			visit(sp.Name)
		}
		return out
	}
	for n := range ch.Ports {
		visit(n)
	}
	return out
}

// cleanConntrack deletes stale flows once the rules are in place (see
// Backend.cleanConntrack: a failure never fails the sync).
func (b *NFTBackend) cleanConntrack(filters []conntrack.Filter) int {
	b.pendingCT.add(filters)
	if b.pendingCT.empty() {
		return 0
	}
	start := time.Now()
	m := conntrack.NewMatcher(b.pendingCT.filters())
	n, err := b.opts.Conntrack.DeleteFlows(b.family, m.Match)
	b.opts.Metrics.Conntrack(n, time.Since(start), err != nil)
	if err != nil {
		b.log.Error(err, "Deleting stale conntrack flows failed; retrying with the next sync", "frontends", b.pendingCT.len(), "deleted", n)
		return n
	}
	b.pendingCT.clear()
	return n
}

// RunLeastConnection refreshes the weights of least-connection service
// ports until ctx is done (see Backend.RunLeastConnection).
func (b *NFTBackend) RunLeastConnection(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.mu.Lock()
		snap, ok := b.lastSnap, !b.needFull && b.lastSnap != nil && b.lc.active() && b.lc.due(time.Now())
		b.mu.Unlock()
		if !ok {
			continue
		}
		if err := b.Sync(ctx, snap, proxy.Changes{}); err != nil && ctx.Err() == nil {
			b.log.Error(err, "Refreshing least-connection weights failed")
		}
	}
}

// DryRun writes the exact nft -f input a full sync of snap would run on a
// node without kproxy's table (see proxy.DryRunner). It reads the node's
// addresses but changes nothing.
func (b *NFTBackend) DryRun(w io.Writer, snap *proxy.Snapshot) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	addrs, err := b.opts.Host.LocalAddresses()
	if err != nil {
		return fmt.Errorf("dry run: listing local addresses: %w", err)
	}
	b.localAddrs = addrs
	node, icfg := b.facts(snap.Node)
	in := nftables.Input{Full: true, Node: node, Ports: map[proxy.ServicePortName]*intent.Port{}}
	view := snap.Family(b.family)
	var problems []proxy.Unsupported
	if view != nil {
		for _, sp := range view.Sorted() {
			p, ps := intent.Build(icfg, sp, nil)
			in.Ports[sp.Name] = p
			if p == nil {
				problems = append(problems, ps...)
			}
		}
	}
	plan, _ := b.renderer.Render(in, nil)
	problems = append(problems, plan.Problems...)
	fmt.Fprintf(w, "# kproxy %s rules: input of nft -f (table %s %s)\n", b.family, nftables.Family(b.family), nftables.TableName)
	fmt.Fprintf(w, "# %d service ports, %d chains, %d rules, %d elements\n", plan.Stats.ServicePorts, plan.Stats.Chains, plan.Stats.Rules, plan.Stats.Elements)
	for _, p := range problems {
		fmt.Fprintf(w, "# skipped: %s\n", p.Message)
	}
	_, err = io.WriteString(w, plan.Tx.String())
	return err
}

// Cleanup deletes kproxy's table of this family (if any): afterwards "nft
// list ruleset" shows what was there before kproxy ran.
func (b *NFTBackend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.applied, b.needFull = nil, true
	if err := b.opts.NFT.Run(ctx, nftables.DeleteTable(nftables.Family(b.family))); err != nil {
		return fmt.Errorf("deleting kproxy's nftables table: %w", err)
	}
	return nil
}
