package proxy

import (
	"iter"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Snapshot is the node-local desired state at one moment. It is immutable:
// the cache never modifies a published Snapshot or anything reachable from it.
type Snapshot struct {
	// Generation increases with every Snapshot that differs from the previous one.
	Generation uint64
	Node       Node
	IPv4       *FamilyView
	IPv6       *FamilyView
}

// Family returns the view for one IP family (never nil for IPv4 or IPv6).
func (s *Snapshot) Family(f v1.IPFamily) *FamilyView {
	if f == v1.IPv6Protocol {
		return s.IPv6
	}
	return s.IPv4
}

// FamilyView holds the service ports that have a ClusterIP of one family,
// with only that family's addresses and endpoints. It is immutable and
// persistent: the cache publishes a view per generation in O(changes),
// sharing everything unchanged with the previous one (PortMap), so a
// consumer that reads only the changed ports (Get) does O(changes) work
// too. Sorted and All walk every port.
type FamilyView struct {
	Family v1.IPFamily
	// ports is never written once the view is made.
	ports *PortMap[*ServicePort]

	sortedOnce sync.Once
	sorted     []*ServicePort
}

// NewFamilyView builds a view from its ports. The map may be reused afterwards.
func NewFamilyView(f v1.IPFamily, ports map[ServicePortName]*ServicePort) *FamilyView {
	m := NewPortMap[*ServicePort]()
	for n, p := range ports {
		m.Set(n, p)
	}
	return &FamilyView{Family: f, ports: m}
}

// PublishFamilyView returns the view of family f holding ports now: ports
// may go on changing, the view keeps what it holds (ports is cloned).
func PublishFamilyView(f v1.IPFamily, ports *PortMap[*ServicePort]) *FamilyView {
	return &FamilyView{Family: f, ports: ports.Clone()}
}

// Get returns the port named n, nil when the view has none.
func (v *FamilyView) Get(n ServicePortName) *ServicePort {
	if v == nil {
		return nil
	}
	p, _ := v.ports.Get(n)
	return p
}

// Len returns the number of service ports.
func (v *FamilyView) Len() int {
	if v == nil {
		return 0
	}
	return v.ports.Len()
}

// All yields the ports in ServicePortName order.
func (v *FamilyView) All() iter.Seq[*ServicePort] {
	return func(yield func(*ServicePort) bool) {
		if v == nil {
			return
		}
		for _, p := range v.ports.All() {
			if !yield(p) {
				return
			}
		}
	}
}

// Sorted returns the ports in ServicePortName order, materialized once per
// view (O(ports): full syncs and dry runs; a partial sync reads the changed
// ports with Get). The slice is shared: do not modify it.
func (v *FamilyView) Sorted() []*ServicePort {
	if v == nil {
		return nil
	}
	v.sortedOnce.Do(func() {
		v.sorted = make([]*ServicePort, 0, v.Len())
		for p := range v.All() {
			v.sorted = append(v.sorted, p)
		}
	})
	return v.sorted
}

// Changes tells a backend what changed since its last successful sync.
type Changes struct {
	// Full asks the backend to rewrite everything it owns: set on the first
	// sync, after a failed sync, and periodically by the runner.
	Full bool
	// Ports holds every service port added, changed or removed (in any family).
	Ports map[ServicePortName]struct{}
	// Node is true when the node's facts changed.
	Node bool
	// TriggerTimes are the endpoints.kubernetes.io/last-change-trigger-time
	// values of the EndpointSlice changes included, by the slices' address
	// family, for the network programming latency metric.
	TriggerTimes map[v1.IPFamily][]time.Time
	// ServiceEvents and EndpointEvents count the object events coalesced into
	// these changes.
	ServiceEvents, EndpointEvents int
}

// Changed reports whether a service port is in the change set (always true
// for a full sync).
func (c Changes) Changed(name ServicePortName) bool {
	if c.Full {
		return true
	}
	_, ok := c.Ports[name]
	return ok
}

// Touches reports whether the changes concern a family whose view was old
// at the last successful sync and is cur now: a full sync, a node change,
// no change at all (a periodic sync), or a changed port present in either
// view. A backend of that family has nothing to do otherwise.
func (c Changes) Touches(old, cur *FamilyView) bool {
	if c.Full || c.Node || len(c.Ports) == 0 || old == nil || cur == nil {
		return true
	}
	for n := range c.Ports {
		if old.Get(n) != nil || cur.Get(n) != nil {
			return true
		}
	}
	return false
}

// Differences calls f for each port c names whose value differs between
// old and cur (nil where a view lacks it): what a consumer that keeps
// something per port updates, from the changes alone, when old is the view
// it last saw (c must name every port that differs since then; the cache's
// changes since the last acknowledged snapshot do when old is no older).
func (c Changes) Differences(old, cur *FamilyView, f func(n ServicePortName, old, cur *ServicePort)) {
	for n := range c.Ports {
		if o, p := old.Get(n), cur.Get(n); o != p {
			f(n, o, p)
		}
	}
}

// Empty reports whether nothing changed and no full sync is asked.
func (c Changes) Empty() bool { return !c.Full && !c.Node && len(c.Ports) == 0 }
