package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/healthcheck"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/logging"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// syncer is one runner step: snapshot, sync every family's backend, and
// once all succeeded acknowledge the snapshot and publish what was
// programmed (metrics, health, health check node ports).
type syncer struct {
	cache    *cache.Cache
	backends Backends
	log      klog.Logger
	clock    clock.PassiveClock
	metrics  *metrics.Metrics
	health   *healthcheck.ProxyHealth
	services *healthcheck.ServiceServers
	reporter *reporter
	// classify names the cause of a backend error (metrics.Classify with
	// the mode's classifier).
	classify func(error) metrics.Cause
	// afterSync, when set, is called after every sync (Deps.AfterSync).
	afterSync func(snap *proxy.Snapshot, err error)
	// started is when kproxy started: older trigger times are not measured.
	started time.Time
	// collect is Deps.CollectAfterFullSync; collections counts them.
	collect     bool
	collections int
	// acked is the last snapshot every backend programmed.
	acked *proxy.Snapshot
	// bind is bindAddress: when specific, this node's primary IP of its
	// family (withBindAddress).
	bind netip.Addr
	// listenIPs, when set, computes the health check node ports' addresses
	// once, before the first ones open (they may depend on the Node).
	listenIPs func(node proxy.Node) []netip.Addr
	// reported are the Unsupported entries reported and still current.
	reported map[unsupportedKey]bool
	// runAfter asks the runner for a sync after a while (the runner's
	// TriggerAfter): when a quarantined service port is due for a retry.
	runAfter func(time.Duration)
	// settings and builders make each family's intent View; localAddrs
	// lists the node's addresses once per sync (local: the last known).
	settings   intent.Settings
	builders   map[v1.IPFamily]*intent.Builder
	localAddrs func() ([]netip.Addr, error)
	local      []netip.Addr
	// stats holds the per-port counts of each family (IPv4, IPv6) of the
	// acknowledged snapshot.
	stats [2]familyStats
}

// maxLoggedPorts bounds how many changed ports one sync logs at -v=2.
const maxLoggedPorts = 50

// run is the runner's function. The runner only uses the error to back off
// and make the next sync full, so it is logged here.
func (s *syncer) run(ctx context.Context, full bool) error {
	snap, err := s.sync(ctx, full)
	if err != nil && ctx.Err() == nil {
		s.log.Error(err, "Sync failed; the next sync is full")
	}
	if s.afterSync != nil {
		s.afterSync(snap, err)
	}
	return err
}

func (s *syncer) sync(ctx context.Context, full bool) (*proxy.Snapshot, error) {
	cached, ch := s.cache.Snapshot()
	ch.Full = ch.Full || full
	if s.collect && (ch.Full || s.acked == nil) {
		defer func() {
			// A collection, and the freed pages back to the OS at
			// once rather than over minutes by the scavenger.
			debug.FreeOSMemory()
			s.collections++
		}()
	}
	s.health.SetNode(cached.Node.Known, cached.Node.Deleting)
	snap := withBindAddress(cached, s.bind)

	start := s.clock.Now()
	s.readLocalAddrs()
	var errs []error
	for _, b := range s.backends {
		if s.acked != nil && !ch.Touches(s.acked.Family(b.Family), snap.Family(b.Family)) {
			// Only the other family's ports changed: this backend is
			// already up to date (and its periodic syncs still run).
			s.health.Updated(b.Family)
			continue
		}
		began := s.clock.Now()
		var err error
		v := s.view(b, snap, ch)
		problems := v.Problems()
		err = b.Backend.Sync(ctx, v)
		took := s.clock.Since(began)
		if err != nil {
			if ctx.Err() == nil {
				s.metrics.SyncFailed(b.Family, s.classify(err))
			}
			errs = append(errs, fmt.Errorf("%s: %w", b.Family, err))
			continue
		}
		s.quarantined(b)
		if r, ok := b.Backend.(proxy.UnsupportedReporter); ok {
			problems = append(problems, r.Unsupported()...)
		}
		s.unsupported(b.Family, problems)
		s.metrics.Synced(b.Family, ch.Full, took)
		s.health.Updated(b.Family)
	}
	if len(errs) > 0 {
		return cached, fmt.Errorf("sync of generation %d (full=%v): %w", snap.Generation, ch.Full, errors.Join(errs...))
	}
	s.cache.Ack(cached)
	s.acked = cached
	// The per-port counts follow the acknowledged snapshot, from the
	// changed ports only.
	touched, all := map[types.NamespacedName]struct{}{}, false
	for i, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t, a := s.stats[i].update(snap.Family(f), ch)
		all = all || a
		maps.Copy(touched, t)
	}
	for _, f := range s.backends.Families() {
		st := &s.stats[familyIndex(f)]
		s.metrics.NoLocalEndpointsCounted(f, st.noLocalInternal, st.noLocalExternal)
		s.metrics.PortsByAlgorithmCounted(f, st.byAlgorithm)
	}
	s.metrics.ChangesProgrammed(ch.ServiceEvents, ch.EndpointEvents)
	for _, f := range s.backends.Families() {
		s.metrics.Programmed(f, triggersSince(ch.TriggerTimes[f], s.started))
	}
	if s.listenIPs != nil {
		s.services.SetIPs(s.listenIPs(snap.Node))
		s.listenIPs = nil
	}
	if all {
		s.services.Update(servicesHealth(&s.stats, nil))
	} else {
		s.services.UpdateSome(slices.Collect(maps.Keys(touched)), servicesHealth(&s.stats, touched))
	}
	s.reporter.forget()
	s.scheduleRetry()

	s.log.V(2).Info("Synced", "generation", snap.Generation, "full", ch.Full, "changedPorts", len(ch.Ports),
		"ipv4Ports", snap.IPv4.Len(), "ipv6Ports", snap.IPv6.Len(), "took", s.clock.Since(start))
	if v := s.log.V(2); v.Enabled() {
		logChanges(s.log, snap, ch)
	}
	return cached, nil
}

// scheduleRetry asks the runner for a sync when the first quarantined
// service port is due for a retry: backends retry only when they sync, and
// without a change the next sync would otherwise be the periodic one.
func (s *syncer) scheduleRetry() {
	if s.runAfter == nil {
		return
	}
	var first time.Time
	for _, b := range s.backends {
		q, ok := b.Backend.(proxy.Quarantiner)
		if !ok {
			continue
		}
		for _, p := range q.Quarantined() {
			if !p.Retry.IsZero() && (first.IsZero() || p.Retry.Before(first)) {
				first = p.Retry
			}
		}
	}
	if !first.IsZero() {
		s.runAfter(first.Sub(s.clock.Now()))
	}
}

// ReasonQuarantined is the reason of the warnings about service ports a
// backend left out because the platform rejected them.
const ReasonQuarantined = "Quarantined"

// quarantined publishes what a backend that isolates rejected service ports
// left out in its last sync: the kproxy_sync_quarantined_service_ports
// gauge, and for each port a warning (log line and Warning Event on its
// Service, once per Service). The sync itself succeeded: everything else is
// programmed, and health stays good.
func (s *syncer) quarantined(b FamilyBackend) {
	q, ok := b.Backend.(proxy.Quarantiner)
	if !ok {
		return
	}
	ports := q.Quarantined()
	s.metrics.Quarantined(b.Family, len(ports))
	for _, p := range ports {
		s.log.V(2).Info("Service port left out of the rules", "servicePort", p.Name.String(), "family", p.Family,
			"since", p.Since, "retry", p.Retry, "reason", p.Reason)
		s.reporter.warn(p.Name.NamespacedName, ReasonQuarantined, fmt.Sprintf(
			"node %s: service port %s (%s) is not programmed: the platform rejected it: %s; kproxy retries it with backoff and programs every other Service",
			s.reporter.nodeName, p.Name, p.Family, p.Reason))
	}
}

// unsupportedKey is one reported Unsupported (per family, Service, reason).
type unsupportedKey struct {
	family v1.IPFamily
	svc    types.NamespacedName
	reason string
}

// unsupported publishes what a family's last sync left out (its View's
// problems and what the backend itself reports), the same way on every
// OS: each (Service, reason) once while it applies — a warning log line
// and a Warning Event on the Service, again if it comes back after going
// away — and the kproxy_unsupported_service_ports gauge by reason.
func (s *syncer) unsupported(family v1.IPFamily, problems []proxy.Unsupported) {
	if s.reported == nil {
		s.reported = map[unsupportedKey]bool{}
	}
	counts := map[string]int{}
	cur := map[unsupportedKey]bool{}
	for _, u := range problems {
		counts[u.Reason]++
		k := unsupportedKey{family, u.Service, u.Reason}
		if cur[k] {
			continue
		}
		cur[k] = true
		if s.reported[k] {
			continue
		}
		logging.Warning(s.log, "Part of a Service is not programmed as asked", "service", u.Service.String(), "port", u.Port,
			"family", family, "reason", u.Reason, "message", u.Message)
		s.reporter.serviceEvent(u.Service, u.Reason, actionSync, "node "+s.reporter.nodeName+": "+u.Message)
	}
	for k := range s.reported {
		if k.family == family && !cur[k] {
			delete(s.reported, k)
		}
	}
	for k := range cur {
		s.reported[k] = true
	}
	s.metrics.Unsupported(family, counts)
}

// readLocalAddrs lists the node's addresses for this sync; when that
// fails, the last known ones stay (NodePorts on a stale address list beat
// no sync at all).
func (s *syncer) readLocalAddrs() {
	if s.localAddrs == nil {
		return
	}
	addrs, err := s.localAddrs()
	if err != nil {
		s.log.Error(err, "Listing local addresses failed, using the last known ones")
		return
	}
	s.local = addrs
}

// view builds the intent View of b's family for this sync: the backend's
// least-connection counts first, then only what changed since the
// family's previous View.
func (s *syncer) view(b FamilyBackend, snap *proxy.Snapshot, ch proxy.Changes) *intent.View {
	if s.builders == nil {
		s.builders = map[v1.IPFamily]*intent.Builder{}
	}
	bld := s.builders[b.Family]
	if bld == nil {
		bld = intent.NewBuilder(b.Family)
		s.builders[b.Family] = bld
	}
	ports := snap.Family(b.Family)
	in := intent.Input{Config: s.settings.Config(b.Family, snap.Node, s.local), Ports: ports, Node: snap.Node,
		LocalAddrs: s.local, Generation: snap.Generation, Changes: ch}
	if cc, ok := b.Backend.(intent.ConnectionCounter); ok {
		in.Conns, in.ConnsChanged = cc.Connections(ports, ch)
	}
	return bld.Build(in)
}

// connectionsDue reports whether a backend's least-connection counts are
// due for a refresh (the app then asks the runner for a sync).
func (s *syncer) connectionsDue() bool {
	for _, b := range s.backends {
		if cc, ok := b.Backend.(intent.ConnectionCounter); ok && cc.ConnectionsDue() {
			return true
		}
	}
	return false
}

// triggersSince keeps the trigger times after start. Like upstream, changes
// made before kproxy started are not measured: their latency would include
// the time kproxy was not running (or a restart would report the age of
// every EndpointSlice).
func triggersSince(triggers []time.Time, start time.Time) []time.Time {
	var out []time.Time
	for _, t := range triggers {
		if t.After(start) {
			out = append(out, t)
		}
	}
	return out
}

// queue is the cache's Notify: every change marks each family's health as
// having a queued update, stamps the last-queued metric, and wakes the
// runner. Until start, there is no runner and no family yet: changes wait
// for the first sync, which start queues.
type queue struct {
	mu       sync.Mutex
	trigger  func()
	families []v1.IPFamily
	health   *healthcheck.ProxyHealth
	metrics  *metrics.Metrics
}

func (q *queue) notify() {
	q.mu.Lock()
	trigger, fams, health, m := q.trigger, q.families, q.health, q.metrics
	q.mu.Unlock()
	for _, f := range fams {
		health.QueuedUpdate(f)
		m.Queued(f)
	}
	if trigger != nil {
		trigger()
	}
}

// start connects the queue to the runner and queues the first sync.
func (q *queue) start(trigger func(), fams []v1.IPFamily, health *healthcheck.ProxyHealth, m *metrics.Metrics) {
	q.mu.Lock()
	q.trigger, q.families, q.health, q.metrics = trigger, fams, health, m
	q.mu.Unlock()
	q.notify()
}
