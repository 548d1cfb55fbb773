package proxy

import "github.com/kproxy/kproxy/pkg/pmap"

// PortMap maps service port names to values, in ServicePortName order: a
// persistent map (package pmap) whose Clone is O(1). The cache publishes
// each generation's ports this way and the intent Builder each View's.
type PortMap[V any] = pmap.Map[ServicePortName, V]

// NewPortMap returns an empty PortMap.
func NewPortMap[V any]() *PortMap[V] {
	return pmap.New[ServicePortName, V](ServicePortName.Less)
}
