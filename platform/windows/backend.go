package windows

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/proxy"
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
	Network *Network
	// Version defaults to 15.5 (every capability).
	Version *Version
}

// Options configure a Backend. Only NetworkName is required (and HNS, except
// for dry runs).
type Options struct {
	// HNS is the host's HNS: NewHNS() on Windows, a *FakeHNS in tests. Nil
	// makes a backend that can only DryRun.
	HNS HNS
	// Family is the IP family this backend programs (default IPv4). A
	// dual-stack node runs two backends, one per family, behind the generic
	// fan-out: HNS load balancers are single-family, and each backend only
	// ever touches load balancers and endpoints of its family.
	Family v1.IPFamily
	// NetworkName is the HNS network: winkernel.networkName / --network-name,
	// else $KUBE_NETWORK (see NetworkNameFromEnv). Empty: the only L2Bridge
	// or Overlay network on the host (an error lists them when there are
	// several, or none yet).
	NetworkName string
	// SourceVIP is winkernel.sourceVip / --source-vip, for overlay networks
	// (unused on others). An address of the other family is ignored. When
	// unset, the backend uses the address of the Calico_ep endpoint if the
	// network has one, else ReserveSourceVIP's.
	SourceVIP netip.Addr
	// ReserveSourceVIP reserves (or finds again, after a restart) an address
	// of the node's pod subnet for the source VIP, avoiding addresses for
	// which avoid is true (e.g. HostLocalReservation.Reserve). Nil: overlay
	// networks need SourceVIP or a Calico_ep endpoint.
	ReserveSourceVIP func(network string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error)
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
	// Warn is called once per Service and reason when HNS cannot do what the
	// Service asks (the lead routes it to an Event). It may be nil.
	Warn func(svc types.NamespacedName, reason, message string)
	// Metrics receives HNS call latencies and error counts (default: none).
	Metrics Metrics
	// Offline supplies network facts for DryRun when HNS is nil.
	Offline OfflineFacts
}

// NetworkNameFromEnv returns the configured network name, else the value of
// KUBE_NETWORK from getenv (os.Getenv), as upstream does.
func NetworkNameFromEnv(configured string, getenv func(string) string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if getenv != nil {
		if v := strings.TrimSpace(getenv(EnvNetworkName)); v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("no HNS network name: set winkernel.networkName (--network-name) or %s", EnvNetworkName)
}

// Backend programs HNS load balancers and remote endpoints for one IP family.
// It implements proxy.Backend and proxy.DryRunner.
//
// It keeps a record of what exists in HNS (State), refreshed by a full
// listing on the first sync, every ResyncPeriod and after a failed sync, and
// otherwise updated from the results of its own calls. A sync with no change
// makes no HNS call.
type Backend struct {
	opts  Options
	hns   HNS // instrumented; nil for dry-run only
	clock clock.PassiveClock

	mu sync.Mutex
	// caps is nil until HNS was asked for its version.
	caps *Capabilities
	// network is nil until the network was found.
	network *Network
	// netName is the network's name: Options.NetworkName, else the one
	// found on the host ("" until found).
	netName string
	// rec is what exists in HNS (nil until listed).
	rec      *State
	needList bool
	lastList time.Time
	// lastCheck is when the record was last checked against HNS (or listed).
	lastCheck time.Time
	// routeChecked are remote addresses outside every remote subnet for
	// which the network was read again (cleared at each listing): a new
	// node's subnet is looked up once, not at every sync.
	routeChecked map[netip.Addr]bool
	// ifaces are the host's interfaces, read at each listing.
	ifaces []HostInterface
	// missingLocal are the local addresses found missing at the last sync:
	// when new ones appear, the endpoints are listed again once.
	missingLocal map[netip.Addr]bool
	lastRecheck  time.Time
	// warned holds the (Service, reason) pairs already reported.
	warned map[warnKey]bool
	// plans memoizes per-port planning across syncs.
	plans *PlanCache
	// quar holds what HNS rejected for good, by object (see quarantine.go).
	quar map[string]*quarantined
	// sourceVIP is the source VIP found on an overlay network when none is
	// configured (invalid until found); noVIP lists the ports left out
	// while none can be found.
	sourceVIP netip.Addr
	noVIP     []proxy.QuarantinedPort

	// qmu guards qPublished, what Quarantined returns (it must not wait for
	// a sync).
	qmu        sync.Mutex
	qPublished []proxy.QuarantinedPort
}

var (
	_ proxy.Backend   = (*Backend)(nil)
	_ proxy.DryRunner = (*Backend)(nil)
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
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.CheckPeriod == 0 {
		opts.CheckPeriod = DefaultCheckPeriod
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Metrics == nil {
		opts.Metrics = NopMetrics{}
	}
	if opts.Interfaces == nil {
		opts.Interfaces = hostInterfaces
	}
	if opts.SourceVIP.IsValid() {
		opts.SourceVIP = opts.SourceVIP.Unmap()
		if opts.SourceVIP.Is6() != (opts.Family == v1.IPv6Protocol) {
			opts.SourceVIP = netip.Addr{} // the other family's backend uses it
		}
	}
	b := &Backend{
		opts:         opts,
		netName:      opts.NetworkName,
		clock:        opts.Clock,
		needList:     true,
		missingLocal: make(map[netip.Addr]bool),
		warned:       make(map[warnKey]bool),
		plans:        NewPlanCache(),
	}
	if opts.HNS != nil {
		h := opts.HNS
		if opts.CallTimeout > 0 {
			h = &timeoutHNS{hns: h, timeout: opts.CallTimeout}
		}
		b.hns = instrumented{hns: h, m: opts.Metrics, clock: opts.Clock}
	}
	return b, nil
}

// ErrDryRunOnly is returned by Sync on a backend made without HNS.
var ErrDryRunOnly = errors.New("windows backend without HNS can only dry-run")

// Sync makes HNS match snap for the backend's family. See proxy.Backend.
func (b *Backend) Sync(ctx context.Context, snap *proxy.Snapshot, ch proxy.Changes) error {
	if b.hns == nil {
		return ErrDryRunOnly
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	resync := b.opts.ResyncPeriod > 0 && !b.lastList.IsZero() && now.Sub(b.lastList) >= b.opts.ResyncPeriod
	list := b.needList || resync
	check := !list && b.opts.CheckPeriod > 0 && now.Sub(b.lastCheck) >= b.opts.CheckPeriod
	if ch.Empty() && !list && !check && !b.quarantineDue(now) {
		return nil
	}
	if b.noVIP != nil && b.opts.CheckPeriod > 0 && now.Sub(b.lastList) >= b.opts.CheckPeriod {
		list = true // look for the Calico endpoint again
	}
	if check && !list {
		b.lastCheck = now
		gone, err := b.checkRecord()
		if err != nil {
			b.needList = true
			return err
		}
		if gone != "" {
			klog.InfoS("Objects kproxy programmed are gone from HNS; listing and repairing", "family", b.opts.Family, "gone", gone)
			list = true
		}
	}
	err := b.sync(ctx, snap, list)
	b.needList = err != nil
	return err
}

// checkRecord lists the load balancers and the network's endpoints and
// reports the first recorded object HNS no longer has ("" when none). It
// compares IDs only.
func (b *Backend) checkRecord() (string, error) {
	lbs, err := b.hns.ListLoadBalancers()
	if err != nil {
		return "", fmt.Errorf("checking HNS load balancers: %w", err)
	}
	ids := make(map[string]bool, len(lbs))
	for i := range lbs {
		ids[strings.ToLower(lbs[i].ID)] = true
	}
	for _, slot := range sortedSlots(b.rec.LoadBalancers) {
		if lb := b.rec.LoadBalancers[slot]; !ids[strings.ToLower(lb.ID)] {
			return "load balancer " + slot + " (" + lb.ID + ")", nil
		}
	}
	eps, err := b.hns.ListEndpoints(b.rec.NetworkID)
	if IsNotFound(err) {
		return "network " + b.rec.NetworkID, nil
	}
	if err != nil {
		return "", fmt.Errorf("checking endpoints of HNS network %q: %w", b.network.Name, err)
	}
	clear(ids)
	for i := range eps {
		ids[strings.ToLower(eps[i].ID)] = true
	}
	for ip, ep := range b.rec.Endpoints {
		if !ids[ep.ID] {
			return "endpoint " + ip.String() + " (" + ep.ID + ")", nil
		}
	}
	return "", nil
}

func (b *Backend) sync(ctx context.Context, snap *proxy.Snapshot, list bool) error {
	if list {
		if err := b.list(); err != nil {
			return err
		}
	}
	if b.network.IsOverlay() && !b.opts.SourceVIP.IsValid() && !b.sourceVIP.IsValid() {
		ip, from, err := findSourceVIP(&b.opts, b.network.Name, b.rec, snap.Node.PodCIDRs)
		if err != nil {
			b.withoutSourceVIP(snap, err)
			return nil
		}
		klog.InfoS("Source VIP found", "family", b.opts.Family, "network", b.network.Name, "sourceVIP", ip, "from", from)
		b.sourceVIP = ip
		if b.noVIP != nil {
			b.noVIP = nil
			b.publishQuarantine()
		}
	}
	var rejected []rejection
	for pass := 1; ; pass++ {
		facts := b.facts(snap)
		full := BuildPlanCached(facts, snap.Family(b.opts.Family), b.plans)
		if full.Err != nil {
			return fmt.Errorf("planning %s HNS load balancers on network %q: %w", b.opts.Family, b.network.Name, full.Err)
		}
		if pass == 1 && !list && b.needsRoutes(full, facts) {
			// A remote address outside every known subnet: a new node's
			// subnet may have been added since the listing.
			n, err := b.hns.GetNetwork(b.network.Name)
			if err != nil {
				return fmt.Errorf("reading HNS network %q for new remote subnets: %w", b.network.Name, err)
			}
			if !strings.EqualFold(n.ID, b.network.ID) {
				if err := b.list(); err != nil { // recreated
					return err
				}
			} else {
				b.network.RemoteSubnets = n.RemoteSubnets
			}
			continue
		}
		b.report(full.Warnings)
		now := b.clock.Now()
		plan := holdQuarantined(full, b.rec, b.quar, now)
		r := Reconcile(plan, b.rec, b.caps.ModifyLoadBalancer)
		if !list && b.recheckMissing(r.MissingLocal) {
			// A local endpoint the CNI may have created since the last listing.
			if err := b.refreshEndpoints(); err != nil {
				return err
			}
			b.lastRecheck = b.clock.Now()
			r = Reconcile(plan, b.rec, b.caps.ModifyLoadBalancer)
		}
		b.missingLocal = make(map[netip.Addr]bool, len(r.MissingLocal))
		for _, ip := range r.MissingLocal {
			b.missingLocal[ip] = true
		}
		if len(r.MissingLocal) > 0 {
			klog.V(2).InfoS("Local endpoints not in HNS yet, left out of load balancers", "family", b.opts.Family, "addresses", r.MissingLocal)
		}
		if r.Empty() {
			klog.V(4).InfoS("HNS already matches", "family", b.opts.Family, "loadBalancers", len(plan.LoadBalancers))
			b.updateQuarantine(full, rejected, now)
			return nil
		}
		klog.V(2).InfoS("Programming HNS", "family", b.opts.Family, "operations", len(r.Ops), "loadBalancers", len(plan.LoadBalancers), "endpoints", len(plan.Endpoints))
		res := b.apply(ctx, r)
		rejected = append(rejected, res.rejected...)
		if res.stale && !res.transient && pass == 1 {
			// HNS holds something the record does not: list again and adopt.
			klog.V(2).InfoS("HNS differs from the record; listing again", "family", b.opts.Family)
			if err := b.list(); err != nil {
				return errors.Join(res.err, err)
			}
			continue
		}
		if res.err == nil || (!res.transient && !res.stale) {
			// Every operation was tried: what HNS rejected is isolated.
			b.updateQuarantine(full, rejected, now)
		}
		return res.err
	}
}

// list reads the network, the endpoints and the load balancers, and replaces
// the record. The HNS version is asked once.
func (b *Backend) list() error {
	if b.caps == nil {
		v, err := b.hns.Version()
		if err != nil {
			return fmt.Errorf("asking HNS for its version: %w", err)
		}
		caps := CapabilitiesFor(v)
		b.caps = &caps
		klog.InfoS("HNS capabilities", "version", v.String(), "dsr", caps.DSR, "sessionAffinity", caps.SessionAffinity,
			"ipv6", caps.IPv6, "modifyLoadBalancer", caps.ModifyLoadBalancer)
		if b.opts.EnableDSR && !caps.DSR {
			klog.InfoS("DSR is enabled but this HNS does not support it; load balancers are programmed without DSR", "version", v.String())
		}
	}
	o, err := b.read()
	if err != nil {
		return err
	}
	n := o.network
	if b.network != nil && !strings.EqualFold(b.network.ID, n.ID) {
		klog.InfoS("HNS network was recreated; reprogramming everything", "network", n.Name, "oldID", b.network.ID, "newID", n.ID)
	}
	if b.network != nil && !strings.EqualFold(b.network.ID, n.ID) {
		b.sourceVIP = netip.Addr{} // found again on the new network
	}
	if (b.network == nil || b.network.Type != n.Type) && !n.IsOverlay() && b.opts.SourceVIP.IsValid() {
		klog.InfoS("Source VIP is only used on overlay networks; ignoring it", "network", n.Name, "type", n.Type, "sourceVIP", b.opts.SourceVIP)
	}
	b.network, b.rec, b.ifaces = n, o.rec, o.ifaces
	b.lastList = b.clock.Now()
	b.lastRecheck, b.lastCheck = b.lastList, b.lastList
	b.routeChecked = nil
	klog.V(2).InfoS("Listed HNS", "family", b.opts.Family, "network", n.Name, "networkID", n.ID, "type", n.Type,
		"endpoints", len(b.rec.Endpoints), "loadBalancers", len(b.rec.LoadBalancers), "orphans", len(b.rec.Orphans))
	return nil
}

// observed is one full reading of HNS (and of the host's interfaces).
type observed struct {
	network *Network
	rec     *State
	ifaces  []HostInterface
}

// read lists the network, its endpoints and the load balancers, without
// changing the backend.
func (b *Backend) read() (*observed, error) {
	if b.netName == "" {
		name, err := b.findNetwork()
		if err != nil {
			return nil, err
		}
		klog.InfoS("HNS network found", "network", name, "why", "no network name configured and it is the only L2Bridge or Overlay network")
		b.netName = name
	}
	n, err := b.hns.GetNetwork(b.netName)
	if err != nil {
		if IsNotFound(err) {
			return nil, fmt.Errorf("waiting for HNS network %q (created by the CNI): %w", b.netName, err)
		}
		return nil, fmt.Errorf("getting HNS network %q: %w", b.netName, err)
	}
	eps, err := b.hns.ListEndpoints(n.ID)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints of HNS network %q: %w", n.Name, err)
	}
	lbs, err := b.hns.ListLoadBalancers()
	if err != nil {
		return nil, fmt.Errorf("listing HNS load balancers: %w", err)
	}
	o := &observed{network: n, rec: Observe(b.opts.Family, n.ID, eps, lbs)}
	if ifaces, err := b.opts.Interfaces(); err == nil {
		o.ifaces = ifaces
	} else {
		klog.V(2).InfoS("Cannot list host interfaces; node IP and MAC from the Node object only", "err", err)
	}
	return o, nil
}

// needsRoutes reports whether the plan has a remote endpoint that is not in
// HNS yet and whose address no remote subnet holds (it would get this
// node's provider address), and that was not looked up since the last
// listing; it marks those addresses looked up.
func (b *Backend) needsRoutes(plan *Plan, f *Facts) bool {
	if !f.Network.IsOverlay() {
		return false
	}
	found := false
	for _, e := range plan.Endpoints {
		if e.Role != RoleRemote || e.ProviderAddress != f.NodeIP || b.rec.Endpoints[e.IP] != nil || b.routeChecked[e.IP] {
			continue
		}
		if b.routeChecked == nil {
			b.routeChecked = make(map[netip.Addr]bool)
		}
		b.routeChecked[e.IP] = true
		found = true
	}
	return found
}

// ErrNoNetwork is returned (wrapped) when no network name is configured and
// the host has no single L2Bridge or Overlay network to use.
var ErrNoNetwork = errors.New("no HNS network to use")

// findNetwork returns the name of the host's only L2Bridge or Overlay network.
func (b *Backend) findNetwork() (string, error) {
	ns, err := b.hns.ListNetworks()
	if err != nil {
		return "", fmt.Errorf("listing HNS networks to find the one to use: %w", err)
	}
	return pickNetwork(ns)
}

// pickNetwork returns the name of the only L2Bridge or Overlay network.
func pickNetwork(ns []Network) (string, error) {
	var usable, all []string
	for _, n := range ns {
		all = append(all, fmt.Sprintf("%q (%s)", n.Name, n.Type))
		if n.IsOverlay() || strings.EqualFold(n.Type, NetworkTypeL2Bridge) {
			usable = append(usable, n.Name)
		}
	}
	sort.Strings(usable)
	sort.Strings(all)
	found := "none"
	if len(all) > 0 {
		found = strings.Join(all, ", ")
	}
	switch len(usable) {
	case 1:
		return usable[0], nil
	case 0:
		return "", fmt.Errorf("%w: no network name configured (--network-name, winkernel.networkName or %s) and no L2Bridge or Overlay network on the host yet (networks: %s)",
			ErrNoNetwork, EnvNetworkName, found)
	}
	return "", fmt.Errorf("%w: no network name configured (--network-name, winkernel.networkName or %s) and %d L2Bridge or Overlay networks on the host: set one of %s (networks: %s)",
		ErrNoNetwork, EnvNetworkName, len(usable), strings.Join(usable, ", "), found)
}

// refreshEndpoints lists the network's endpoints and adds those the record
// lacks (local endpoints created by the CNI since the last listing).
func (b *Backend) refreshEndpoints() error {
	eps, err := b.hns.ListEndpoints(b.rec.NetworkID)
	if err != nil {
		return fmt.Errorf("listing endpoints of HNS network %q: %w", b.network.Name, err)
	}
	fresh := Observe(b.opts.Family, b.rec.NetworkID, eps, nil)
	for ip, ep := range fresh.Endpoints {
		if old := b.rec.Endpoints[ip]; old == nil || (old.Remote && !ep.Remote) {
			b.rec.setEndpoint(ep)
		}
	}
	return nil
}

// missingRecheck is how often, at most, a sync lists the endpoints again
// because local endpoints it needs are still missing.
const missingRecheck = time.Minute

// recheckMissing reports whether missing local endpoints justify listing the
// network's endpoints again: when an address is newly missing, or when some
// are still missing a while after the last look. A host-network endpoint on
// this node (the node's own address) is missing for good; it costs at most
// one listing a minute, and only in syncs that happen anyway.
func (b *Backend) recheckMissing(ips []netip.Addr) bool {
	if len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !b.missingLocal[ip] {
			return true
		}
	}
	return b.clock.Since(b.lastRecheck) >= missingRecheck
}

// facts gathers the node facts for a plan from the backend's record.
func (b *Backend) facts(snap *proxy.Snapshot) *Facts {
	var caps Capabilities
	if b.caps != nil {
		caps = *b.caps
	}
	f := gatherFacts(&b.opts, caps, b.network, b.ifaces, b.rec, snap)
	if !f.SourceVIP.IsValid() {
		f.SourceVIP = b.sourceVIP
	}
	return f
}

// withoutSourceVIP leaves every service port of the family out while an
// overlay network has no source VIP: the sync succeeds (the node stays
// healthy and is not restarted in a loop), each Service gets a warning, and
// the ports are reported as quarantined. What HNS already holds stays. The
// backend looks again at every check period and every change.
func (b *Backend) withoutSourceVIP(snap *proxy.Snapshot, err error) {
	now := b.clock.Now()
	if b.noVIP == nil {
		klog.ErrorS(err, "No source VIP on the overlay network: no Service is programmed until one is found",
			"family", b.opts.Family, "network", b.network.Name)
	}
	var ports []proxy.QuarantinedPort
	var ws []Warning
	seen := make(map[warnKey]bool)
	if view := snap.Family(b.opts.Family); view != nil {
		for _, sp := range view.Sorted() {
			since := now
			for _, old := range b.noVIP {
				if old.Name == sp.Name {
					since = old.Since
				}
			}
			ports = append(ports, proxy.QuarantinedPort{Name: sp.Name, Family: b.opts.Family, Reason: err.Error(), Since: since, Retry: now.Add(b.opts.CheckPeriod)})
			if k := (warnKey{sp.Name.NamespacedName, ReasonNoSourceVIP}); !seen[k] {
				seen[k] = true
				ws = append(ws, Warning{Service: k.svc, Reason: ReasonNoSourceVIP, Message: err.Error()})
			}
		}
	}
	if ports == nil {
		ports = []proxy.QuarantinedPort{}
	}
	b.noVIP = ports
	b.report(ws)
	b.publishQuarantine()
}

// gatherFacts derives the node facts from the options, what HNS said and the snapshot.
func gatherFacts(opts *Options, caps Capabilities, network *Network, ifaces []HostInterface, rec *State, snap *proxy.Snapshot) *Facts {
	f := &Facts{
		Family:                opts.Family,
		SourceVIP:             opts.SourceVIP,
		EnableDSR:             opts.EnableDSR,
		Caps:                  caps,
		ForwardHealthCheckVIP: opts.ForwardHealthCheckVIP,
		HealthzPort:           uint16(opts.HealthzPort),
	}
	if network != nil {
		f.Network = *network
	}
	f.NodeIP = nodeIP(opts, ifaces, snap)
	f.HostMAC = opts.HostMAC
	if f.HostMAC == "" && f.NodeIP.IsValid() {
		f.HostMAC = macOf(ifaces, f.NodeIP)
	}
	if rec != nil && opts.ForwardHealthCheckVIP {
		f.RootEndpointIP = rootEndpointIP(rec, opts.RootHNSEndpointName)
	}
	return f
}

// nodeIP is Options.NodeIP, else the Node's first address of the family held
// by a host interface, else its first address of the family.
func nodeIP(opts *Options, ifaces []HostInterface, snap *proxy.Snapshot) netip.Addr {
	v6 := opts.Family == v1.IPv6Protocol
	if ip := opts.NodeIP.Unmap(); ip.IsValid() && ip.Is6() == v6 {
		return ip
	}
	var first netip.Addr
	for _, a := range snap.Node.Addresses {
		a = a.Unmap()
		if !a.IsValid() || a.Is6() != v6 {
			continue
		}
		if hasAddr(ifaces, a) {
			return a
		}
		if !first.IsValid() {
			first = a
		}
	}
	return first
}

func hasAddr(ifaces []HostInterface, ip netip.Addr) bool {
	for _, i := range ifaces {
		for _, a := range i.Addrs {
			if a == ip {
				return true
			}
		}
	}
	return false
}

func macOf(ifaces []HostInterface, ip netip.Addr) string {
	for _, i := range ifaces {
		for _, a := range i.Addrs {
			if a == ip {
				return i.MAC
			}
		}
	}
	return ""
}

func rootEndpointIP(st *State, name string) netip.Addr {
	var found []netip.Addr
	for ip, ep := range st.Endpoints {
		if !ep.Remote && strings.EqualFold(ep.Name, name) {
			found = append(found, ip)
		}
	}
	if len(found) == 0 {
		return netip.Addr{}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Less(found[j]) })
	return found[0]
}

// hostInterfaces lists the host's interfaces with package net.
func hostInterfaces() ([]HostInterface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []HostInterface
	for _, i := range ifs {
		hi := HostInterface{Name: i.Name, MAC: strings.ReplaceAll(i.HardwareAddr.String(), ":", "-")}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					hi.Addrs = append(hi.Addrs, ip.Unmap())
				}
			}
		}
		out = append(out, hi)
	}
	return out, nil
}

// report logs and forwards each new (Service, reason) warning once, and
// forgets the ones that no longer apply so they are reported again if they
// come back.
func (b *Backend) report(ws []Warning) {
	current := make(map[warnKey]bool, len(ws))
	for _, w := range ws {
		k := warnKey{w.Service, w.Reason}
		current[k] = true
		if b.warned[k] {
			continue
		}
		b.warned[k] = true
		klog.InfoS("Service not fully supported by HNS", "service", w.Service, "family", b.opts.Family, "reason", w.Reason, "message", w.Message)
		if b.opts.Warn != nil {
			b.opts.Warn(w.Service, w.Reason, w.Message)
		}
	}
	for k := range b.warned {
		if !current[k] {
			delete(b.warned, k)
		}
	}
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
	if err := b.list(); err != nil {
		b.needList = true
		if !IsNotFound(err) && !errors.Is(err, ErrNoNetwork) {
			return fmt.Errorf("cleanup: %w", err)
		}
		// The network is gone (its endpoints with it): delete the family's
		// load balancers all the same, as upstream does.
		klog.InfoS("No HNS network; removing every load balancer of the family", "family", b.opts.Family, "reason", err)
		return b.cleanupLoadBalancers()
	}
	r := Reconcile(&Plan{Family: b.opts.Family}, b.rec, false)
	klog.InfoS("Removing kproxy's HNS objects", "family", b.opts.Family, "operations", len(r.Ops))
	res := b.apply(ctx, r)
	b.needList = true // the next sync starts from a listing
	if err := res.joined(); err != nil {
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
		if (lbs[i].Flags&LBFlagIPv6 != 0) != (b.opts.Family == v1.IPv6Protocol) {
			continue
		}
		if err := b.hns.DeleteLoadBalancer(lbs[i].ID); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting load balancer %s: %w", lbs[i].ID, err))
			continue
		}
		n++
	}
	klog.InfoS("Removed HNS load balancers", "family", b.opts.Family, "count", n)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}
