package integration

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kproxy/kproxy/test/proxytest"
)

func TestAsController(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("web", 10)
	svc.UID = types.UID("uid-web")
	slices, err := top.Slices(svc, proxytest.Ready(proxytest.PodA1)...)
	if err != nil {
		t.Fatal(err)
	}
	trigger := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.FixedZone("x", 3600))
	AsController(svc, trigger, slices...)
	for _, s := range slices {
		if got := s.Labels[discovery.LabelManagedBy]; got != ControllerName {
			t.Errorf("%s: managed-by %q", s.Name, got)
		}
		if got := s.Labels[discovery.LabelServiceName]; got != "web" {
			t.Errorf("%s: service-name %q", s.Name, got)
		}
		if got := s.Annotations[v1.EndpointsLastChangeTriggerTime]; got != "2026-11-30T11:00:00.123456789Z" {
			t.Errorf("%s: trigger time %q", s.Name, got)
		}
		ref := metav1.GetControllerOf(s)
		if ref == nil || ref.UID != "uid-web" || ref.Kind != "Service" || ref.Name != "web" {
			t.Errorf("%s: controller %+v, want Service web uid-web", s.Name, ref)
		}
		if parsed, err := time.Parse(time.RFC3339Nano, s.Annotations[v1.EndpointsLastChangeTriggerTime]); err != nil || !parsed.Equal(trigger) {
			t.Errorf("%s: trigger time does not round-trip: %v %v", s.Name, parsed, err)
		}
	}
}

func TestWriter(t *testing.T) {
	ctx := context.Background()
	top := proxytest.Default()
	client := fake.NewClientset()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	w := &Writer{Client: client, Topology: top, Now: func() time.Time { now = now.Add(time.Second); return now }}

	lb := top.Service("lb", 20, proxytest.WithLoadBalancer())
	stored, err := w.CreateService(ctx, lb)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.Status.LoadBalancer.Ingress) != 2 {
		t.Errorf("load-balancer status %+v not written", stored.Status.LoadBalancer)
	}
	t1, err := w.SetEndpoints(ctx, stored, proxytest.Ready(proxytest.PodA1)...)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := w.SetEndpoints(ctx, stored, proxytest.Ready(proxytest.PodB1, proxytest.PodB2)...)
	if err != nil {
		t.Fatalf("second SetEndpoints (an update): %v", err)
	}
	if !t2.After(t1) {
		t.Errorf("trigger times %v then %v", t1, t2)
	}
	list, err := client.DiscoveryV1().EndpointSlices(proxytest.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("%d slices, want one per family", len(list.Items))
	}
	for _, s := range list.Items {
		if len(s.Endpoints) != 2 || s.Annotations[v1.EndpointsLastChangeTriggerTime] != t2.Format(time.RFC3339Nano) {
			t.Errorf("%s: %d endpoints, trigger %q; want the second write", s.Name, len(s.Endpoints), s.Annotations[v1.EndpointsLastChangeTriggerTime])
		}
	}

	other, err := w.CreateService(ctx, top.Service("other", 21))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.SetEndpoints(ctx, other, proxytest.Ready(proxytest.PodA2)...); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteService(ctx, stored); err != nil {
		t.Fatal(err)
	}
	// The fake clientset ignores label selectors; check what is left by name.
	left, _ := client.DiscoveryV1().EndpointSlices(proxytest.Namespace).List(ctx, metav1.ListOptions{})
	for _, s := range left.Items {
		if s.Labels[discovery.LabelServiceName] == "lb" {
			t.Errorf("slice %s of the deleted Service left", s.Name)
		}
	}
	if _, err := client.CoreV1().Services(proxytest.Namespace).Get(ctx, "lb", metav1.GetOptions{}); err == nil {
		t.Error("Service lb still exists")
	}
	if err := w.DeleteService(ctx, stored); err != nil {
		t.Errorf("deleting again: %v (deleting what is gone is success)", err)
	}
}
