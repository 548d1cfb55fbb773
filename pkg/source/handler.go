package source

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Handler receives object changes. In each method old is nil for an add and
// cur is nil for a delete. For Services and EndpointSlices old is a stub:
// namespace, name and (EndpointSlices) the kubernetes.io/service-name label
// the object had; the source keeps nothing else of them. Calls for one kind are serialized; calls for
// different kinds may run concurrently. A Handler must not modify the objects.
type Handler interface {
	OnService(old, cur *v1.Service)
	OnEndpointSlice(old, cur *discovery.EndpointSlice)
	OnNode(old, cur *v1.Node)
	// OnSynced is called once, when the initial lists of Services and
	// EndpointSlices have both been delivered. Nothing should be programmed
	// before it.
	OnSynced()
}
