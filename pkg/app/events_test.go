package app

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// recorded is one Event given to a recorder.
type recorded struct {
	regarding                    v1.ObjectReference
	eventType, reason, action, n string
}

// recorder is an events.EventRecorder that keeps what it is given.
type recorder struct {
	mu     sync.Mutex
	events []recorded
}

func (r *recorder) Eventf(regarding runtime.Object, _ runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{*regarding.(*v1.ObjectReference), eventtype, reason, action, fmt.Sprintf(note, args...)})
}

func (r *recorder) take() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

func TestReporter(t *testing.T) {
	web := types.NamespacedName{Namespace: "demo", Name: "web"}
	uids := newServiceUIDs()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web", UID: "uid-1"}}
	uids.update(nil, svc)
	rec := &recorder{}
	r := newReporter(klog.Background(), rec, "node1", uids)

	r.starting()
	r.warn(web, "NoDSR", "first")
	r.warn(web, "NoDSR", "again, other words")
	r.warn(web, "NoAffinity", "second reason")
	r.healthCheckFailed(web, "FailedToStartServiceHealthcheck", "port busy")
	r.healthCheckFailed(web, "FailedToStartServiceHealthcheck", "port busy")
	r.forget() // web still exists: its warnings stay deduplicated
	r.warn(web, "NoDSR", "still once")

	// Deleted and created again: a new object, warned about again.
	uids.update(svc, nil)
	r.forget()
	svc2 := svc.DeepCopy()
	svc2.UID = "uid-2"
	uids.update(nil, svc2)
	r.warn(web, "NoDSR", "new object")

	want := []string{
		"Node//node1 uid=node1 Normal Starting StartKproxy: Starting kproxy.",
		"Service/demo/web uid=uid-1 Warning NoDSR Sync: first",
		"Service/demo/web uid=uid-1 Warning NoAffinity Sync: second reason",
		"Service/demo/web uid=uid-1 Warning FailedToStartServiceHealthcheck Listen: node node1: port busy",
		"Service/demo/web uid=uid-1 Warning FailedToStartServiceHealthcheck Listen: node node1: port busy",
		"Service/demo/web uid=uid-2 Warning NoDSR Sync: new object",
	}
	var got []string
	for _, e := range rec.take() {
		got = append(got, fmt.Sprintf("%s/%s/%s uid=%s %s %s %s: %s", e.regarding.Kind, e.regarding.Namespace, e.regarding.Name,
			e.regarding.UID, e.eventType, e.reason, e.action, e.n))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Without an API server: logs only, nothing breaks.
	quiet := newReporter(klog.Background(), nil, "node1", uids)
	quiet.starting()
	quiet.warn(web, "NoDSR", "x")
	quiet.healthCheckFailed(web, "FailedToStartServiceHealthcheck", "x")
}

// TestEventsThroughAPIServer runs kproxy against a fake API server: the
// "Starting" Event on the Node, a backend warning and a health check node
// port that cannot be bound reach the API as events.k8s.io/v1 Events.
func TestEventsThroughAPIServer(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()
	hc := int32(busy.Addr().(*net.TCPAddr).Port)
	ready := true
	client := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node-uid"}},
		&v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web", UID: "web-uid"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
				HealthCheckNodePort: hc, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
				Ports: []v1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}},
		},
		&discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
			Endpoints:   []discovery.Endpoint{{Addresses: []string{"10.244.1.20"}, NodeName: ptr("node1"), Conditions: discovery.EndpointConditions{Ready: &ready}}},
		},
	)
	created := make(chan *eventsv1.Event, 100)
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetResource().Group == eventsv1.GroupName {
			created <- a.(k8stesting.CreateAction).GetObject().(*eventsv1.Event).DeepCopy()
		}
		return false, nil, nil
	})
	web := types.NamespacedName{Namespace: "demo", Name: "web"}
	h := start(t, "", run{
		tweak: func(o *config.Options, d *Deps) {
			o.Manifests = ""
			d.Client = client
		},
		unsupported: []proxy.Unsupported{{Service: web, Reason: "NoDSR", Message: "DSR needs HNS 11.10"}},
	})
	h.waitSync("first sync", succeeded)

	var got []string
	deadline := time.After(testTimeout)
	for len(got) < 3 {
		select {
		case e := <-created:
			if e.ReportingController != "kproxy" || e.EventTime.IsZero() {
				t.Errorf("event %s: reportingController %q, eventTime %v", e.Name, e.ReportingController, e.EventTime)
			}
			got = append(got, fmt.Sprintf("%s %s/%s/%s uid=%s %s %s %s", e.Namespace, e.Regarding.Kind, e.Regarding.Namespace, e.Regarding.Name,
				e.Regarding.UID, e.Type, e.Reason, e.Action))
		case <-deadline:
			t.Fatalf("events so far: %q", got)
		}
	}
	sort.Strings(got)
	want := []string{
		"default Node//node1 uid=node1 Normal Starting StartKproxy",
		"demo Service/demo/web uid=web-uid Warning FailedToStartServiceHealthcheck Listen",
		"demo Service/demo/web uid=web-uid Warning NoDSR Sync",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func ptr[T any](v T) *T { return &v }

// TestSafetyWarningEventsThroughAPIServer: the Warning Events of issue 11's
// safety work reach the API server as events.k8s.io/v1 Events on the right
// Service (kind, namespace, name, UID): FrontendConflict on a Service whose
// externalIP is another Service's ClusterIP (found by the cache),
// Quarantined on a Service whose port the backend left out, and
// EndpointSliceRejected on a Service one of whose slices got an update the
// cache rejected (the last valid version stays in use).
func TestSafetyWarningEventsThroughAPIServer(t *testing.T) {
	ready := true
	termSlice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "term-1", Labels: map[string]string{discovery.LabelServiceName: "term"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{"10.244.1.60"}, NodeName: ptr("node1"), Conditions: discovery.EndpointConditions{Ready: &ready}}},
	}
	client := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node-uid"},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.50.11"}}}},
		&v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "term", UID: "term-uid"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.60", ClusterIPs: []string{"10.96.0.60"},
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		},
		// evil sorts first and claims term's ClusterIP as an externalIP.
		&v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "aaa", Name: "evil", UID: "evil-uid"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.61", ClusterIPs: []string{"10.96.0.61"},
				ExternalIPs: []string{"10.96.0.60"},
				Ports:       []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		},
		termSlice,
	)
	created := make(chan *eventsv1.Event, 100)
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetResource().Group == eventsv1.GroupName {
			created <- a.(k8stesting.CreateAction).GetObject().(*eventsv1.Event).DeepCopy()
		}
		return false, nil, nil
	})
	h := start(t, "", run{tweak: func(o *config.Options, d *Deps) {
		o.Manifests = ""
		d.Client = client
	}})
	h.waitSync("first sync", succeeded)

	// The IPv4 backend leaves term's port out (as after a kernel rejection).
	term := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: "term"}, Port: "http", Protocol: v1.ProtocolTCP}
	b := h.backends[v1.IPv4Protocol]
	b.mu.Lock()
	b.quarantine = []proxy.QuarantinedPort{{Name: term, Family: v1.IPv4Protocol, Reason: "iptables-restore: line 3 failed"}}
	b.mu.Unlock()
	// An update of term's slice that the cache rejects: its Service label
	// removed.
	bad := termSlice.DeepCopy()
	bad.Labels = nil
	bad.Endpoints[0].Addresses = []string{"10.244.1.61"}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Nothing changes (the last valid version stays): no new generation.

	want := map[string]string{ // what each Event must say, by its key
		"aaa Service/aaa/evil uid=evil-uid Warning FrontendConflict Sync":              "spec.externalIPs 10.96.0.60 is a Service's ClusterIP",
		"default Node//node1 uid=node1 Normal Starting StartKproxy":                    "Starting kproxy.",
		"default Service/default/term uid=term-uid Warning Quarantined Sync":           "default/term:http",
		"default Service/default/term uid=term-uid Warning EndpointSliceRejected Sync": "EndpointSlice default/term-1",
	}
	got := map[string]string{}
	deadline := time.After(testTimeout)
	for len(got) < len(want) {
		select {
		case e := <-created:
			key := fmt.Sprintf("%s %s/%s/%s uid=%s %s %s %s", e.Namespace, e.Regarding.Kind, e.Regarding.Namespace, e.Regarding.Name,
				e.Regarding.UID, e.Type, e.Reason, e.Action)
			if _, dup := got[key]; dup {
				t.Errorf("event %s recorded twice", key)
			}
			got[key] = e.Note
		case <-deadline:
			t.Fatalf("events so far: %q, want %q", got, want)
		}
	}
	for key, note := range want {
		if g, ok := got[key]; !ok {
			t.Errorf("no event %s; got %q", key, got)
		} else if !strings.Contains(g, note) {
			t.Errorf("event %s: note %q does not say %q", key, g, note)
		}
	}
	// The rejected update did not take term's endpoint away.
	snap := h.waitSync("a later (periodic) sync", succeeded).snap
	if p := snap.IPv4.Get(term); p == nil || len(p.ClusterEndpoints) != 1 || p.ClusterEndpoints[0].IP.String() != "10.244.1.60" {
		t.Errorf("term's endpoints after the rejected update: %+v", p)
	}
}

// TestProxyModeNotImplementedEvent: mode ipvs (run with the iptables
// backend) records one Warning Event ProxyModeNotImplemented on the Node,
// saying what runs instead; mode iptables records none (nor does nftables,
// which has its own backend: ModeWarning is empty, see pkg/config).
func TestProxyModeNotImplementedEvent(t *testing.T) {
	for _, tc := range []struct {
		mode, says string
	}{
		{"ipvs", "mode ipvs: kproxy has no ipvs backend and runs its iptables backend instead"},
		{"iptables", ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			rec := &recorder{}
			dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(freePort(t), "node1")})
			h := start(t, dir, run{args: []string{"--proxy-mode", tc.mode},
				tweak: func(_ *config.Options, d *Deps) { d.Events = rec }})
			h.waitSync("first sync", succeeded)
			var got []recorded
			for _, e := range rec.take() {
				if e.reason == "ProxyModeNotImplemented" {
					got = append(got, e)
				}
			}
			if tc.says == "" {
				if len(got) != 0 {
					t.Errorf("mode %s: %+v", tc.mode, got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("%d ProxyModeNotImplemented Events, want 1: %+v", len(got), got)
			}
			e := got[0]
			if e.regarding.Kind != "Node" || e.regarding.Name != "node1" || e.eventType != v1.EventTypeWarning || !strings.Contains(e.n, tc.says) {
				t.Errorf("Event %+v: want a Warning on Node node1 saying %q", e, tc.says)
			}
		})
	}
}
