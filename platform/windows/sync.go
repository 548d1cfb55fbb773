package windows

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

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

// start is when the sync began: the periods (check, resync) are counted
// from it, as the runner counts its intervals from the start of a run.
func (b *Backend) sync(ctx context.Context, snap *proxy.Snapshot, list bool, start time.Time) error {
	if list {
		if err := b.list(start); err != nil {
			return err
		}
	}
	if b.opts.Family == v1.IPv6Protocol && (b.network.IsOverlay() || !b.caps.IPv6) {
		// Single-stack, as upstream: overlay networks carry one family, and
		// HNS before 11.10 has no IPv6 load balancers.
		if !b.idleLogged {
			b.idleLogged = true
			b.log.Info("IPv6 Services are not programmed: this node is single-stack for kproxy",
				"network", b.network.Name, "overlay", b.network.IsOverlay(), "hnsSupportsIPv6", b.caps.IPv6)
		}
		return nil
	}
	if b.network.IsOverlay() && !b.opts.SourceVIP.IsValid() && !b.sourceVIP.IsValid() {
		ip, from, err := findSourceVIP(&b.opts, b.network.Name, b.rec, snap.Node.PodCIDRs)
		if err != nil {
			b.withoutSourceVIP(snap, err)
			return nil
		}
		b.log.Info("Source VIP found", "family", b.opts.Family, "network", b.network.Name, "sourceVIP", ip, "from", from)
		b.sourceVIP = ip
		if b.noVIP != nil {
			b.noVIP = nil
			b.publishQuarantine()
		}
	}
	var rejected []rejection
	routesRead := false
	for pass := 1; ; pass++ {
		facts := b.facts(snap)
		full := BuildPlanCached(facts, snap.Family(b.opts.Family), b.plans)
		if full.Err != nil {
			return fmt.Errorf("planning %s HNS load balancers on network %q: %w", b.opts.Family, b.network.Name, full.Err)
		}
		if !routesRead && !list && b.needsRoutes(full, facts) {
			// A remote address outside every known subnet: a new node's
			// subnet may have been added since the listing.
			n, err := b.hns.GetNetwork(b.network.Name)
			if err != nil {
				return fmt.Errorf("reading HNS network %q for new remote subnets: %w", b.network.Name, err)
			}
			if !strings.EqualFold(n.ID, b.network.ID) {
				if err := b.list(start); err != nil { // recreated
					return err
				}
			} else {
				b.network.RemoteSubnets = n.RemoteSubnets
			}
			routesRead = true
			pass-- // plan again; this pass made no change to HNS
			continue
		}
		if b.unadopted {
			// What HNS left out of the listing and kproxy has no record of
			// (after a restart): unknown, so adopted as planned (echo.go).
			b.adoptListed(full)
			b.unadopted = false
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
			b.log.V(2).Info("Local endpoints not in HNS yet, left out of load balancers", "family", b.opts.Family, "addresses", r.MissingLocal)
		}
		if r.Empty() {
			b.log.V(4).Info("HNS already matches", "family", b.opts.Family, "loadBalancers", len(plan.LoadBalancers))
			b.updateQuarantine(full, rejected, now)
			return nil
		}
		b.log.V(2).Info("Programming HNS", "family", b.opts.Family, "operations", len(r.Ops), "loadBalancers", len(plan.LoadBalancers), "endpoints", len(plan.Endpoints))
		res := b.apply(ctx, r)
		rejected = append(rejected, res.rejected...)
		if res.stale && !res.transient && pass == 1 {
			// HNS holds something the record does not: list again and adopt.
			b.log.V(2).Info("HNS differs from the record; listing again", "family", b.opts.Family)
			if err := b.list(start); err != nil {
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
// the record. The HNS version is asked once. The listing counts as made at
// start (when the sync began, not when the listing returned): the runner
// counts its intervals from the start of a run, so a period stamped after
// slow HNS calls would make the next check wait a whole extra interval.
func (b *Backend) list(start time.Time) error {
	if b.caps == nil {
		v, err := b.hns.Version()
		if err != nil {
			return fmt.Errorf("asking HNS for its version: %w", err)
		}
		caps := CapabilitiesFor(v)
		b.caps = &caps
		b.log.Info("HNS capabilities", "version", v.String(), "dsr", caps.DSR, "sessionAffinity", caps.SessionAffinity,
			"ipv6", caps.IPv6, "modifyLoadBalancer", caps.ModifyLoadBalancer)
		if b.opts.EnableDSR && !caps.DSR {
			b.log.Info("DSR is enabled but this HNS does not support it; load balancers are programmed without DSR", "version", v.String())
		}
	}
	o, err := b.read()
	if err != nil {
		return err
	}
	n := o.network
	if b.network != nil && !strings.EqualFold(b.network.ID, n.ID) {
		b.log.Info("HNS network was recreated; reprogramming everything", "network", n.Name, "oldID", b.network.ID, "newID", n.ID)
	}
	if b.network != nil && !strings.EqualFold(b.network.ID, n.ID) {
		b.sourceVIP = netip.Addr{} // found again on the new network
	}
	if (b.network == nil || b.network.Type != n.Type) && !n.IsOverlay() && b.opts.SourceVIP.IsValid() {
		b.log.Info("Source VIP is only used on overlay networks; ignoring it", "network", n.Name, "type", n.Type, "sourceVIP", b.opts.SourceVIP)
	}
	b.echoed |= o.evidence
	b.adoptSent(o.rec, true)
	b.network, b.rec, b.ifaces = n, o.rec, o.ifaces
	b.unadopted = true
	b.lastList = start
	b.lastRecheck, b.lastCheck = start, start
	b.routeChecked = nil
	b.log.V(2).Info("Listed HNS", "family", b.opts.Family, "network", n.Name, "networkID", n.ID, "type", n.Type,
		"endpoints", len(b.rec.Endpoints), "loadBalancers", len(b.rec.LoadBalancers), "orphans", len(b.rec.Orphans))
	return nil
}

// observed is one full reading of HNS (and of the host's interfaces).
type observed struct {
	network *Network
	rec     *State
	ifaces  []HostInterface
	// evidence are the fields the listing shows HNS returns (echo.go).
	evidence EchoDrops
}

// read lists the network, its endpoints and the load balancers, without
// changing the backend.
func (b *Backend) read() (*observed, error) {
	if b.netName == "" {
		name, err := b.findNetwork()
		if err != nil {
			return nil, err
		}
		b.log.Info("HNS network found", "network", name, "why", "no network name configured and it is the only L2Bridge or Overlay network")
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
	o := &observed{network: n, rec: Observe(b.opts.Family, n.ID, eps, lbs), evidence: echoEvidence(eps, lbs)}
	if ifaces, err := b.opts.Interfaces(); err == nil {
		o.ifaces = ifaces
	} else {
		b.log.V(2).Info("Cannot list host interfaces; node IP and MAC from the Node object only", "err", err)
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
	b.echoed |= echoEvidence(eps, nil)
	b.adoptSent(fresh, false)
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

// withoutSourceVIP leaves every service port of the family out while an
// overlay network has no source VIP: the sync succeeds (the node stays
// healthy and is not restarted in a loop), each Service gets a warning, and
// the ports are reported as quarantined. What HNS already holds stays. The
// backend looks again at every check period and every change.
func (b *Backend) withoutSourceVIP(snap *proxy.Snapshot, err error) {
	now := b.clock.Now()
	if b.noVIP == nil {
		b.log.Error(err, "No source VIP on the overlay network: no Service is programmed until one is found",
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
