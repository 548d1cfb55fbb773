package source

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func noisyMeta(annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace:       "ns",
		Name:            "x",
		Labels:          map[string]string{discovery.LabelServiceName: "x", "app": "web"},
		Annotations:     annotations,
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "x"}},
		Finalizers:      []string{"example.com/f"},
		ResourceVersion: "7",
	}
}

func cleanMeta(annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace:       "ns",
		Name:            "x",
		Labels:          map[string]string{discovery.LabelServiceName: "x", "app": "web"},
		Annotations:     annotations,
		ResourceVersion: "7",
	}
}

func withLabels(m metav1.ObjectMeta, labels map[string]string) metav1.ObjectMeta {
	m.Labels = labels
	return m
}

// TestTransformSharesRepeatedValues: endpoints of every slice share one
// copy of each node and zone name and of each condition value.
func TestTransformSharesRepeatedValues(t *testing.T) {
	tr := newTransformer()
	mk := func(name string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr.To("n1"), Zone: ptr.To("z"), Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Terminating: ptr.To(false)}},
			{Addresses: []string{"10.0.0.2"}, NodeName: ptr.To("n1"), Zone: ptr.To("z"), Conditions: discovery.EndpointConditions{Ready: ptr.To(false)}},
		}}
	}
	a, _ := tr.transform(mk("a"))
	b, _ := tr.transform(mk("b"))
	ea, eb := a.(*discovery.EndpointSlice).Endpoints, b.(*discovery.EndpointSlice).Endpoints
	if ea[0].NodeName != eb[1].NodeName || ea[0].Zone != eb[0].Zone || *ea[0].NodeName != "n1" {
		t.Errorf("node and zone names not shared")
	}
	if ea[0].Conditions.Ready != eb[0].Conditions.Ready || *ea[0].Conditions.Ready != true ||
		ea[1].Conditions.Ready != ea[0].Conditions.Terminating || *ea[1].Conditions.Ready != false || ea[1].Conditions.Serving != nil {
		t.Errorf("conditions not shared or changed: %+v %+v", ea[0].Conditions, ea[1].Conditions)
	}
}

// TestInternTableIsBounded: under node-name churn (every slice version names
// new nodes) the intern table stays within maxInterned, the values stay
// right, and sharing resumes after a reset.
func TestInternTableIsBounded(t *testing.T) {
	tr := newTransformer()
	for i := 0; i < 3*maxInterned; i++ {
		es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr.To(fmt.Sprintf("node-%d", i))},
		}}
		out, _ := tr.transform(es)
		if got := *out.(*discovery.EndpointSlice).Endpoints[0].NodeName; got != fmt.Sprintf("node-%d", i) {
			t.Fatalf("node name %q, want node-%d", got, i)
		}
		if n := len(tr.strings); n > maxInterned {
			t.Fatalf("intern table holds %d strings after %d distinct names, cap %d", n, i+1, maxInterned)
		}
	}
	a, _ := tr.transform(&discovery.EndpointSlice{Endpoints: []discovery.Endpoint{{NodeName: ptr.To("again")}}})
	b, _ := tr.transform(&discovery.EndpointSlice{Endpoints: []discovery.Endpoint{{NodeName: ptr.To("again")}}})
	if a.(*discovery.EndpointSlice).Endpoints[0].NodeName != b.(*discovery.EndpointSlice).Endpoints[0].NodeName {
		t.Error("names not shared after the table was reset")
	}
}

func TestTransform(t *testing.T) {
	trigger := map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-02T03:04:05Z"}
	bigAnnotations := map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": "{...}",
		v1.EndpointsLastChangeTriggerTime:                  "2026-01-02T03:04:05Z",
	}
	svcSpec := v1.ServiceSpec{
		Type:       v1.ServiceTypeLoadBalancer,
		ClusterIP:  "10.0.0.1",
		ClusterIPs: []string{"10.0.0.1"},
		Ports:      []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}},
	}
	withSelector := *svcSpec.DeepCopy()
	withSelector.Selector = map[string]string{"app": "web"}
	lbStatus := v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "192.0.2.1"}}}
	ready := discovery.EndpointConditions{Ready: ptr.To(true)}
	nodeAddrs := []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.10"}}

	tests := []struct {
		name string
		in   any
		want any
	}{{
		name: "service",
		in: &v1.Service{
			ObjectMeta: noisyMeta(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"}),
			Spec:       withSelector,
			Status: v1.ServiceStatus{
				LoadBalancer: lbStatus,
				Conditions:   []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}},
			},
		},
		want: &v1.Service{ObjectMeta: withLabels(cleanMeta(nil), nil), Spec: svcSpec, Status: v1.ServiceStatus{LoadBalancer: lbStatus}},
	}, {
		// Before this case, every Service annotation was dropped, so the
		// cache never saw preserve-destination, the legacy source ranges
		// or kproxy.io/load-balancing from an informer.
		name: "service keeps the annotations the cache reads",
		in: &v1.Service{
			ObjectMeta: noisyMeta(map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration":       "{...}",
				"kproxy.io/load-balancing":                               "source-hash",
				"preserve-destination":                                   "true",
				"service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8",
			}),
			Spec: withSelector,
		},
		want: &v1.Service{ObjectMeta: withLabels(cleanMeta(map[string]string{
			"kproxy.io/load-balancing":                               "source-hash",
			"preserve-destination":                                   "true",
			"service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8",
		}), nil), Spec: svcSpec},
	}, {
		name: "endpointslice keeps the trigger time",
		in: &discovery.EndpointSlice{
			ObjectMeta:  noisyMeta(bigAnnotations),
			AddressType: discovery.AddressTypeIPv4,
			Endpoints: []discovery.Endpoint{{
				Addresses:          []string{"10.1.0.1"},
				Conditions:         ready,
				Hostname:           ptr.To("pod-1"),
				TargetRef:          &v1.ObjectReference{Kind: "Pod", Name: "pod-1"},
				DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "n1"},
				NodeName:           ptr.To("n1"),
				Zone:               ptr.To("z1"),
				Hints:              &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z1"}}},
			}},
			Ports: []discovery.EndpointPort{{Port: ptr.To[int32](8080)}},
		},
		want: &discovery.EndpointSlice{
			ObjectMeta:  withLabels(cleanMeta(trigger), map[string]string{discovery.LabelServiceName: "x"}),
			AddressType: discovery.AddressTypeIPv4,
			Endpoints: []discovery.Endpoint{{
				Addresses:  []string{"10.1.0.1"},
				Conditions: ready,
				NodeName:   ptr.To("n1"),
				Zone:       ptr.To("z1"),
				Hints:      &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z1"}}},
			}},
			Ports: []discovery.EndpointPort{{Port: ptr.To[int32](8080)}},
		},
	}, {
		name: "endpointslice with only the trigger time",
		in:   &discovery.EndpointSlice{ObjectMeta: noisyMeta(trigger)},
		want: &discovery.EndpointSlice{ObjectMeta: withLabels(cleanMeta(trigger), map[string]string{discovery.LabelServiceName: "x"})},
	}, {
		name: "node keeps spec and addresses",
		in: &v1.Node{
			ObjectMeta: noisyMeta(map[string]string{"node.alpha.kubernetes.io/ttl": "0"}),
			Spec:       v1.NodeSpec{PodCIDRs: []string{"10.1.0.0/24"}, Taints: []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler"}}},
			Status: v1.NodeStatus{
				Addresses:  nodeAddrs,
				Images:     []v1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
				Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
				NodeInfo:   v1.NodeSystemInfo{KubeletVersion: "v1.37.2"},
			},
		},
		want: &v1.Node{
			ObjectMeta: cleanMeta(nil),
			Spec:       v1.NodeSpec{PodCIDRs: []string{"10.1.0.0/24"}, Taints: []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler"}}},
			Status:     v1.NodeStatus{Addresses: nodeAddrs},
		},
	}, {
		name: "other types pass through",
		in:   &v1.Pod{ObjectMeta: noisyMeta(nil)},
		want: &v1.Pod{ObjectMeta: noisyMeta(nil)},
	}, {
		name: "tombstones pass through",
		in:   cache.DeletedFinalStateUnknown{Key: "ns/x", Obj: &v1.Service{ObjectMeta: noisyMeta(nil)}},
		want: cache.DeletedFinalStateUnknown{Key: "ns/x", Obj: &v1.Service{ObjectMeta: noisyMeta(nil)}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTransformer()
			got, err := tr.transform(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("transform (-want +got):\n%s", d)
			}
			again, err := tr.transform(got)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, again); d != "" {
				t.Errorf("transform is not idempotent (-want +got):\n%s", d)
			}
		})
	}
}

// TestNoFaultInThisBuild: the transform keeps externalTrafficPolicy Local.
// Only a build with the tag kproxy_fault_ignore_etp (make
// conformance-fault's image) turns it into Cluster, and this test fails
// there, which is the point: a test binary built with the fault says so.
func TestNoFaultInThisBuild(t *testing.T) {
	s := &v1.Service{Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal}}
	out, err := newTransformer().transform(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*v1.Service).Spec.ExternalTrafficPolicy; got != v1.ServiceExternalTrafficPolicyLocal {
		t.Errorf("externalTrafficPolicy after the transform = %q, want Local (built with kproxy_fault_ignore_etp?)", got)
	}
}
