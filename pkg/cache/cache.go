// Package cache turns Service, EndpointSlice and Node events into the
// node-local desired state that every backend renders: for each service port,
// its frontends and the endpoints selected for cluster-scoped and node-local
// traffic (readiness, terminating fallback, traffic policies, topology).
//
// Events are cheap: they parse the object into a compact form, keep it, and
// mark the Service dirty. The work happens lazily in Snapshot, once per sync,
// and only for dirty Services (or all of them when the node's topology labels
// change). A service port whose result did not change keeps its pointer, so
// backends can tell unchanged ports by identity.
package cache

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/logging"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Options configure a Cache.
type Options struct {
	// NodeName is this node's name: endpoints on it are local, and only the
	// Node object of that name is read.
	NodeName string
	// Notify is called after every event that may change the desired state.
	// It must not block.
	Notify func()
	// Logger receives one warning per bad field of an object change.
	// Defaults to klog's global logger.
	Logger *klog.Logger
	// Conflict, when set, is told (from Snapshot, with the cache locked: it
	// must not block nor call the cache) about each frontend a Service
	// claims but may not have: an externalIP or load balancer IP that is
	// some Service's ClusterIP. It is called again at each recomputation of
	// the offending Service while the conflict lasts. It is also told, from
	// OnService without the lock, about an unknown kproxy.io/load-balancing
	// value (reason ReasonUnknownLoadBalancing; random is used), and, from
	// OnEndpointSlice without the lock, about a slice update it rejected
	// while an earlier valid version stays in use (reason
	// ReasonEndpointSliceRejected).
	Conflict func(svc types.NamespacedName, reason, message string)
	// DefaultAlgorithm is the load-balancing algorithm of Services without
	// the kproxy.io/load-balancing annotation ("" or random: random); the
	// node-wide default (ipvs.scheduler in mode ipvs).
	DefaultAlgorithm proxy.Algorithm
}

// ReasonFrontendConflict is the reason of the warnings about frontends a
// Service claims but may not have (see Options.Conflict).
const ReasonFrontendConflict = "FrontendConflict"

// ReasonEndpointSliceRejected is the reason of the warning about a Service
// one of whose EndpointSlices got an update the cache rejected (see
// OnEndpointSlice): the last valid version stays in use.
const ReasonEndpointSliceRejected = "EndpointSliceRejected"

// ReasonUnknownLoadBalancing is the reason of the warning about a Service
// whose kproxy.io/load-balancing annotation names no known algorithm.
const ReasonUnknownLoadBalancing = "UnknownLoadBalancing"

// Cache is the shared, node-local desired state. It is safe for concurrent use.
type Cache struct {
	nodeName string
	notify   func()
	log      klog.Logger
	conflict func(svc types.NamespacedName, reason, message string)
	defAlg   proxy.Algorithm

	mu       sync.Mutex
	synced   bool
	syncedCh chan struct{}
	services map[types.NamespacedName]*svcInfo
	// slices by Service, then by slice name.
	slices map[types.NamespacedName]map[string]*sliceInfo
	// sliceHome tells, per EndpointSlice (namespace and name), the Service
	// its filed version is under. The source's old object cannot tell: it
	// is a stub of the last version handed over, which may be one the cache
	// rejected (and so never filed).
	sliceHome map[types.NamespacedName]types.NamespacedName
	node      proxy.Node
	// owners counts the Services whose ClusterIP each address is; claims
	// lists, per address, the Services naming it as an externalIP or load
	// balancer IP. Together they enforce frontend ownership: a ClusterIP
	// belongs to its Service, and no Service may capture it as an external
	// frontend.
	owners map[netip.Addr]int
	claims map[netip.Addr]map[types.NamespacedName]struct{}
	// conflicts counts the external frontends left out for that reason in
	// the published state, per Service.
	conflicts map[types.NamespacedName]int
	// dirty Services to recompute at the next Snapshot.
	dirty map[types.NamespacedName]struct{}
	// allDirty asks for every Service to be recomputed (topology change).
	allDirty  bool
	nodeDirty bool

	// fams holds the published desired state per family; shared with the
	// last Snapshot until the next change copies it.
	fams [2]famState
	// portNames lists the ports each Service contributed, to remove them.
	portNames map[types.NamespacedName][]proxy.ServicePortName
	last      *proxy.Snapshot
	gen       uint64

	// Not yet acknowledged changes, each tagged with the generation of the
	// first Snapshot that included it.
	changed     map[proxy.ServicePortName]uint64
	nodeChanged uint64
	open        batch   // events since the last Snapshot
	pending     []batch // closed batches not yet acknowledged
}

// batch accumulates event bookkeeping between two snapshots.
type batch struct {
	gen            uint64
	triggers       [2][]time.Time // by family index, at most maxTriggerTimes each
	svcEvents      int
	endpointEvents int
}

// Bounds on what the cache retains while syncs fail (no Ack): without them a
// backend that keeps failing under endpoint churn would make the cache keep
// every trigger time and one batch per failed sync, for as long as it fails.
const (
	// maxTriggerTimes caps the trigger times a batch keeps per family; the
	// earliest ones are kept (they carry the largest latencies). The event
	// counts stay exact.
	maxTriggerTimes = 1000
	// maxPendingBatches caps the unacknowledged batches; beyond it the two
	// oldest are merged, so their events are reported until the newer of the
	// two generations is acknowledged.
	maxPendingBatches = 16
)

// addTrigger records one trigger time, within maxTriggerTimes.
func (b *batch) addTrigger(fam int, t time.Time) {
	if len(b.triggers[fam]) < maxTriggerTimes {
		b.triggers[fam] = append(b.triggers[fam], t)
	}
}

// mergeBatches folds a (older) and b into one batch tagged with b's generation.
func mergeBatches(a, b batch) batch {
	out := batch{gen: b.gen, svcEvents: a.svcEvents + b.svcEvents, endpointEvents: a.endpointEvents + b.endpointEvents}
	for fam := range out.triggers {
		out.triggers[fam] = a.triggers[fam]
		for _, t := range b.triggers[fam] {
			out.addTrigger(fam, t)
		}
	}
	return out
}

// New returns an empty Cache.
func New(opts Options) *Cache {
	c := &Cache{
		nodeName:  opts.NodeName,
		notify:    opts.Notify,
		log:       klog.Background(),
		syncedCh:  make(chan struct{}),
		services:  map[types.NamespacedName]*svcInfo{},
		slices:    map[types.NamespacedName]map[string]*sliceInfo{},
		sliceHome: map[types.NamespacedName]types.NamespacedName{},
		dirty:     map[types.NamespacedName]struct{}{},
		fams:      [2]famState{newFamState(), newFamState()},
		portNames: map[types.NamespacedName][]proxy.ServicePortName{},
		changed:   map[proxy.ServicePortName]uint64{},
		node:      proxy.Node{Name: opts.NodeName},
		conflict:  opts.Conflict,
		defAlg:    opts.DefaultAlgorithm,
		owners:    map[netip.Addr]int{},
		claims:    map[netip.Addr]map[types.NamespacedName]struct{}{},
		conflicts: map[types.NamespacedName]int{},
	}
	if opts.Logger != nil {
		c.log = *opts.Logger
	}
	return c
}

func (c *Cache) warn(problems []Problem) {
	for _, p := range problems {
		c.log.Info("Ignoring bad input", "kind", p.Kind, "object", p.Object.String(), "field", p.Field, "reason", p.Reason)
	}
}

func (c *Cache) kick() {
	if c.notify != nil {
		c.notify()
	}
}

// OnService records a Service add (old nil), update or delete (cur nil).
func (c *Cache) OnService(old, cur *v1.Service) {
	var info *svcInfo
	var name types.NamespacedName
	if cur != nil {
		var problems []Problem
		info, problems = parseService(cur)
		c.warn(problems)
		name = types.NamespacedName{Namespace: cur.Namespace, Name: cur.Name}
		if c.conflict != nil {
			for _, p := range problems {
				if p.Field == annotationLoadBalancingField {
					c.conflict(name, ReasonUnknownLoadBalancing, p.Field+": "+p.Reason)
				}
			}
		}
	} else if old != nil {
		name = types.NamespacedName{Namespace: old.Namespace, Name: old.Name}
	} else {
		return
	}
	c.mu.Lock()
	c.index(name, c.services[name], info)
	if info == nil {
		delete(c.services, name)
	} else {
		c.services[name] = info
	}
	c.dirty[name] = struct{}{}
	c.open.svcEvents++
	c.mu.Unlock()
	c.kick()
}

// OnEndpointSlice records an EndpointSlice add (old nil), update or delete (cur nil).
//
// The new version is parsed before the lock is taken, and the old version is
// replaced by the new one in the same critical section: a Snapshot never sees
// the Service with the old version gone and the new one not yet filed.
//
// A version the cache rejects (a problem that leaves nothing usable: no or a
// bad Service label, an unknown address type) does not replace the last
// valid one: that stays filed, so the Service keeps those endpoints, and
// the rejection is warned about (log line, and Options.Conflict with reason
// ReasonEndpointSliceRejected) until a valid version or the deletion comes.
// A version the proxy ignores without a problem (FQDN) does replace it.
func (c *Cache) OnEndpointSlice(old, cur *discovery.EndpointSlice) {
	var info *sliceInfo
	var problems []Problem
	var key types.NamespacedName
	switch {
	case cur != nil:
		info, problems = parseSlice(cur)
		c.warn(problems)
		key = types.NamespacedName{Namespace: cur.Namespace, Name: cur.Name}
	case old != nil:
		key = types.NamespacedName{Namespace: old.Namespace, Name: old.Name}
	default:
		return
	}

	c.mu.Lock()
	home, filed := c.sliceHome[key]
	if cur != nil && info == nil && len(problems) > 0 && filed {
		c.mu.Unlock()
		logging.Warning(c.log, "Keeping the last valid version of an EndpointSlice whose update was rejected",
			"endpointSlice", key.String(), "service", home.String(), "problems", len(problems))
		if c.conflict != nil {
			c.conflict(home, ReasonEndpointSliceRejected, fmt.Sprintf(
				"EndpointSlice %s: an update was rejected (%s: %s); its last valid version is still used",
				key, problems[0].Field, problems[0].Reason))
		}
		return
	}
	touched := map[types.NamespacedName]struct{}{}
	if filed {
		// Forget the filed version (its Service label may have changed).
		if m := c.slices[home]; m != nil {
			delete(m, key.Name)
			if len(m) == 0 {
				delete(c.slices, home)
			}
		}
		delete(c.sliceHome, key)
		touched[home] = struct{}{}
	}
	if info != nil {
		m := c.slices[info.service]
		if m == nil {
			m = map[string]*sliceInfo{}
			c.slices[info.service] = m
		}
		m[info.name] = info
		c.sliceHome[key] = info.service
		touched[info.service] = struct{}{}
		if !info.trigger.IsZero() {
			c.open.addTrigger(info.fam, info.trigger)
		}
	}
	for k := range touched {
		c.dirty[k] = struct{}{}
	}
	c.open.endpointEvents++
	c.mu.Unlock()
	c.kick()
}

// OnNode records a change of this node's Node object. Objects of other nodes
// are ignored. A change of topology labels re-evaluates every Service. When
// the Node object is deleted, the node keeps its last known facts and is
// marked as being deleted (load balancers should drain it), as upstream
// kube-proxy keeps reporting it ineligible.
func (c *Cache) OnNode(old, cur *v1.Node) {
	var n proxy.Node
	if cur != nil {
		if cur.Name != c.nodeName {
			return
		}
		var problems []Problem
		n, problems = parseNode(cur)
		c.warn(problems)
	} else if old == nil || old.Name != c.nodeName {
		return
	}
	c.mu.Lock()
	if cur == nil {
		n = c.node
		n.Deleting = true
	}
	changed := !nodesEqual(c.node, n)
	if topologyChanged(c.node, n) {
		c.allDirty = true
	}
	c.node = n
	if changed {
		c.nodeDirty = true
	}
	c.mu.Unlock()
	if changed {
		c.kick()
	}
}

// Node returns this node's facts as last recorded (Known is false until the
// Node object was seen).
func (c *Cache) Node() proxy.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.node
}

// OnSynced marks the initial lists as delivered.
func (c *Cache) OnSynced() {
	c.mu.Lock()
	if !c.synced {
		c.synced = true
		close(c.syncedCh)
	}
	c.mu.Unlock()
	c.kick()
}

// Synced returns a channel closed once OnSynced has been called.
func (c *Cache) Synced() <-chan struct{} { return c.syncedCh }

// Snapshot returns the current desired state and what changed since the last
// Ack. The Snapshot is immutable and safe to read while the cache moves on.
func (c *Cache) Snapshot() (*proxy.Snapshot, proxy.Changes) {
	c.mu.Lock()
	defer c.mu.Unlock()

	next := c.gen + 1
	anyChange := c.recomputeLocked(next)
	if c.nodeDirty {
		c.nodeDirty = false
		c.nodeChanged = next
		anyChange = true
	}
	if anyChange || c.last == nil {
		c.gen = next
		c.last = &proxy.Snapshot{
			Generation: c.gen,
			Node:       c.node,
			IPv4:       c.fams[0].publish(v1.IPv4Protocol),
			IPv6:       c.fams[1].publish(v1.IPv6Protocol),
		}
	}
	if c.open.svcEvents+c.open.endpointEvents > 0 {
		c.open.gen = c.last.Generation
		c.pending = append(c.pending, c.open)
		c.open = batch{}
		if len(c.pending) > maxPendingBatches {
			c.pending[1] = mergeBatches(c.pending[0], c.pending[1])
			c.pending = slices.Delete(c.pending, 0, 1)
		}
	}

	ch := proxy.Changes{Ports: make(map[proxy.ServicePortName]struct{}, len(c.changed)), Node: c.nodeChanged != 0}
	for name := range c.changed {
		ch.Ports[name] = struct{}{}
	}
	for _, b := range c.pending {
		for fam, ts := range b.triggers {
			if len(ts) > 0 {
				if ch.TriggerTimes == nil {
					ch.TriggerTimes = map[v1.IPFamily][]time.Time{}
				}
				ch.TriggerTimes[families[fam]] = append(ch.TriggerTimes[families[fam]], ts...)
			}
		}
		ch.ServiceEvents += b.svcEvents
		ch.EndpointEvents += b.endpointEvents
	}
	return c.last, ch
}

// recomputeLocked recomputes dirty Services and publishes the ports that
// changed, tagging them with generation gen. It reports whether any did.
func (c *Cache) recomputeLocked(gen uint64) bool {
	if c.allDirty {
		c.allDirty = false
		for name := range c.services {
			c.dirty[name] = struct{}{}
		}
	}
	if len(c.dirty) == 0 {
		return false
	}
	any := false
	for name := range c.dirty {
		var fresh [2][]*proxy.ServicePort
		delete(c.conflicts, name)
		if svc := c.services[name]; svc != nil {
			svc = c.ownedFrontends(svc)
			if svc.algorithm == "" && c.defAlg != "" && c.defAlg != proxy.AlgorithmRandom {
				cp := *svc
				cp.algorithm = c.defAlg
				svc = &cp
			}
			sl := sortedSlices(c.slices[name])
			for fam := range fresh {
				fresh[fam] = servicePorts(svc, sl, fam, &c.node)
			}
		}
		if c.applyLocked(name, fresh, gen) {
			any = true
		}
	}
	c.dirty = emptied(c.dirty, len(c.dirty))
	return any
}

// bigMap is the size past which a map emptied is replaced rather than
// cleared. A Go map keeps the capacity it grew to, and ranging over it
// costs that capacity, not its length: the dirty and changed sets reach
// every Service at the start, so ranging over them, empty or nearly, at
// every later sync would cost O(Services).
const bigMap = 1024

// emptied returns m emptied: cleared when it held at most bigMap entries
// (had is how many it held before it was emptied or was about to be),
// else a new map.
func emptied[K comparable, V any](m map[K]V, had int) map[K]V {
	if had > bigMap {
		return map[K]V{}
	}
	clear(m)
	return m
}

// applyLocked replaces the ports of one Service, keeping unchanged pointers.
func (c *Cache) applyLocked(name types.NamespacedName, fresh [2][]*proxy.ServicePort, gen uint64) bool {
	changed := false
	mark := func(n proxy.ServicePortName) {
		changed = true
		if _, ok := c.changed[n]; !ok {
			c.changed[n] = gen
		}
	}
	var names []proxy.ServicePortName
	type famName struct {
		fam  int
		name proxy.ServicePortName
	}
	seen := map[famName]bool{}
	for fam, list := range fresh {
		for _, sp := range list {
			seen[famName{fam, sp.Name}] = true
			if !slices.Contains(names, sp.Name) {
				names = append(names, sp.Name)
			}
			if old := c.fams[fam].get(sp.Name); old != nil && equalPorts(old, sp) {
				continue
			}
			mark(sp.Name)
			c.fams[fam].set(sp)
		}
	}
	for _, n := range c.portNames[name] {
		for fam := range c.fams {
			if c.fams[fam].get(n) != nil && !seen[famName{fam, n}] {
				mark(n)
				c.fams[fam].remove(n)
			}
		}
	}
	if len(names) == 0 {
		delete(c.portNames, name)
	} else {
		c.portNames[name] = names
	}
	return changed
}

func sortedSlices(m map[string]*sliceInfo) []*sliceInfo {
	out := make([]*sliceInfo, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *sliceInfo) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return out
}

// Ack tells the cache that snap was programmed: changes included in it are
// no longer reported.
func (c *Cache) Ack(snap *proxy.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := snap.Generation
	had := len(c.changed)
	for name, cg := range c.changed {
		if cg <= g {
			delete(c.changed, name)
		}
	}
	if len(c.changed) == 0 {
		c.changed = emptied(c.changed, had)
	}
	if c.nodeChanged != 0 && c.nodeChanged <= g {
		c.nodeChanged = 0
	}
	c.pending = slices.DeleteFunc(c.pending, func(b batch) bool { return b.gen <= g })
}

// Pending returns the number of Service and EndpointSlice events not yet
// acknowledged (for the *_changes_pending metrics).
func (c *Cache) Pending() (services, endpoints int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	services, endpoints = c.open.svcEvents, c.open.endpointEvents
	for _, b := range c.pending {
		services += b.svcEvents
		endpoints += b.endpointEvents
	}
	return services, endpoints
}
