package cache

import (
	"maps"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// famState is the desired state of one IP family: the ports by name and in
// name order. After publish, both are shared with the published view and
// copied before the next modification. The order is kept up to date when a
// port only changes value (the common case: endpoint churn) and rebuilt at
// publish time when ports were added or removed.
type famState struct {
	ports  map[proxy.ServicePortName]*proxy.ServicePort
	sorted []*proxy.ServicePort
	// shared: ports and sorted belong to a published view.
	shared bool
	// resort: sorted is stale (ports were added or removed).
	resort bool
}

func (f *famState) own() {
	if f.shared {
		f.ports = maps.Clone(f.ports)
		f.sorted = slices.Clone(f.sorted)
		f.shared = false
	}
}

// set adds or replaces a port.
func (f *famState) set(p *proxy.ServicePort) {
	f.own()
	_, existed := f.ports[p.Name]
	f.ports[p.Name] = p
	if !existed {
		f.resort = true
		return
	}
	if f.resort {
		return
	}
	i := sort.Search(len(f.sorted), func(i int) bool { return !f.sorted[i].Name.Less(p.Name) })
	if i < len(f.sorted) && f.sorted[i].Name == p.Name {
		f.sorted[i] = p
	} else {
		f.resort = true
	}
}

// remove deletes a port.
func (f *famState) remove(n proxy.ServicePortName) {
	f.own()
	delete(f.ports, n)
	f.resort = true
}

// publish returns an immutable view sharing the state.
func (f *famState) publish(fam v1.IPFamily) *proxy.FamilyView {
	if f.resort {
		f.sorted = f.sorted[:0]
		for _, p := range f.ports {
			f.sorted = append(f.sorted, p)
		}
		slices.SortFunc(f.sorted, func(a, b *proxy.ServicePort) int {
			switch {
			case a.Name.Less(b.Name):
				return -1
			case b.Name.Less(a.Name):
				return 1
			}
			return 0
		})
		f.resort = false
	}
	f.shared = true
	return proxy.NewSortedFamilyView(fam, f.ports, f.sorted)
}
