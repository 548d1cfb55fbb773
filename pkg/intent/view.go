package intent

import (
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// View is the intent of every service port of one IP family at one sync:
// what the app hands each backend, and what explain and the conntrack
// cleanup read. It is immutable once built. A View shares the *Port of
// every port that did not change with the View before it, so a renderer
// may compare ports by identity; Changed tells which ports differ.
type View struct {
	// Family is the IP family of every address in the view.
	Family v1.IPFamily
	// Config holds the settings and the node's facts the view was built
	// with.
	Config Config
	// Node is the snapshot's node; LocalAddrs the addresses on the node's
	// interfaces when the view was built (every family), for what a
	// renderer derives from the node beyond the intent (NodePort
	// addresses, say).
	Node       proxy.Node
	LocalAddrs []netip.Addr
	// Generation is the generation of the snapshot the view was built from.
	Generation uint64
	// Full asks the backend to rewrite everything it owns (the runner's
	// full syncs); otherwise only the ports Changed names need writing.
	Full bool
	// NodeChanged: the node's facts changed since the previous view (the
	// Node object, or the node's addresses in Config); every port whose
	// intent depends on them is in Changed too.
	NodeChanged bool

	// ports is never written once the view is built (the Builder
	// publishes a clone of its own map: O(1), sharing unchanged ports).
	ports   *proxy.PortMap[*Port]
	changed map[proxy.ServicePortName]struct{}
	// problems holds, for every port with some, what its intent left out
	// (for a port that could not be built at all, why).
	problems map[proxy.ServicePortName][]proxy.Unsupported

	sortOnce sync.Once
	sorted   []*Port
}

// Port returns the intent of service port n, or nil when the port is not
// in the view (absent from the snapshot, or left out: see Problems).
func (v *View) Port(n proxy.ServicePortName) *Port {
	p, _ := v.ports.Get(n)
	return p
}

// Len returns the number of ports with an intent.
func (v *View) Len() int { return v.ports.Len() }

// Sorted returns the ports in ServicePortName order. The slice is shared:
// do not modify it. It is computed on first use (full syncs and dry runs
// need it, partial syncs do not).
func (v *View) Sorted() []*Port {
	v.sortOnce.Do(func() {
		v.sorted = make([]*Port, 0, v.ports.Len())
		for _, p := range v.ports.All() {
			v.sorted = append(v.sorted, p)
		}
	})
	return v.sorted
}

// Changed reports whether port n must be written: a full sync, or n was
// added, changed or removed since the previous view.
func (v *View) Changed(n proxy.ServicePortName) bool {
	if v.Full {
		return true
	}
	_, ok := v.changed[n]
	return ok
}

// ChangedPorts calls f for each port added, changed or removed since the
// previous view (whatever Full says), in no particular order; p is nil for
// a port that is gone or left out.
func (v *View) ChangedPorts(f func(n proxy.ServicePortName, p *Port)) {
	for n := range v.changed {
		f(n, v.Port(n))
	}
}

// NumChanged returns the number of ports ChangedPorts visits.
func (v *View) NumChanged() int { return len(v.changed) }

// Problems returns what the view leaves out, sorted: the problems of every
// port, including those left out entirely.
func (v *View) Problems() []proxy.Unsupported {
	var out []proxy.Unsupported
	for _, ps := range v.problems {
		out = append(out, ps...)
	}
	proxy.SortUnsupported(out)
	return out
}

// ProblemsOf returns what the view leaves out of port n.
func (v *View) ProblemsOf(n proxy.ServicePortName) []proxy.Unsupported { return v.problems[n] }

func compareNames(a, b proxy.ServicePortName) int {
	switch {
	case a.Less(b):
		return -1
	case b.Less(a):
		return 1
	}
	return 0
}

// Input is what one View is built from.
type Input struct {
	Config Config
	// Ports is the snapshot's view of the family (nil: no ports).
	Ports      *proxy.FamilyView
	Node       proxy.Node
	LocalAddrs []netip.Addr
	Generation uint64
	// Changes are the cache's changes since the last acknowledged
	// snapshot: a superset of what changed since the previous View.
	Changes proxy.Changes
	// Conns holds, for least-connection ports, the established
	// connections per endpoint (see LeastConnectionWeights); ConnsChanged
	// names the ports whose counts changed since the previous View.
	Conns        map[proxy.ServicePortName]map[netip.AddrPort]int
	ConnsChanged map[proxy.ServicePortName]struct{}
}

// Builder makes the View of one family at each sync, building again only
// the intent of the ports that changed: the cache's changed ports, those
// whose least-connection counts changed, every port when the decisions'
// settings change, and those that depend on the node's addresses when they
// change. It also decides who owns a frontend several ports claim (see
// ownership.go). A Builder is not safe for concurrent use.
type Builder struct {
	family v1.IPFamily
	last   *View
	// raw holds each port's intent before ownership is applied (the View
	// holds the owned one: the same pointer when it owns every frontend).
	raw map[proxy.ServicePortName]*Port
	// invalid holds the problems of the ports whose intent could not be
	// built at all; denied those of the ports left out because another
	// port owns their ClusterIP frontend.
	invalid, denied map[proxy.ServicePortName][]proxy.Unsupported
	own             ownership
	// cur holds the owned intents of the View being built (after Build:
	// the last View's); each View gets a clone of it.
	cur *proxy.PortMap[*Port]
}

// NewBuilder returns a Builder for family f.
func NewBuilder(f v1.IPFamily) *Builder {
	return &Builder{family: f}
}

// Family returns the builder's IP family.
func (b *Builder) Family() v1.IPFamily { return b.family }

// Last returns the last View built (nil before the first).
func (b *Builder) Last() *View { return b.last }

// Build returns the View of in. It never modifies an earlier View.
func (b *Builder) Build(in Input) *View {
	in.Config.Family = b.family
	prev := b.last
	v := &View{
		Family: b.family, Config: in.Config, Node: in.Node, LocalAddrs: in.LocalAddrs,
		Generation: in.Generation, Full: in.Changes.Full,
		changed: map[proxy.ServicePortName]struct{}{},
	}
	fv := in.Ports
	if fv == nil {
		fv = proxy.NewFamilyView(b.family, nil)
	}
	if prev == nil || !sameDecisionSettings(prev.Config, in.Config) {
		b.rebuild(in, fv, v, prev)
	} else {
		b.update(in, fv, v, prev)
	}
	v.ports = b.cur.Clone()
	v.problems = b.problemsOf(v, prev)
	b.last = v
	return v
}

// rebuild builds every port's intent from scratch.
func (b *Builder) rebuild(in Input, fv *proxy.FamilyView, v, prev *View) {
	v.NodeChanged = prev != nil
	b.raw = make(map[proxy.ServicePortName]*Port, fv.Len())
	b.invalid = map[proxy.ServicePortName][]proxy.Unsupported{}
	b.denied = map[proxy.ServicePortName][]proxy.Unsupported{}
	b.own = newOwnership()
	for _, sp := range fv.Sorted() {
		if raw := b.buildPort(in, sp); raw != nil {
			b.own.add(raw)
		}
	}
	b.cur = proxy.NewPortMap[*Port]()
	for n := range b.raw {
		b.place(n)
	}
	if prev != nil {
		for n, p := range prev.ports.All() {
			if q, _ := b.cur.Get(n); q != p {
				v.changed[n] = struct{}{}
			}
		}
	}
	for n := range b.cur.All() {
		if prev == nil || prev.Port(n) == nil {
			v.changed[n] = struct{}{}
		}
	}
}

// update starts from prev's ports and builds again those that changed.
func (b *Builder) update(in Input, fv *proxy.FamilyView, v, prev *View) {
	nodeIPs := !slices.Equal(prev.Config.NodeIPs, in.Config.NodeIPs)
	v.NodeChanged = nodeIPs || in.Changes.Node
	todo := map[proxy.ServicePortName]struct{}{}
	for n := range in.Changes.Ports {
		todo[n] = struct{}{}
	}
	for n := range in.ConnsChanged {
		todo[n] = struct{}{}
	}
	if nodeIPs {
		for _, sp := range fv.Sorted() {
			if DependsOnNodeIPs(sp) {
				todo[sp.Name] = struct{}{}
			}
		}
	}
	affected := map[proxy.ServicePortName]struct{}{}
	for n := range todo {
		sp := fv.Get(n)
		old := b.raw[n]
		_, connsChanged := in.ConnsChanged[n]
		if old != nil && sp != nil && old.From == sp && !connsChanged && !(nodeIPs && DependsOnNodeIPs(sp)) {
			continue // the same cache value: the same intent
		}
		if old == nil && sp == nil && b.invalid[n] == nil {
			continue
		}
		for _, o := range b.own.remove(old) {
			affected[o] = struct{}{}
		}
		delete(b.raw, n)
		delete(b.invalid, n)
		affected[n] = struct{}{}
		if sp == nil {
			continue
		}
		if raw := b.buildPort(in, sp); raw != nil {
			for _, o := range b.own.add(raw) {
				affected[o] = struct{}{}
			}
		}
	}
	for n := range affected {
		b.place(n)
		if q, _ := b.cur.Get(n); q != prev.Port(n) {
			v.changed[n] = struct{}{}
		}
	}
}

// place puts port n's owned intent into b.cur (or leaves it out).
func (b *Builder) place(n proxy.ServicePortName) {
	delete(b.denied, n)
	raw := b.raw[n]
	if raw == nil {
		b.cur.Delete(n)
		return
	}
	p, denied := b.own.apply(raw)
	if p == nil {
		b.cur.Delete(n)
		b.denied[n] = denied
		return
	}
	b.cur.Set(n, p)
}

// buildPort builds sp's intent into b.raw, or its problems into b.invalid,
// and returns it.
func (b *Builder) buildPort(in Input, sp *proxy.ServicePort) *Port {
	p, problems := Build(in.Config, sp, in.Conns[sp.Name])
	if p == nil {
		b.invalid[sp.Name] = problems
		return nil
	}
	b.raw[sp.Name] = p
	return p
}

// problemsOf collects the problems of v: the ports left out and each
// port's own. Unchanged ports keep the problems prev has for them.
func (b *Builder) problemsOf(v, prev *View) map[proxy.ServicePortName][]proxy.Unsupported {
	out := make(map[proxy.ServicePortName][]proxy.Unsupported, len(b.invalid)+len(b.denied))
	for n, ps := range b.invalid {
		out[n] = ps
	}
	for n, ps := range b.denied {
		out[n] = ps
	}
	add := func(n proxy.ServicePortName, p *Port) {
		if p != nil && len(p.Problems) > 0 {
			out[n] = p.Problems
		}
	}
	if prev == nil || len(v.changed) == v.ports.Len() {
		for n, p := range v.ports.All() {
			add(n, p)
		}
		return out
	}
	for n, ps := range prev.problems {
		if _, ch := v.changed[n]; !ch && v.Port(n) != nil {
			out[n] = ps
		}
	}
	for n := range v.changed {
		add(n, v.Port(n))
	}
	return out
}

// sameDecisionSettings reports whether two configs make the same decisions
// for every port whose intent does not depend on the node's addresses.
func sameDecisionSettings(a, b Config) bool {
	return a.Family == b.Family && a.MasqueradeAll == b.MasqueradeAll && a.PodSources == b.PodSources &&
		a.PreserveDestination == b.PreserveDestination
}
