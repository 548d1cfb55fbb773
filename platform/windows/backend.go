package windows

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// Defaults.
const (
	// DefaultRootHNSEndpointName is upstream's default --root-hnsendpoint-name.
	DefaultRootHNSEndpointName = "cbr0"
	// DefaultHealthzPort is the port of upstream's default --healthz-bind-address.
	DefaultHealthzPort = 10256
	// DefaultResyncPeriod is how often the backend lists HNS again to repair
	// what was changed out of band.
	DefaultResyncPeriod = 5 * time.Minute
	// DefaultCheckPeriod is how often the backend checks that what it
	// programmed still exists (upstream's default sync period).
	DefaultCheckPeriod = 30 * time.Second
)

// EnvNetworkName is the environment variable upstream reads when no network
// name is configured.
const EnvNetworkName = "KUBE_NETWORK"

// HostInterface is one network interface of the host.
type HostInterface struct {
	Name  string
	MAC   string // HNS form: "00-15-5d-01-02-03"
	Addrs []netip.Addr
}

// OfflineFacts stand in for HNS in a dry run without HNS (any OS).
type OfflineFacts struct {
	// Network defaults to an L2Bridge network named Options.NetworkName.
	Network *hns.Network
	// Version defaults to 15.5 (every capability).
	Version *hns.Version
}

// Options configure a Backend. Only NetworkName is required (and HNS, except
// for dry runs).
type Options struct {
	// HNS is the host's HNS: hns.NewHNS() on Windows, a *fakehns.Fake in
	// tests. Nil makes a backend that can only DryRun.
	HNS hns.HNS
	// Family is the IP family this backend programs (default IPv4). A
	// dual-stack node runs two backends, one per family, behind the generic
	// fan-out: HNS load balancers are single-family, and each backend only
	// ever touches load balancers and endpoints of its family.
	Family v1.IPFamily
	// NetworkName is the HNS network: winkernel.networkName / --network-name,
	// else $KUBE_NETWORK (read by pkg/config). Empty: the only L2Bridge
	// or Overlay network on the host (an error lists them when there are
	// several, or none yet).
	NetworkName string
	// SourceVIP is winkernel.sourceVip / --source-vip, for overlay networks
	// (unused on others). An address of the other family is ignored. When
	// unset, the backend uses the address of the Calico_ep endpoint if the
	// network has one, else ReserveSourceVIP's.
	SourceVIP netip.Addr
	// ReserveSourceVIP reserves (or finds again, after a restart) an address
	// of the node's pod subnet for the source VIP in a host-local store (a
	// directory: IPAMStore's), avoiding addresses for which avoid is true
	// (ReserveInIPAMStore). Nil: overlay networks need SourceVIP or a
	// Calico_ep endpoint.
	ReserveSourceVIP func(store string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error)
	// IPAMDataDir overrides host-local's data directory (KPROXY_IPAM_DATA_DIR);
	// empty: the CNI configuration's, else DefaultIPAMDataDir.
	IPAMDataDir string
	// CNIConfig reads the node's CNI network configuration (nil: none is
	// read): its network name is the HNS network used when none is
	// configured, and it says where host-local keeps its store.
	CNIConfig func() (*CNIConfig, error)
	// EchoFile keeps, across restarts, the echoes learned of fields HNS
	// returns changed, per Windows build (reconcile.Echoes): "" keeps
	// them in memory only.
	EchoFile string
	// WindowsBuild names the Windows build (e.g. "10.0.17763.8146"; default
	// none: the HNS version alone keys the learned echoes).
	WindowsBuild string
	// EnableDSR is winkernel.enableDSR / --enable-dsr: direct server return
	// on ClusterIP load balancers, when HNS supports it.
	EnableDSR bool
	// RootHNSEndpointName is winkernel.rootHnsEndpointName /
	// --root-hnsendpoint-name (default "cbr0"): the host's endpoint that
	// forwarded health checks go to.
	RootHNSEndpointName string
	// ForwardHealthCheckVIP is winkernel.forwardHealthCheckVip /
	// --forward-healthcheck-vip.
	ForwardHealthCheckVIP bool
	// HealthzPort is the port of --healthz-bind-address (default 10256): what
	// forwarded health checks reach for Services without a healthCheckNodePort.
	HealthzPort int
	// NodeIP overrides the node IP. By default it comes from the snapshot's
	// Node addresses of the family, preferring one held by a host interface.
	NodeIP netip.Addr
	// HostMAC overrides the MAC address of the interface holding the node IP.
	HostMAC string
	// Interfaces lists the host's interfaces (default: package net).
	Interfaces func() ([]HostInterface, error)
	// ResyncPeriod is how often HNS is listed again to repair out-of-band
	// changes (default 5m; negative: never). HNS is also listed on the first
	// sync and after any failed sync.
	ResyncPeriod time.Duration
	// CallTimeout bounds each HNS call (default DefaultCallTimeout; negative:
	// no bound). A call that does not return in time fails the sync as HNS
	// being unavailable, and no further call is made until it returns.
	CallTimeout time.Duration
	// CheckPeriod is how often a sync first checks, cheaply, that the objects
	// in the record still exist in HNS (one listing of load balancers and
	// one of the network's endpoints, compared by ID), and lists and repairs
	// everything when one is gone: an HNS restart, a load balancer deleted
	// out of band, a recreated network. Default DefaultCheckPeriod (kproxy
	// passes its sync period); negative: never.
	CheckPeriod time.Duration
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// Logger receives the backend's log lines (zero: klog's global one).
	Logger klog.Logger
	// Metrics receives HNS call latencies and error counts (default: none).
	Metrics hns.Metrics
	// Offline supplies network facts for DryRun when HNS is nil.
	Offline OfflineFacts
}

// Backend programs HNS load balancers and remote endpoints for one IP family.
// It implements intent.Backend, intent.DryRunner, proxy.UnsupportedReporter
// and proxy.Quarantiner: the app hands it the intent view of each sync.
//
// It keeps a record of what exists in HNS (reconcile.Record), refreshed by a
// full listing on the first sync, every ResyncPeriod and after a failed
// sync, and otherwise replaced, after each apply, by the record Apply
// returns. A sync with no change makes no HNS call. The protocol of a sync
// is in sync.go.
type Backend struct {
	opts  Options
	log   klog.Logger
	hns   hns.HNS // instrumented, bounded; nil for dry-run only
	clock clock.PassiveClock

	mu sync.Mutex
	// caps is nil until HNS was asked for its version; build names the
	// Windows build and HNS version (learned echoes are per build).
	caps  *hns.Capabilities
	build string
	// network is nil until the network was found (by r).
	network *hns.Network
	// r reads HNS (observe.go).
	r reader
	// rec is what HNS holds, as far as kproxy knows (nil until listed).
	rec *reconcile.Record
	// plan is the last sync's plan (the next one reuses its unchanged ports).
	plan     *plan.Plan
	needList bool
	// lastList and lastCheck are when the sync that last listed HNS, and
	// the one that last checked the record against HNS (or listed), began.
	lastList    time.Time
	lastCheck   time.Time
	lastRecheck time.Time
	// routeChecked are remote addresses outside every remote subnet for
	// which the network was read again (cleared at each listing).
	routeChecked map[netip.Addr]bool
	// fallbackPA: the last plan has a remote endpoint no remote subnet
	// holds (it got this node's provider address): the network is read at
	// every sync until a route for it appears.
	fallbackPA bool
	// ifaces are the host's interfaces, read at each listing.
	ifaces []HostInterface
	// missingLocal are the local addresses found missing at the last sync.
	missingLocal map[netip.Addr]bool
	// unsupported is what the last sync's plan could not program as asked.
	unsupported []proxy.Unsupported
	// q is the quarantine of what HNS refused (quarantine.go).
	q quarantine
	// sourceVIP is the source VIP found on an overlay network when none is
	// configured (invalid until found).
	sourceVIP netip.Addr
	// idleLogged: said once.
	idleLogged bool
	// echoes keeps the learned echoes across restarts (echoes.go).
	echoes echoStore
}

var (
	_ intent.Backend            = (*Backend)(nil)
	_ intent.DryRunner          = (*Backend)(nil)
	_ proxy.UnsupportedReporter = (*Backend)(nil)
)

// New returns a backend. It makes no HNS call.
func New(opts Options) (*Backend, error) {
	if opts.NetworkName == "" && opts.HNS == nil {
		return nil, errors.New("windows backend: NetworkName is required for a dry run without HNS")
	}
	switch opts.Family {
	case "":
		opts.Family = v1.IPv4Protocol
	case v1.IPv4Protocol, v1.IPv6Protocol:
	default:
		return nil, fmt.Errorf("windows backend: unknown IP family %q", opts.Family)
	}
	if opts.RootHNSEndpointName == "" {
		opts.RootHNSEndpointName = DefaultRootHNSEndpointName
	}
	if opts.HealthzPort == 0 {
		opts.HealthzPort = DefaultHealthzPort
	}
	if opts.HealthzPort < 0 || opts.HealthzPort > 65535 {
		return nil, fmt.Errorf("windows backend: healthz port %d out of range", opts.HealthzPort)
	}
	if opts.ResyncPeriod == 0 {
		opts.ResyncPeriod = DefaultResyncPeriod
	}
	if opts.CallTimeout == 0 {
		opts.CallTimeout = hns.DefaultCallTimeout
	}
	if opts.CheckPeriod == 0 {
		opts.CheckPeriod = DefaultCheckPeriod
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Metrics == nil {
		opts.Metrics = hns.NopMetrics{}
	}
	if opts.Interfaces == nil {
		opts.Interfaces = HostInterfaces
	}
	if opts.SourceVIP.IsValid() {
		opts.SourceVIP = opts.SourceVIP.Unmap()
		if opts.SourceVIP.Is6() != (opts.Family == v1.IPv6Protocol) {
			opts.SourceVIP = netip.Addr{} // the other family's backend uses it
		}
	}
	log := opts.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	b := &Backend{
		opts:         opts,
		log:          log,
		clock:        opts.Clock,
		needList:     true,
		missingLocal: make(map[netip.Addr]bool),
		q:            quarantine{family: opts.Family, log: log},
	}
	b.r = reader{opts: &b.opts, log: log, netName: opts.NetworkName}
	b.echoes = echoStore{file: opts.EchoFile, log: log}
	if opts.HNS != nil {
		h := opts.HNS
		if opts.CallTimeout > 0 {
			h = hns.WithTimeout(h, opts.CallTimeout, log)
		}
		b.hns = hns.Instrument(h, opts.Metrics, opts.Clock)
		b.r.hns = b.hns
	}
	return b, nil
}

// ErrDryRunOnly is returned by Sync on a backend made without HNS.
var ErrDryRunOnly = errors.New("windows backend without HNS can only dry-run")

// Sync makes HNS match the intent view v of the backend's family. See
// intent.Backend.
func (b *Backend) Sync(ctx context.Context, v *intent.View) error {
	if b.hns == nil {
		return ErrDryRunOnly
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	resync := b.opts.ResyncPeriod > 0 && !b.lastList.IsZero() && now.Sub(b.lastList) >= b.opts.ResyncPeriod
	list := b.needList || resync
	check := !list && b.opts.CheckPeriod > 0 && now.Sub(b.lastCheck) >= b.opts.CheckPeriod
	if !v.Full && v.NumChanged() == 0 && !v.NodeChanged && !list && !check && !b.q.due(now) {
		return nil
	}
	if b.q.noVIP != nil && b.opts.CheckPeriod > 0 && now.Sub(b.lastList) >= b.opts.CheckPeriod {
		list = true // look for the Calico endpoint again
	}
	if check && !list {
		b.lastCheck = now
		gone, err := b.r.checkRecord(b.rec.State, b.network.Name)
		if err != nil {
			b.needList = true
			return err
		}
		if gone != "" {
			b.log.Info("Objects kproxy programmed are gone from HNS; listing and repairing", "family", b.opts.Family, "gone", gone)
			list = true
		}
	}
	err := b.sync(ctx, v, list, check, now)
	b.needList = err != nil
	return err
}

// report records the plan's warnings as what the backend left out, for
// Unsupported (the app logs each once, records an Event and counts them).
func (b *Backend) report(ws []plan.Warning) {
	out := make([]proxy.Unsupported, 0, len(ws))
	for _, w := range ws {
		if w.FromIntent {
			continue // the app reports the view's problems itself
		}
		out = append(out, proxy.Unsupported{Service: w.Service, Family: b.opts.Family, Reason: w.Reason, Message: w.Message})
	}
	proxy.SortUnsupported(out)
	b.unsupported = out
}

// Unsupported lists what HNS cannot do for the Services of the last sync,
// one entry per Service and reason (see proxy.UnsupportedReporter).
func (b *Backend) Unsupported() []proxy.Unsupported {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.unsupported)
}

// Cleanup deletes, for the backend's family, every HNS load balancer and
// every endpoint kproxy owns (see ObservedEndpoint.Owned), as
// `kproxy --cleanup` does. Endpoints of the CNI are left alone. It lists HNS
// first and works from that listing, not from the record.
func (b *Backend) Cleanup(ctx context.Context) error {
	if b.hns == nil {
		return ErrDryRunOnly
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l, err := b.list(b.clock.Now())
	if err != nil {
		b.needList = true
		if !hns.IsNotFound(err) && !errors.Is(err, ErrNoNetwork) {
			return fmt.Errorf("cleanup: %w", err)
		}
		// The network is gone (its endpoints with it): delete the family's
		// load balancers all the same, as upstream does.
		b.log.Info("No HNS network; removing every load balancer of the family", "family", b.opts.Family, "reason", err)
		return b.cleanupLoadBalancers()
	}
	base := reconcile.Adopt(l.state, l.evidence, b.rec, nil).Record
	r := reconcile.Reconcile(&plan.Plan{Family: b.opts.Family}, base.State, false)
	b.log.Info("Removing kproxy's HNS objects", "family", b.opts.Family, "operations", len(r.Ops))
	ap := reconcile.Applier{HNS: b.hns, Log: b.log, Family: b.opts.Family}
	next, res := ap.Apply(ctx, r, base)
	b.rec = next
	b.needList = true // the next sync starts from a listing
	if err := res.Joined(); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}

// cleanupLoadBalancers deletes every load balancer of the backend's family.
func (b *Backend) cleanupLoadBalancers() error {
	lbs, err := b.hns.ListLoadBalancers()
	if err != nil {
		return fmt.Errorf("cleanup: listing HNS load balancers: %w", err)
	}
	var errs []error
	n := 0
	for i := range lbs {
		if (lbs[i].Flags&hns.LBFlagIPv6 != 0) != (b.opts.Family == v1.IPv6Protocol) {
			continue
		}
		if err := b.hns.DeleteLoadBalancer(lbs[i].ID); err != nil && !hns.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting load balancer %s: %w", lbs[i].ID, err))
			continue
		}
		n++
	}
	b.log.Info("Removed HNS load balancers", "family", b.opts.Family, "count", n)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}
