package source

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// transformObject is the informers' transform: it strips, in place, the fields
// the proxy never reads so that they are not kept in memory. It is idempotent
// and passes anything else through unchanged.
func transformObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		stripMeta(&o.ObjectMeta)
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discovery.EndpointSlice:
		stripMeta(&o.ObjectMeta)
		for i := range o.Endpoints {
			ep := &o.Endpoints[i]
			ep.TargetRef = nil
			ep.Hostname = nil
			ep.DeprecatedTopology = nil
		}
	case *v1.Node:
		stripMeta(&o.ObjectMeta)
		o.Status = v1.NodeStatus{Addresses: o.Status.Addresses}
	}
	return obj, nil
}

// stripMeta drops managedFields, ownerReferences, finalizers and every
// annotation except the EndpointSlice trigger time.
func stripMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	if len(m.Annotations) == 0 {
		m.Annotations = nil
		return
	}
	t, ok := m.Annotations[v1.EndpointsLastChangeTriggerTime]
	switch {
	case !ok:
		m.Annotations = nil
	case len(m.Annotations) > 1:
		m.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: t}
	}
}
