package cache

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// famState is the desired state of one IP family: the ports by name, kept
// in a persistent map so that publishing a view is O(1) and a change after
// it copies only what it touches, not every port (a change costs the same
// at 1,000 and at 100,000 Services).
type famState struct {
	ports *proxy.PortMap[*proxy.ServicePort]
}

func newFamState() famState { return famState{ports: proxy.NewPortMap[*proxy.ServicePort]()} }

// get returns a port, nil when absent.
func (f *famState) get(n proxy.ServicePortName) *proxy.ServicePort {
	p, _ := f.ports.Get(n)
	return p
}

// set adds or replaces a port.
func (f *famState) set(p *proxy.ServicePort) { f.ports.Set(p.Name, p) }

// remove deletes a port.
func (f *famState) remove(n proxy.ServicePortName) { f.ports.Delete(n) }

// publish returns an immutable view of the state now.
func (f *famState) publish(fam v1.IPFamily) *proxy.FamilyView {
	return proxy.PublishFamilyView(fam, f.ports)
}
