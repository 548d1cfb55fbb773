package source

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

func testService(ns, name string, labels map[string]string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, Labels: labels,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"},
		},
		Spec: v1.ServiceSpec{
			ClusterIP: "10.0.0.10", ClusterIPs: []string{"10.0.0.10"},
			Selector: map[string]string{"app": name},
			Ports:    []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
}

func testSlice(ns, name, svc string, extraLabels map[string]string) *discovery.EndpointSlice {
	labels := map[string]string{discovery.LabelServiceName: svc}
	for k, v := range extraLabels {
		labels[k] = v
	}
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{
				v1.EndpointsLastChangeTriggerTime: "2026-01-02T03:04:05Z",
				"other":                           "dropped",
			},
		},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints: []discovery.Endpoint{{
			Addresses: []string{"10.1.0.1"},
			TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "p"},
		}},
		Ports: []discovery.EndpointPort{{Port: ptr.To[int32](8080)}},
	}
}

func testNode(name string) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelTopologyZone: "z1"}},
		Status: v1.NodeStatus{
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}},
			Images:    []v1.ContainerImage{{Names: []string{"big"}}},
		},
	}
}

// startAPIServerSource runs RunAPIServer against client until the test ends.
func startAPIServerSource(t *testing.T, client *fake.Clientset, node string) *recorder {
	t.Helper()
	rec := newRecorder()
	var logs logBuffer
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logs.logger()))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := RunAPIServer(ctx, client, node, 0, rec); err != nil {
			t.Errorf("RunAPIServer: %v", err)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		rec.check(t)
		if t.Failed() {
			t.Logf("source log:\n%s", logs.String())
		}
	})
	return rec
}

func TestAPIServerInitialSync(t *testing.T) {
	client := fake.NewClientset(
		testService("ns", "web", nil),
		testService("ns", "other-proxy", map[string]string{LabelServiceProxyName: "someone-else"}),
		testSlice("ns", "web-1", "web", nil),
		testSlice("ns", "headless-1", "headless", map[string]string{v1.IsHeadlessService: ""}),
		testSlice("ns", "other-proxy-1", "other-proxy", map[string]string{LabelServiceProxyName: "someone-else"}),
		testNode("n1"),
	)
	rec := startAPIServerSource(t, client, "n1")
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })

	_, atSync := rec.syncState()
	want := []string{"EndpointSlice ns/web-1", "Service ns/web"}
	if d := diffKeys(withoutNodes(atSync), want); d != "" {
		t.Errorf("objects delivered before OnSynced:\n%s", d)
	}
	eventually(t, "the node", func() bool { return rec.get("Node n1") != nil })

	// The transform ran before the handler saw the objects.
	svc := rec.get("Service ns/web").(*v1.Service)
	if svc.ManagedFields != nil || svc.Annotations != nil || svc.Spec.Selector != nil {
		t.Errorf("service not stripped: %+v", svc.ObjectMeta)
	}
	es := rec.get("EndpointSlice ns/web-1").(*discovery.EndpointSlice)
	if len(es.Annotations) != 1 || es.Annotations[v1.EndpointsLastChangeTriggerTime] == "" || es.Endpoints[0].TargetRef != nil {
		t.Errorf("slice not stripped as expected: %v %+v", es.Annotations, es.Endpoints[0])
	}
	if n := rec.get("Node n1").(*v1.Node); n.Status.Images != nil || len(n.Status.Addresses) != 1 {
		t.Errorf("node not stripped as expected: %+v", n.Status)
	}

	// Every list and watch call carried the selectors (the fake clientset
	// filters lists by label but ignores field selectors, so check the calls).
	wantRestrictions := map[string]string{
		"services":       "label " + ProxiedSelector,
		"endpointslices": "label " + ProxiedSelector,
		"nodes":          "field metadata.name=n1",
	}
	for res := range wantRestrictions {
		for _, verb := range []string{"list", "watch"} {
			eventually(t, verb+" "+res, func() bool { return hasAction(client, verb, res) })
		}
	}
	for _, a := range client.Actions() {
		var r k8stesting.ListRestrictions
		switch a := a.(type) {
		case k8stesting.ListAction:
			r = a.GetListRestrictions()
		case k8stesting.WatchAction:
			w := a.GetWatchRestrictions()
			r = k8stesting.ListRestrictions{Labels: w.Labels, Fields: w.Fields}
		default:
			continue
		}
		res := a.GetResource().Resource
		if res == "services" && a.GetVerb() == "list" && a.GetNamespace() == "default" && r.Fields.String() == "metadata.name=kubernetes" {
			continue // the cluster identity probe (see clusterIdentity)
		}
		want, ok := wantRestrictions[res]
		if !ok {
			t.Errorf("unexpected %s of %s", a.GetVerb(), res)
			continue
		}
		got := "label " + r.Labels.String()
		if res == "nodes" {
			got = "field " + r.Fields.String()
		}
		if canon(got) != canon(want) {
			t.Errorf("%s %s with %q, want %q", a.GetVerb(), res, got, want)
		}
	}
}

// canon sorts the terms of a selector string.
func canon(s string) string {
	kind, sel, _ := strings.Cut(s, " ")
	terms := strings.Split(sel, ",")
	slices.Sort(terms)
	return kind + " " + strings.Join(terms, ",")
}

func hasAction(c *fake.Clientset, verb, res string) bool {
	for _, a := range c.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == res {
			return true
		}
	}
	return false
}

func withoutNodes(keys []string) []string {
	var out []string
	for _, k := range keys {
		if len(k) < 5 || k[:5] != "Node " {
			out = append(out, k)
		}
	}
	return out
}

func TestAPIServerEvents(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(testNode("n1"))
	rec := startAPIServerSource(t, client, "n1")
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })

	steps := []struct {
		name string
		do   func() error
		key  string
		// check is true when the step's effect is visible.
		check func(obj any) bool
	}{{
		name: "add service",
		do: func() error {
			_, err := client.CoreV1().Services("ns").Create(ctx, testService("ns", "web", nil), metav1.CreateOptions{})
			return err
		},
		key:   "Service ns/web",
		check: func(o any) bool { return o != nil },
	}, {
		name: "update service",
		do: func() error {
			s := testService("ns", "web", nil)
			s.Spec.Ports[0].Port = 81
			_, err := client.CoreV1().Services("ns").Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
		key:   "Service ns/web",
		check: func(o any) bool { s, _ := o.(*v1.Service); return s != nil && s.Spec.Ports[0].Port == 81 },
	}, {
		name: "add slice",
		do: func() error {
			_, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, testSlice("ns", "web-1", "web", nil), metav1.CreateOptions{})
			return err
		},
		key: "EndpointSlice ns/web-1",
		check: func(o any) bool {
			s, _ := o.(*discovery.EndpointSlice)
			return s != nil && s.Annotations["other"] == ""
		},
	}, {
		name: "update slice",
		do: func() error {
			s := testSlice("ns", "web-1", "web", nil)
			s.Endpoints[0].Addresses = []string{"10.1.0.2"}
			_, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
		key: "EndpointSlice ns/web-1",
		check: func(o any) bool {
			s, _ := o.(*discovery.EndpointSlice)
			return s != nil && s.Endpoints[0].Addresses[0] == "10.1.0.2"
		},
	}, {
		name: "update node",
		do: func() error {
			n := testNode("n1")
			n.Labels[v1.LabelTopologyZone] = "z2"
			_, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		},
		key:   "Node n1",
		check: func(o any) bool { n, _ := o.(*v1.Node); return n != nil && n.Labels[v1.LabelTopologyZone] == "z2" },
	}, {
		name: "delete slice",
		do: func() error {
			return client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "web-1", metav1.DeleteOptions{})
		},
		key:   "EndpointSlice ns/web-1",
		check: func(o any) bool { return o == nil },
	}, {
		name:  "delete service",
		do:    func() error { return client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}) },
		key:   "Service ns/web",
		check: func(o any) bool { return o == nil },
	}, {
		name:  "delete node",
		do:    func() error { return client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}) },
		key:   "Node n1",
		check: func(o any) bool { return o == nil },
	}}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		eventually(t, s.name, func() bool { return s.check(rec.get(s.key)) })
	}
	if n, _ := rec.syncState(); n != 1 {
		t.Errorf("OnSynced called %d times, want 1", n)
	}
}

func TestAPIServerSyncWaitsForServicesAndSlicesOnly(t *testing.T) {
	// Listing nodes fails (as when RBAC forbids it): sync must not wait for it.
	client := fake.NewClientset(testService("ns", "web", nil))
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	rec := startAPIServerSource(t, client, "n1")
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })

	// Listing services fails for a while (an API outage): no OnSynced until
	// it recovers, and the source does not give up.
	var mu sync.Mutex
	failing := true
	client2 := fake.NewClientset(testService("ns", "web", nil))
	client2.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return true, nil, context.DeadlineExceeded
		}
		return false, nil, nil
	})
	rec2 := startAPIServerSource(t, client2, "n1")
	eventually(t, "a failed services list", func() bool { return hasAction(client2, "list", "services") })
	if n, _ := rec2.syncState(); n != 0 {
		t.Fatalf("OnSynced called before services were listed")
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	eventually(t, "OnSynced after recovery", func() bool { n, _ := rec2.syncState(); return n == 1 })
	if rec2.get("Service ns/web") == nil {
		t.Errorf("service not delivered after recovery")
	}
}

func TestRunArguments(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := fake.NewClientset()
	if err := RunAPIServer(ctx, client, "", 0, newRecorder()); err == nil {
		t.Error("empty node name accepted")
	}
	if err := RunAPIServer(ctx, client, "n1", -time.Second, newRecorder()); err == nil {
		t.Error("negative resync accepted")
	}
	if err := RunManifests(ctx, t.TempDir(), "", newRecorder()); err == nil {
		t.Error("empty node name accepted for manifests")
	}
	if err := RunManifests(ctx, t.TempDir()+"/missing", "n1", newRecorder()); err == nil {
		t.Error("missing manifest directory accepted")
	}
}
