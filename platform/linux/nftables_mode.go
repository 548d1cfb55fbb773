package linux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
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

// NFTBackend is the nftables mode of one IP family: the Driver over
// nftMode.
//
// Ownership: the backend owns the table "kproxy" of its family (nft
// family ip or ip6) and everything in it; it touches nothing else, except
// through NFTOptions.TakeOver.
//
// Each sync renders the View's changed ports (every port on a full sync)
// against the record of the last successful transaction (nftables.Applied)
// and runs the one transaction that takes the table there; the record is
// kept only when the transaction succeeded. A full sync rewrites the
// table's content in place, so no connection ever meets a table without
// its rules.
type NFTBackend struct {
	*Driver
	m *nftMode
}

// nftMode renders the intent into kproxy's nftables table.
type nftMode struct {
	opts     NFTOptions
	family   v1.IPFamily
	renderer *nftables.Renderer
	log      klog.Logger

	applied *nftables.Applied
	// tookOver: the take-over ran, or runs, in the background.
	tookOver atomic.Bool
	stats    nftables.Stats
	// primary: NodePorts' primary address while the Node is unknown.
	primary primaryKeeper
}

var (
	_ intent.Backend   = (*NFTBackend)(nil)
	_ intent.DryRunner = (*NFTBackend)(nil)
)

// NFTSyncResult describes the last sync, for logs and tests.
type NFTSyncResult struct {
	Result
	Stats nftables.Stats
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
	m := &nftMode{opts: opts, family: opts.Rules.Family, renderer: r, log: log.WithValues("family", opts.Rules.Family)}
	return &NFTBackend{Driver: newDriver(m, opts.Rules.Family, log, opts.Conntrack, opts.Host, opts.Metrics.Conntrack), m: m}, nil
}

// Last returns what the last successful sync did.
func (b *NFTBackend) Last() NFTSyncResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	return NFTSyncResult{Result: b.result, Stats: b.m.stats}
}

// errTableGone says kproxy's table, or a fixed chain's rules, are gone.
var errTableGone = errors.New("kproxy's nftables table or its fixed rules are gone")

// apply renders and runs one transaction. A full one first lists what
// kproxy's table holds (object names only).
func (m *nftMode) apply(ctx context.Context, v *intent.View, full bool) (applied, error) {
	full = full || m.applied == nil
	// While the Node is unknown, NodePorts on the primary address stay
	// where the table has them (see nodeunknown.go).
	planned := m.primary.node(m.log, m.family, m.opts.Rules, v.Node, full, func() []netip.Addr { return m.nodePortIPsInTable(ctx) })
	last := m.applied
	if full {
		last = nil
	}
	in := nftables.Input{Full: full, Node: nftFacts(m.opts.Rules, planned, v.LocalAddrs), Ports: map[proxy.ServicePortName]*intent.Port{}}
	if full {
		for _, p := range v.Sorted() {
			in.Ports[p.Name] = p
		}
		ex, err := m.existing(ctx)
		if err != nil {
			return applied{}, err
		}
		in.Existing = ex
	} else {
		v.ChangedPorts(func(n proxy.ServicePortName, p *intent.Port) {
			if p != nil || last.Intent(n) != nil {
				in.Ports[n] = p // nil: gone
			}
		})
	}
	plan, next := m.renderer.Render(in, last)
	if plan.Tx.NumOperations() > 0 {
		if err := m.opts.NFT.Run(ctx, plan.Tx); err != nil {
			return applied{}, fmt.Errorf("nft: %d operations (%d elements added, %d deleted, %d chains written): %w",
				plan.Tx.NumOperations(), plan.Stats.AddedElements, plan.Stats.DeletedElements, plan.Stats.WrittenChains, err)
		}
	}
	m.applied = next
	m.stats = plan.Stats
	st := plan.Stats
	return applied{full: full, wrote: plan.Tx.NumOperations() > 0, routeLocalnet: plan.RouteLocalnet,
		log: []any{"mode", "nftables", "chains", st.Chains, "rules", st.Rules, "elements", st.Elements,
			"writtenChains", st.WrittenChains, "addedElements", st.AddedElements, "deletedElements", st.DeletedElements,
			"deletedChains", st.DeletedChains}}, nil
}

// failed counts a failed transaction.
func (m *nftMode) failed(error, bool) { m.opts.Metrics.SyncFailed() }

// isolate: nftables has no per-port isolation yet; a failed full
// transaction fails the sync.
func (m *nftMode) isolate(context.Context, *intent.View, error) bool { return false }

// synced records what the table holds and, after the first full sync,
// takes over from another proxy, off the sync's path: kproxy's table
// already serves every Service, so what the other proxy left only has to
// go.
func (m *nftMode) synced(ctx context.Context, full bool) {
	m.opts.Metrics.Objects(m.stats.Chains, m.stats.Rules, m.stats.Elements)
	if full && m.opts.TakeOver != nil && m.tookOver.CompareAndSwap(false, true) {
		go func() {
			if err := m.opts.TakeOver(ctx); err != nil && ctx.Err() == nil {
				m.opts.Metrics.CleanupFailed()
				m.log.Error(err, "Taking over from another proxy failed; retrying after the next full sync")
				m.tookOver.Store(false)
			}
		}()
	}
}

// nftFacts derives the node-wide facts of cfg's family from the Node and
// the node's local addresses.
func nftFacts(cfg facts.Config, n proxy.Node, localAddrs []netip.Addr) nftables.Node {
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
	node.NodePortsAll, node.NodePortIPs = cfg.NodePortDestinations(n, localAddrs)
	node.Localhost = cfg.Family == v1.IPv4Protocol && cfg.LocalhostNodePorts &&
		(node.NodePortsAll || slices.ContainsFunc(node.NodePortIPs, netip.Addr.IsLoopback))
	return node
}

// nodePortIPsInTable returns the addresses of the table's NodePort
// address set (none without the table or the set).
func (m *nftMode) nodePortIPsInTable(ctx context.Context) []netip.Addr {
	els, err := m.opts.NFT.ListElements(ctx, "set", nftables.SetNodePorts)
	if err != nil {
		if !nftables.IsNotFound(err) {
			m.log.Info("Reading the NodePort addresses kproxy's table holds failed", "err", err)
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
func (m *nftMode) existing(ctx context.Context) (*nftables.Existing, error) {
	all, err := m.opts.NFT.ListAll(ctx)
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
func (m *nftMode) check(ctx context.Context) error {
	if err := m.opts.NFT.Run(ctx, m.renderer.Canary()); err != nil {
		return fmt.Errorf("%w: the dispatch maps' canary elements: %w", errTableGone, err)
	}
	for _, c := range []string{nftables.ChainNATPrerouting, nftables.ChainNATOutput, nftables.ChainServices} {
		n, err := m.opts.NFT.CountRules(ctx, c)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", errTableGone, c, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: chain %s is empty", errTableGone, c)
		}
	}
	return nil
}

// dryRun writes the exact nft -f input a full sync of v would run on a
// node without kproxy's table. It changes nothing.
func (m *nftMode) dryRun(w io.Writer, v *intent.View) error {
	in := nftables.Input{Full: true, Node: nftFacts(m.opts.Rules, v.Node, v.LocalAddrs), Ports: map[proxy.ServicePortName]*intent.Port{}}
	for _, p := range v.Sorted() {
		in.Ports[p.Name] = p
	}
	plan, _ := m.renderer.Render(in, nil)
	fmt.Fprintf(w, "# kproxy %s rules: input of nft -f (table %s %s)\n", m.family, nftables.Family(m.family), nftables.TableName)
	fmt.Fprintf(w, "# %d service ports, %d chains, %d rules, %d elements\n", plan.Stats.ServicePorts, plan.Stats.Chains, plan.Stats.Rules, plan.Stats.Elements)
	for _, p := range v.Problems() {
		fmt.Fprintf(w, "# skipped: %s\n", p.Message)
	}
	_, err := io.WriteString(w, plan.Tx.String())
	return err
}

// cleanup deletes kproxy's table of this family (if any): afterwards "nft
// list ruleset" shows what was there before kproxy ran.
func (m *nftMode) cleanup(ctx context.Context) error {
	m.applied = nil
	if err := m.opts.NFT.Run(ctx, nftables.DeleteTable(nftables.Family(m.family))); err != nil {
		return fmt.Errorf("deleting kproxy's nftables table: %w", err)
	}
	return nil
}
