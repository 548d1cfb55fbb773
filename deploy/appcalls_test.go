package deploy

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// libraryCalls are calls the ClusterRole grants that a short run of kproxy
// does not make: client-go's events.k8s.io recorder patches an Event when
// the same one repeats within its series window, and kproxy reports each
// (object, reason) once per run, so only a long-lived kproxy whose report
// repeats (a health check node port that keeps failing to bind) patches.
var libraryCalls = []apiCall{{"patch", "events.k8s.io", "events"}}

// warningBackend is a backend that reports one thing it cannot program as
// asked, as the Windows backend does for what HNS cannot honour.
type warningBackend struct{}

func (warningBackend) Sync(context.Context, *intent.View) error { return nil }

func (warningBackend) Unsupported() []proxy.Unsupported {
	return []proxy.Unsupported{{Service: types.NamespacedName{Namespace: "ns", Name: "web"}, Reason: "TestWarning", Message: "a platform limit"}}
}

// appCalls runs kproxy (pkg/app.RunWith: API-server source, event
// recorder, servers, runner) against a fake clientset until it has watched
// every kind and recorded the "Starting" Event on the Node and a warning
// Event on a Service, and returns the calls it made, plus libraryCalls.
func appCalls(t *testing.T) []apiCall {
	t.Helper()
	const node = "node-a"
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-web"},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
	client := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		svc,
		&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1",
			Labels: map[string]string{discovery.LabelServiceName: "web"}}, AddressType: discovery.AddressTypeIPv4},
	)
	progress := make(chan string, 64)
	note := func(s string) {
		select {
		case progress <- s:
		default:
		}
	}
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		note("watch " + a.GetResource().Resource)
		return false, nil, nil
	})
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		note("event")
		return false, nil, nil
	})

	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o := config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--hostname-override=" + node}); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	modes := app.Modes{string(o.ProxyMode()): {
		NewBackend: func(_ context.Context, _ *config.Options, env app.Env) (app.Backends, error) {
			return app.Backends{{Family: v1.IPv4Protocol, Backend: warningBackend{}}}, nil
		},
	}}
	listen := func(network, _ string) (net.Listener, error) { return net.Listen(network, "127.0.0.1:0") }

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	var wg sync.WaitGroup
	wg.Go(func() {
		err := app.RunWith(ctx, o, app.Deps{Modes: modes, Client: client, Listen: listen,
			HealthCheckIPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
		if err != nil {
			t.Errorf("kproxy: %v", err)
		}
	})
	defer func() { cancel(); wg.Wait() }()

	// A deadlock guard, not a measurement.
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	pending := map[string]bool{"watch services": true, "watch endpointslices": true, "watch nodes": true}
	events := 0
	for len(pending) > 0 || events < 2 {
		select {
		case p := <-progress:
			if p == "event" {
				events++
			}
			delete(pending, p)
		case <-guard.C:
			t.Fatalf("kproxy did not watch %v and record 2 events (got %d)", pending, events)
		}
	}
	return append(callsOf(client.Actions()), libraryCalls...)
}
