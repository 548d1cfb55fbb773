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

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// The sync protocol (Backend.sync), one family:
//
//	observe   list HNS (first sync, resync period, after a failure, when a
//	          check finds something gone) or work from the record
//	facts     options + Node + network + interfaces (+ found source VIP)
//	plan      plan.Build(facts, view, last plan)                      pure
//	adopt     reconcile.Adopt(listing, record, plan), after a listing pure
//	hold      reconcile.Hold(plan, state, quarantined)                pure
//	render    reconcile.Reconcile(held plan, state)                   pure
//	apply     Applier.Apply(ops, record) → next record          HNS calls
//	commit    record = next; conflicts: list once and go again (the
//	          second time they are isolated); quarantine; warnings
//
// Nothing is recorded before the calls that made it true succeeded, and
// warnings are published after apply.

func sortedAddrs(m map[netip.Addr]*reconcile.ObservedEndpoint) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for ip := range m {
		out = append(out, ip)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// listing is one full reading of HNS, not yet adopted.
type listing struct {
	state *reconcile.State
	// evidence are the fields the listing shows HNS returns (echo).
	evidence hns.Fields
}

// sync runs one sync. start is when it began: the periods (check, resync)
// are counted from it, as the runner counts its intervals from the start of
// a run. check is set when the check period is due.
func (b *Backend) sync(ctx context.Context, v *intent.View, list, check bool, start time.Time) error {
	var fresh *listing
	if list {
		l, err := b.list(start)
		if err != nil {
			return err
		}
		fresh = l
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
	if !list && b.network.IsOverlay() && (check || b.fallbackPA) {
		// A new node's route, or a node's new provider address, changes the
		// provider address of the remote endpoints that depend on it: read
		// the network at each check, and at every sync while some remote
		// endpoint has none but this node's.
		n, recreated, err := b.r.readRoutes(b.network)
		if err != nil {
			return err
		}
		b.network = n
		if recreated {
			if fresh, err = b.list(start); err != nil {
				return err
			}
			list = true
		}
	}
	if b.network.IsOverlay() && !b.opts.SourceVIP.IsValid() && !b.sourceVIP.IsValid() {
		st := b.recordState(fresh)
		ip, from, err := FindSourceVIP(&b.opts, b.r.ipamStore(b.network.Name), st, v.Node.PodCIDRs)
		if err != nil {
			b.withoutSourceVIP(v, err)
			return nil
		}
		b.log.Info("Source VIP found", "family", b.opts.Family, "network", b.network.Name, "sourceVIP", ip, "from", from)
		b.sourceVIP = ip
		if b.q.noVIP != nil {
			b.q.noVIP = nil
			b.q.publish()
		}
	}
	var refused []reconcile.Rejection
	routesRead := false
	for pass := 1; ; pass++ {
		facts := b.facts(v.Node, fresh)
		p := plan.Build(facts, v, b.plan)
		if p.Err != nil {
			return fmt.Errorf("planning %s HNS load balancers on network %q: %w", b.opts.Family, b.network.Name, p.Err)
		}
		if !routesRead && !list && b.needsRoutes(p, facts) {
			// A remote address outside every known subnet: a new node's
			// subnet may have been added since the listing.
			routesRead = true
			n, recreated, err := b.r.readRoutes(b.network)
			if err != nil {
				return err
			}
			b.network = n
			if recreated {
				if fresh, err = b.list(start); err != nil {
					return err
				}
				list = true
			}
			pass-- // plan again; this pass made no change to HNS
			continue
		}
		base := b.rec
		if fresh != nil {
			ad := reconcile.Adopt(fresh.state, fresh.evidence, b.rec, p)
			base = ad.Record
			b.logLearned(ad.Learned, "listing")
		}
		now := b.clock.Now()
		heldLB, heldEP := b.q.held(p, now)
		held := reconcile.Hold(p, base.State, heldLB, heldEP)
		modify := b.caps.ModifyLoadBalancer
		r := reconcile.Reconcile(held, base.State, modify)
		if fresh == nil && b.recheckMissing(r.MissingLocal) {
			// A local endpoint the CNI may have created since the last listing.
			nb, err := b.r.refreshEndpoints(base, b.network.Name)
			if err != nil {
				return err
			}
			base = nb
			b.lastRecheck = b.clock.Now()
			r = reconcile.Reconcile(held, base.State, modify)
		}
		b.missingLocal = make(map[netip.Addr]bool, len(r.MissingLocal))
		for _, ip := range r.MissingLocal {
			b.missingLocal[ip] = true
		}
		if len(r.MissingLocal) > 0 {
			b.log.V(2).Info("Local endpoints not in HNS yet, left out of load balancers", "family", b.opts.Family, "addresses", r.MissingLocal)
		}
		if r.Empty() {
			b.log.V(4).Info("HNS already matches", "family", b.opts.Family, "loadBalancers", len(held.LoadBalancers))
		} else {
			b.log.V(2).Info("Programming HNS", "family", b.opts.Family, "operations", len(r.Ops), "loadBalancers", len(held.LoadBalancers), "endpoints", len(held.Endpoints))
		}
		ap := reconcile.Applier{HNS: b.hns, Log: b.log, Family: b.opts.Family, Modify: modify}
		next, res := ap.Apply(ctx, r, base)
		b.commit(next, p, facts)
		if res.ModifyUnsupported {
			b.caps.ModifyLoadBalancer = false
		}
		b.logLearned(res.Learned, "answer")
		refused = append(refused, res.Rejected...)
		if len(res.Conflicts) > 0 && !res.Transient && pass == 1 {
			// HNS holds something the record does not (or lacks what it
			// holds): list again, adopt, and try once more; what is refused
			// again is isolated.
			b.log.V(2).Info("HNS differs from the record; listing again", "family", b.opts.Family, "conflicts", len(res.Conflicts))
			l, err := b.list(start)
			if err != nil {
				return errors.Join(res.Err, err)
			}
			fresh = l
			continue
		}
		refused = append(refused, res.Conflicts...)
		if !res.Transient {
			// Every operation was tried: what HNS refused is isolated.
			b.q.update(p, refused, now)
		}
		b.report(p.Warnings)
		return res.Err
	}
}

// commit makes next the record, after the calls that made it true.
func (b *Backend) commit(next *reconcile.Record, p *plan.Plan, f *plan.Facts) {
	b.rec = next
	b.plan = p
	b.fallbackPA = false
	if f.Network.IsOverlay() {
		for _, e := range p.Endpoints {
			if e.Role == plan.RoleRemote && e.ProviderAddress == f.NodeIP && e.IP != f.NodeIP {
				b.fallbackPA = true
				break
			}
		}
	}
	b.echoes.save(b.rec.Echo)
}

func (b *Backend) logLearned(f hns.Fields, from string) {
	if f != 0 {
		b.log.Info("HNS returns fields changed; their echo is learned and compared against from now on",
			"family", b.opts.Family, "fields", f.String(), "from", from, "build", b.rec.Echo.Build)
	}
}

// recordState is the state to look in for the network's endpoints: the
// fresh listing's, else the record's.
func (b *Backend) recordState(fresh *listing) *reconcile.State {
	if fresh != nil {
		return fresh.state
	}
	if b.rec != nil {
		return b.rec.State
	}
	return nil
}

// list reads the network, the endpoints and the load balancers; the caller
// adopts the listing. The HNS version is asked once. The listing counts as
// made at start (when the sync began, not when the listing returned): the
// runner counts its intervals from the start of a run, so a period stamped
// after slow HNS calls would make the next check wait a whole extra
// interval.
func (b *Backend) list(start time.Time) (*listing, error) {
	if b.caps == nil {
		v, err := b.hns.Version()
		if err != nil {
			return nil, fmt.Errorf("asking HNS for its version: %w", err)
		}
		caps := hns.CapabilitiesFor(v)
		b.caps = &caps
		b.build = v.String()
		if b.opts.WindowsBuild != "" {
			b.build = b.opts.WindowsBuild + "/HNS " + v.String()
		}
		b.log.Info("HNS capabilities", "version", v.String(), "dsr", caps.DSR, "sessionAffinity", caps.SessionAffinity,
			"ipv6", caps.IPv6, "modifyLoadBalancer", caps.ModifyLoadBalancer)
		if b.opts.EnableDSR && !caps.DSR {
			b.log.Info("DSR is enabled but this HNS does not support it; load balancers are programmed without DSR", "version", v.String())
		}
	}
	o, err := b.r.read()
	if err != nil {
		return nil, err
	}
	n := o.network
	if b.network != nil && !strings.EqualFold(b.network.ID, n.ID) {
		b.log.Info("HNS network was recreated; reprogramming everything", "network", n.Name, "oldID", b.network.ID, "newID", n.ID)
		b.sourceVIP = netip.Addr{} // found again on the new network
	}
	if (b.network == nil || b.network.Type != n.Type) && !n.IsOverlay() && b.opts.SourceVIP.IsValid() {
		b.log.Info("Source VIP is only used on overlay networks; ignoring it", "network", n.Name, "type", n.Type, "sourceVIP", b.opts.SourceVIP)
	}
	if b.rec == nil || !strings.EqualFold(b.rec.State.NetworkID, n.ID) {
		// The record of another network says nothing of this one.
		rec := reconcile.NewRecord(reconcile.NewState(n.ID))
		if b.rec != nil {
			rec.Echo = b.rec.Echo
		}
		b.rec = rec
	}
	b.echoes.load(&b.rec.Echo, b.build)
	b.network, b.ifaces = n, o.ifaces
	b.lastList = start
	b.lastRecheck, b.lastCheck = start, start
	b.routeChecked = nil
	b.log.V(2).Info("Listed HNS", "family", b.opts.Family, "network", n.Name, "networkID", n.ID, "type", n.Type,
		"endpoints", len(o.state.Endpoints), "loadBalancers", len(o.state.LoadBalancers), "orphans", len(o.state.Orphans))
	return &listing{state: o.state, evidence: o.evidence}, nil
}

// observed is one full reading of HNS (and of the host's interfaces).
type observed struct {
	network *hns.Network
	state   *reconcile.State
	ifaces  []HostInterface
	// evidence are the fields the listing shows HNS returns (echo).
	evidence hns.Fields
}

// needsRoutes reports whether the plan has a remote endpoint that is not in
// HNS yet and whose address no remote subnet holds (it would get this
// node's provider address), and that was not looked up since the last
// listing; it marks those addresses looked up.
func (b *Backend) needsRoutes(p *plan.Plan, f *plan.Facts) bool {
	if !f.Network.IsOverlay() {
		return false
	}
	found := false
	for _, e := range p.Endpoints {
		if e.Role != plan.RoleRemote || e.ProviderAddress != f.NodeIP || b.rec.State.Endpoints[e.IP] != nil || b.routeChecked[e.IP] {
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

// FindNetwork returns the name of the HNS network kproxy uses when none is
// configured (the one the CNI configuration cfg names when HNS has it,
// else the host's only L2Bridge or Overlay network), and why.
func FindNetwork(h hns.HNS, cfg *CNIConfig) (string, string, error) {
	ns, err := h.ListNetworks()
	if err != nil {
		return "", "", fmt.Errorf("listing HNS networks to find the one to use: %w", err)
	}
	return pickNetwork(ns, cfg)
}

// pickNetwork returns the network the CNI configuration names when HNS has
// it, else the only L2Bridge or Overlay network.
func pickNetwork(ns []hns.Network, cfg *CNIConfig) (string, string, error) {
	var usable, all []string
	for _, n := range ns {
		if cfg != nil && strings.EqualFold(n.Name, cfg.Name) {
			return n.Name, "named by the CNI configuration " + cfg.File, nil
		}
		all = append(all, fmt.Sprintf("%q (%s)", n.Name, n.Type))
		if n.IsOverlay() || strings.EqualFold(n.Type, hns.NetworkTypeL2Bridge) {
			usable = append(usable, n.Name)
		}
	}
	sort.Strings(usable)
	sort.Strings(all)
	found := "none"
	if len(all) > 0 {
		found = strings.Join(all, ", ")
	}
	cni := ""
	if cfg != nil {
		cni = fmt.Sprintf(", the CNI configuration %s names %q", cfg.File, cfg.Name)
	}
	switch len(usable) {
	case 1:
		return usable[0], "no network name configured and it is the only L2Bridge or Overlay network", nil
	case 0:
		return "", "", fmt.Errorf("%w: no network name configured (--network-name, winkernel.networkName or %s)%s and no L2Bridge or Overlay network on the host yet (networks: %s)",
			ErrNoNetwork, EnvNetworkName, cni, found)
	}
	return "", "", fmt.Errorf("%w: no network name configured (--network-name, winkernel.networkName or %s)%s and %d L2Bridge or Overlay networks on the host: set one of %s (networks: %s)",
		ErrNoNetwork, EnvNetworkName, cni, len(usable), strings.Join(usable, ", "), found)
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
func (b *Backend) withoutSourceVIP(v *intent.View, err error) {
	now := b.clock.Now()
	if b.q.noVIP == nil {
		b.log.Error(err, "No source VIP on the overlay network: no Service is programmed until one is found",
			"family", b.opts.Family, "network", b.network.Name)
	}
	var ports []proxy.QuarantinedPort
	var ws []plan.Warning
	seen := make(map[proxy.ServicePortName]bool)
	warned := make(map[string]bool)
	if v != nil {
		for _, sp := range v.Sorted() {
			since := now
			for _, old := range b.q.noVIP {
				if old.Name == sp.Name {
					since = old.Since
				}
			}
			if seen[sp.Name] {
				continue
			}
			seen[sp.Name] = true
			ports = append(ports, proxy.QuarantinedPort{Name: sp.Name, Family: b.opts.Family, Reason: err.Error(), Since: since, Retry: now.Add(b.opts.CheckPeriod)})
			if k := sp.Name.NamespacedName.String(); !warned[k] {
				warned[k] = true
				ws = append(ws, plan.Warning{Service: sp.Name.NamespacedName, Reason: plan.ReasonNoSourceVIP, Message: err.Error()})
			}
		}
	}
	if ports == nil {
		ports = []proxy.QuarantinedPort{}
	}
	b.q.noVIP = ports
	b.report(ws)
	b.q.publish()
}
