package source

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/pkg/cache"
)

// transformer is the informers' transform: it strips, in place, the fields
// the proxy never reads so that they are not kept in memory, and makes the
// many EndpointSlice endpoints share their repeated values (node and zone
// names, condition values) instead of holding one copy each. It is
// idempotent and passes anything else through unchanged. Objects are
// read-only once transformed (the informer contract), which makes the
// sharing safe.
//
// What it keeps is what pkg/cache and pkg/app read: Services' UID (Events),
// the annotations the cache reads (cache.ServiceAnnotations), spec (minus selector and IP-family bookkeeping) and load-balancer status;
// EndpointSlices' service-name label, trigger-time annotation, ports and
// endpoints (addresses, conditions, node, zone, hints); Nodes' labels, spec,
// deletion timestamp and addresses. Label selection happens before the
// transform (server-side, or in the manifest ListerWatcher).
type transformer struct {
	mu      sync.Mutex
	strings map[string]*string
}

func newTransformer() *transformer { return &transformer{strings: map[string]*string{}} }

var (
	sharedTrue  = new(bool)
	sharedFalse = new(bool)
)

func init() { *sharedTrue = true }

func (t *transformer) transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		kept := keptServiceAnnotations(o.Annotations)
		stripMeta(&o.ObjectMeta)
		o.Annotations = kept
		o.Labels = nil
		o.Spec.Selector = nil
		o.Spec.IPFamilies = nil
		o.Spec.IPFamilyPolicy = nil
		if len(o.Spec.ClusterIPs) > 0 && o.Spec.ClusterIP == o.Spec.ClusterIPs[0] {
			o.Spec.ClusterIP = o.Spec.ClusterIPs[0] // one copy of the string
		}
		o.Status.Conditions = nil
		faultService(o)
	case *discovery.EndpointSlice:
		stripMeta(&o.ObjectMeta)
		o.UID = ""
		if svc, ok := o.Labels[discovery.LabelServiceName]; ok {
			if len(o.Labels) > 1 {
				o.Labels = map[string]string{discovery.LabelServiceName: svc}
			}
		} else {
			o.Labels = nil
		}
		t.mu.Lock()
		for i := range o.Endpoints {
			ep := &o.Endpoints[i]
			ep.TargetRef = nil
			ep.Hostname = nil
			ep.DeprecatedTopology = nil
			ep.NodeName = t.intern(ep.NodeName)
			ep.Zone = t.intern(ep.Zone)
			c := &ep.Conditions
			c.Ready, c.Serving, c.Terminating = shareBool(c.Ready), shareBool(c.Serving), shareBool(c.Terminating)
		}
		t.mu.Unlock()
	case *v1.Node:
		stripMeta(&o.ObjectMeta)
		o.Status = v1.NodeStatus{Addresses: o.Status.Addresses}
	}
	return obj, nil
}

// maxInterned bounds the intern table. Node and zone names of a 5,000-node
// cluster fit; under node-name churn (autoscaled nodes come and go for ever)
// the table is emptied when full rather than growing without bound. Objects
// already transformed keep their shared pointers; only new objects start a
// fresh table, so the cost of a reset is some lost sharing, never a wrong
// value.
const maxInterned = 16384

// intern returns one shared pointer per distinct string (node and zone
// names repeat across thousands of endpoints). Callers hold t.mu.
func (t *transformer) intern(s *string) *string {
	if s == nil {
		return nil
	}
	if p, ok := t.strings[*s]; ok {
		return p
	}
	if len(t.strings) >= maxInterned {
		clear(t.strings)
	}
	t.strings[*s] = s
	return s
}

func shareBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return sharedTrue
	}
	return sharedFalse
}

// keptServiceAnnotations returns the annotations of a Service that the cache
// reads (cache.ServiceAnnotations), nil when there are none; the map is
// shared when nothing else was set.
func keptServiceAnnotations(a map[string]string) map[string]string {
	var out map[string]string
	n := 0
	for _, k := range cache.ServiceAnnotations {
		if v, ok := a[k]; ok {
			if out == nil {
				out = make(map[string]string, 1)
			}
			out[k] = v
			n++
		}
	}
	if n > 0 && n == len(a) {
		return a
	}
	return out
}

// stripMeta drops managedFields, ownerReferences, finalizers, the creation
// timestamp and generation, and every annotation except the EndpointSlice
// trigger time.
func stripMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	m.CreationTimestamp = metav1.Time{}
	m.Generation = 0
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
