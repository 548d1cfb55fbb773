package cache

import (
	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Build returns the desired state for a fixed set of objects, as a node named
// nodeName would compute it. node may be nil. It is the pure shortcut used by
// tests and dry runs; problems with the input are discarded.
func Build(nodeName string, node *v1.Node, services []*v1.Service, slices []*discovery.EndpointSlice) *proxy.Snapshot {
	quiet := logr.Discard()
	c := New(Options{NodeName: nodeName, Logger: &quiet})
	if node != nil {
		c.OnNode(nil, node)
	}
	for _, s := range services {
		c.OnService(nil, s)
	}
	for _, s := range slices {
		c.OnEndpointSlice(nil, s)
	}
	snap, _ := c.Snapshot()
	return snap
}
