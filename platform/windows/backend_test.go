package windows

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// harness runs a Backend against a fakehns.Fake with a fake clock.
type harness struct {
	t     *testing.T
	f     *fakehns.Fake
	clock *clocktesting.FakeClock
	b     *Backend
	net   string
	warns []string
	// reported are the warnings of the last sync (see sync).
	reported map[string]bool
}

var changed = proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{{}: {}}} // "something changed"

func newHarness(t *testing.T, n hns.Network, v hns.Version, mod ...func(*Options)) *harness {
	t.Helper()
	h := &harness{t: t, f: fakehns.New(v), clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	h.net = h.f.AddNetwork(n)
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.6"), "pod-b")
	h.b = h.newBackend(mod...)
	h.f.ResetCalls()
	return h
}

func (h *harness) newBackend(mod ...func(*Options)) *Backend {
	opts := Options{
		HNS:         h.f,
		NetworkName: "net",
		SourceVIP:   wt.MustAddr("10.244.1.250"),
		Clock:       h.clock,
		Interfaces: func() ([]HostInterface, error) {
			return []HostInterface{{Name: "Ethernet", MAC: "00-15-5d-00-00-01", Addrs: addrs("10.0.0.1")}}, nil
		},
	}
	for _, m := range mod {
		m(&opts)
	}
	b, err := New(opts)
	if err != nil {
		h.t.Fatal(err)
	}
	return b
}

func addrs(list ...string) (out []netip.Addr) {
	for _, s := range list {
		out = append(out, wt.MustAddr(s))
	}
	return out
}

// sync runs one sync and returns its error and the HNS calls it made.
func (h *harness) sync(s *proxy.Snapshot, ch proxy.Changes) (map[string]int, error) {
	h.t.Helper()
	h.f.ResetCalls()
	err := syncSnap(context.Background(), h.b, s, ch)
	// Warnings as the app reports them: each (Service, reason) once while
	// it applies, again if it comes back.
	cur := map[string]bool{}
	for _, u := range h.b.Unsupported() {
		k := u.Service.String() + " " + u.Reason
		cur[k] = true
		if !h.reported[k] {
			h.warns = append(h.warns, k)
		}
	}
	h.reported = cur
	return h.f.Calls(), err
}

func (h *harness) mustSync(s *proxy.Snapshot, ch proxy.Changes) map[string]int {
	h.t.Helper()
	calls, err := h.sync(s, ch)
	if err != nil {
		h.t.Fatalf("sync: %v", err)
	}
	return calls
}

func callsString(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func expectCalls(t *testing.T, step string, got map[string]int, want string) {
	t.Helper()
	if s := callsString(got); s != want {
		t.Errorf("%s: HNS calls\n got: %s\nwant: %s", step, s, want)
	}
}

const listCalls = "GetNetwork=1 ListEndpoints=1 ListLoadBalancers=1"

func node() []string { return []string{"10.0.0.1"} }

// Two Services: web (NodePort, one local and two remote endpoints) and dns.
func webAndDNS(webEPs ...proxy.Endpoint) *proxy.Snapshot {
	if webEPs == nil {
		webEPs = []proxy.Endpoint{wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.5", 8080)}
	}
	return wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(webEPs...)),
		wt.SvcPort("dns", v1.ProtocolUDP, "10.96.0.53", 53, wt.Eps(wt.RemoteEP("10.244.2.9", 53), wt.LocalEP("10.244.1.6", 53))),
	)
}

const webAndDNSDump = `lb TCP *:30080 -> 8080 flags=0 pflags=18 dist=0 eps=10.244.1.5,10.244.2.5,10.244.3.5
lb TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.1.5,10.244.2.5,10.244.3.5
lb UDP 10.96.0.53:53 -> 53 flags=0 pflags=0 dist=0 eps=10.244.1.6,10.244.2.9
ep 10.244.1.5 local name=pod-a
ep 10.244.1.6 local name=pod-b
ep 10.244.2.5 remote name=kproxy-remote-10.244.2.5
ep 10.244.2.9 remote name=kproxy-remote-10.244.2.9
ep 10.244.3.5 remote name=kproxy-remote-10.244.3.5
`

func TestBackendLifecycle(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)

	calls := h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	expectCalls(t, "first sync", calls, "CreateEndpoint=3 CreateLoadBalancer=3 "+listCalls+" Version=1")
	wt.MustEqual(t, "after the first sync", h.f.Dump(), webAndDNSDump)

	calls = h.mustSync(webAndDNS(), proxy.Changes{})
	expectCalls(t, "no change", calls, "")
	calls = h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	expectCalls(t, "full sync, nothing changed", calls, "")

	// One remote endpoint replaced by another: one endpoint created, the two
	// load balancers holding it updated, the old endpoint deleted.
	churned := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.6", 8080))
	calls = h.mustSync(churned, changed)
	expectCalls(t, "endpoint churn", calls, "CreateEndpoint=1 DeleteEndpoint=1 UpdateLoadBalancer=2")
	wt.MustEqual(t, "after churn", h.f.Dump(), strings.NewReplacer("10.244.3.5", "10.244.3.6").Replace(webAndDNSDump))

	// One endpoint removed: the two load balancers and one endpoint deletion.
	shrunk := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))
	calls = h.mustSync(shrunk, changed)
	expectCalls(t, "endpoint removed", calls, "DeleteEndpoint=1 UpdateLoadBalancer=2")

	// The web Service deleted: its load balancers and its remote endpoint go;
	// local endpoints stay.
	calls = h.mustSync(wt.Snap(node(), wt.SvcPort("dns", v1.ProtocolUDP, "10.96.0.53", 53, wt.Eps(wt.RemoteEP("10.244.2.9", 53), wt.LocalEP("10.244.1.6", 53)))), changed)
	expectCalls(t, "service deleted", calls, "DeleteEndpoint=1 DeleteLoadBalancer=2")
	wt.MustEqual(t, "after service deletion", h.f.Dump(), `lb UDP 10.96.0.53:53 -> 53 flags=0 pflags=0 dist=0 eps=10.244.1.6,10.244.2.9
ep 10.244.1.5 local name=pod-a
ep 10.244.1.6 local name=pod-b
ep 10.244.2.9 remote name=kproxy-remote-10.244.2.9
`)

	// Everything deleted.
	calls = h.mustSync(wt.Snap(node()), changed)
	expectCalls(t, "all deleted", calls, "DeleteEndpoint=1 DeleteLoadBalancer=1")
	wt.MustEqual(t, "empty", h.f.Dump(), "ep 10.244.1.5 local name=pod-a\nep 10.244.1.6 local name=pod-b\n")
}

func TestBackendWithoutModifyReplaces(t *testing.T) {
	// HNS 15.4: hcsshim says updates work, but they keep the old endpoints.
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, hns.Version{Major: 15, Minor: 4})
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	churned := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.6", 8080))
	calls := h.mustSync(churned, changed)
	expectCalls(t, "churn on 15.4", calls, "CreateEndpoint=1 CreateLoadBalancer=2 DeleteEndpoint=1 DeleteLoadBalancer=2")
	wt.MustEqual(t, "after churn", h.f.Dump(), strings.NewReplacer("10.244.3.5", "10.244.3.6").Replace(webAndDNSDump))
}

func TestBackendUpdateNotImplementedFallsBack(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	h.f.FailOp(hns.OpUpdateLoadBalancer, hns.NewError(hns.OpUpdateLoadBalancer, hns.CodeNotImplemented, errors.New("not implemented")))
	churned := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.6", 8080))
	calls := h.mustSync(churned, changed)
	// One update refused; from then on, delete and create.
	expectCalls(t, "fallback", calls, "CreateEndpoint=1 CreateLoadBalancer=2 DeleteEndpoint=1 DeleteLoadBalancer=2 UpdateLoadBalancer=1")
	wt.MustEqual(t, "after fallback", h.f.Dump(), strings.NewReplacer("10.244.3.5", "10.244.3.6").Replace(webAndDNSDump))
	calls = h.mustSync(webAndDNS(), changed)
	expectCalls(t, "after fallback", calls, "CreateEndpoint=1 CreateLoadBalancer=2 DeleteEndpoint=1 DeleteLoadBalancer=2")
}

func TestBackendAdoptsLeftoversAtStart(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	// Leftovers of something else: a stale Service, a malformed load balancer.
	stale, _ := h.f.CreateEndpoint(h.net, (&plan.EndpointSpec{IP: wt.MustAddr("10.244.2.77"), Role: plan.RoleRemote, MAC: plan.RemoteMAC(wt.MustAddr("10.244.2.77"))}).HNS(h.net))
	h.f.AddLoadBalancer(hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.77"}, HostComputeEndpoints: []string{stale.ID},
		PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 80}}})
	h.f.AddLoadBalancer(hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.78"}, HostComputeEndpoints: []string{stale.ID}})

	// kproxy restarts: a new backend on the same HNS.
	h.b = h.newBackend()
	calls := h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	expectCalls(t, "restart", calls, "DeleteEndpoint=1 DeleteLoadBalancer=2 "+listCalls+" Version=1")
	wt.MustEqual(t, "after restart", h.f.Dump(), webAndDNSDump)
}

func TestBackendHNSRestartingMidSync(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	// Calls 1-4 list; 5-7 create endpoints; the first load balancer creation
	// finds HNS restarting, and it stays down for a while.
	for n := 8; n < 12; n++ {
		h.f.FailCall(n, hns.NewError("any", hns.CodeManagerStopped, fakehns.ErrFakeRestarting))
	}
	calls, err := h.sync(webAndDNS(), proxy.Changes{Full: true})
	if !hns.IsTransient(err) {
		t.Fatalf("want a transient error, got %v", err)
	}
	expectCalls(t, "interrupted sync", calls, "CreateEndpoint=3 CreateLoadBalancer=1 "+listCalls+" Version=1")

	// The runner retries (with backoff) while HNS is still down.
	calls, err = h.sync(webAndDNS(), proxy.Changes{Full: true})
	if !hns.IsTransient(err) {
		t.Fatalf("retry while down: want a transient error, got %v", err)
	}
	expectCalls(t, "retry while down", calls, "GetNetwork=1")

	// HNS is back: the retry lists again and finishes the job without
	// duplicating what was created before the interruption.
	h.f.ResetCalls()
	for h.f.TotalCalls() < 2 { // burn the remaining injected failures
		_, _ = h.f.Version()
	}
	calls = h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	expectCalls(t, "recovery", calls, "CreateLoadBalancer=3 "+listCalls)
	wt.MustEqual(t, "after recovery", h.f.Dump(), webAndDNSDump)
}

func TestBackendHNSRestartLosesObjects(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	h.f.Restart() // load balancers and remote endpoints are gone

	// An endpoint change arrives: the updates find their load balancers
	// gone (every other operation still runs), so the backend lists again
	// within the same sync and reprograms everything.
	churned := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.6", 8080))
	calls := h.mustSync(churned, changed)
	expectCalls(t, "repair after an HNS restart", calls, "CreateEndpoint=3 CreateLoadBalancer=3 DeleteEndpoint=1 "+listCalls+" UpdateLoadBalancer=2")
	wt.MustEqual(t, "after repair", h.f.Dump(), strings.NewReplacer("10.244.3.5", "10.244.3.6").Replace(webAndDNSDump))
}

func TestBackendRepairsOutOfBandDeletionOnResync(t *testing.T) {
	// The resync alone (the cheap per-period check is off here; see
	// TestBackendCheckRepairsWithinOneSyncPeriod).
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern, func(o *Options) { o.ResyncPeriod = 10 * time.Minute; o.CheckPeriod = -1 })
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	for _, lb := range h.f.LoadBalancers() {
		if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == "10.96.0.53" {
			h.f.RemoveLoadBalancer(lb.ID) // an operator deletes it
		}
	}
	h.clock.Step(9 * time.Minute)
	expectCalls(t, "before the resync period", h.mustSync(webAndDNS(), proxy.Changes{}), "")
	h.clock.Step(time.Minute)
	expectCalls(t, "resync", h.mustSync(webAndDNS(), proxy.Changes{}), "CreateLoadBalancer=1 "+listCalls)
	wt.MustEqual(t, "after resync", h.f.Dump(), webAndDNSDump)
	expectCalls(t, "after resync, no change", h.mustSync(webAndDNS(), proxy.Changes{}), "")
}

func TestBackendNetworkRecreated(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})

	// The CNI recreates the network: new ID, its endpoints are gone, the pods
	// get new local endpoints; the load balancers refer to deleted endpoints.
	h.net = h.f.RecreateNetwork(h.net)
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.6"), "pod-b")

	// The network is checked whenever HNS is listed. Without a change, that
	// is the slow resync; a change that touches HNS finds out sooner (below).
	expectCalls(t, "no change, no resync yet", h.mustSync(webAndDNS(), changed), "")
	h.clock.Step(DefaultResyncPeriod)
	calls := h.mustSync(webAndDNS(), proxy.Changes{})
	// The old load balancers refer to endpoints that are not in the network:
	// deleted; everything is created again on the new network.
	expectCalls(t, "resync after the network was recreated", calls, "CreateEndpoint=3 CreateLoadBalancer=3 DeleteLoadBalancer=3 "+listCalls)
	wt.MustEqual(t, "after the network was recreated", h.f.Dump(), webAndDNSDump)
	expectCalls(t, "then no change", h.mustSync(webAndDNS(), proxy.Changes{}), "")

	// Again, but an endpoint change arrives before the resync: creating its
	// endpoint on the old network fails (the other operations still run),
	// so the sync lists and starts over.
	h.net = h.f.RecreateNetwork(h.net)
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.6"), "pod-b")
	churned := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.6", 8080))
	calls = h.mustSync(churned, changed)
	expectCalls(t, "change after the network was recreated", calls, "CreateEndpoint=4 CreateLoadBalancer=3 DeleteEndpoint=1 DeleteLoadBalancer=3 "+listCalls+" UpdateLoadBalancer=2")
	wt.MustEqual(t, "after the change", h.f.Dump(), strings.NewReplacer("10.244.3.5", "10.244.3.6").Replace(webAndDNSDump))
}

func TestBackendWaitsForNetwork(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "other", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	_, err := h.sync(webAndDNS(), proxy.Changes{Full: true})
	if !hns.IsNotFound(err) || !strings.Contains(err.Error(), `waiting for HNS network "net"`) {
		t.Fatalf("want a not-found error waiting for the network, got %v", err)
	}
	for _, ep := range h.f.Endpoints() {
		h.f.RemoveEndpoint(ep.ID) // they were on the other network
	}
	h.net = h.f.AddNetwork(hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge})
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.6"), "pod-b")
	calls := h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	expectCalls(t, "network appeared", calls, "CreateEndpoint=3 CreateLoadBalancer=3 "+listCalls)
	wt.MustEqual(t, "programmed", h.f.Dump(), webAndDNSDump)
}

func TestBackendAlreadyExistsAdopts(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	// Between two syncs, another kproxy instance (or an operator) creates the
	// very load balancer this one is about to create.
	ids := map[string]string{}
	for _, ep := range h.f.Endpoints() {
		ids[ep.IPConfigurations[0].IPAddress] = ep.ID
	}
	h.f.AddLoadBalancer(hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, HostComputeEndpoints: []string{ids["10.244.1.6"]},
		PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 81, InternalPort: 9090}}})
	s := webAndDNS()
	withNew := wt.Snap(node(), append(s.IPv4.Sorted(), wt.SvcPort("new", v1.ProtocolTCP, "10.96.0.11", 81, wt.Eps(wt.LocalEP("10.244.1.6", 9090))))...)
	calls := h.mustSync(withNew, changed)
	expectCalls(t, "conflict then adoption", calls, "CreateLoadBalancer=1 "+listCalls)
	if n := len(h.f.LoadBalancers()); n != 4 {
		t.Errorf("%d load balancers, want 4", n)
	}
}

func TestBackendLocalEndpointAppearsLater(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern, func(o *Options) { o.CheckPeriod = -1 })
	late := wt.Snap(node(), wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.7", 8080), wt.RemoteEP("10.244.2.5", 8080))))
	h.mustSync(late, proxy.Changes{Full: true})
	wt.MustEqual(t, "without the missing local endpoint", h.f.Dump(), `lb TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.2.5
ep 10.244.1.5 local name=pod-a
ep 10.244.1.6 local name=pod-b
ep 10.244.2.5 remote name=kproxy-remote-10.244.2.5
`)
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.7"), "pod-c")
	// Within a minute, a sync does not list again for the same missing address.
	expectCalls(t, "still missing", h.mustSync(late, changed), "")
	h.clock.Step(missingRecheck)
	expectCalls(t, "recheck", h.mustSync(late, changed), "ListEndpoints=1 UpdateLoadBalancer=1")
	if !strings.Contains(h.f.Dump(), "eps=10.244.1.7,10.244.2.5") {
		t.Errorf("local endpoint not added:\n%s", h.f.Dump())
	}
}

func TestBackendOverlay(t *testing.T) {
	h := newHarness(t, overlayNamed("net"), wt.HNSModern)
	calls := h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	expectCalls(t, "overlay", calls, "CreateEndpoint=6 CreateLoadBalancer=3 "+listCalls+" Version=1")
	wt.MustEqual(t, "overlay", h.f.Dump(), `lb TCP *:30080 -> 8080 flags=0 pflags=18 dist=0 src=10.244.1.250 eps=10.244.1.5,10.244.2.5,10.244.3.5
lb TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src=10.244.1.250 eps=10.244.1.5,10.244.2.5,10.244.3.5
lb UDP 10.96.0.53:53 -> 53 flags=0 pflags=0 dist=0 src=10.244.1.250 eps=10.244.1.6,10.244.2.9
ep 10.96.0.10 remote pa=10.0.0.1 name=kproxy-servicevip-10.96.0.10
ep 10.96.0.53 remote pa=10.0.0.1 name=kproxy-servicevip-10.96.0.53
ep 10.244.1.5 local name=pod-a
ep 10.244.1.6 local name=pod-b
ep 10.244.1.250 local name=kproxy-sourcevip-10.244.1.250
ep 10.244.2.5 remote pa=10.0.0.2 name=kproxy-remote-10.244.2.5
ep 10.244.2.9 remote pa=10.0.0.2 name=kproxy-remote-10.244.2.9
ep 10.244.3.5 remote pa=10.0.0.3 name=kproxy-remote-10.244.3.5
`)
	for _, ep := range h.f.Endpoints() {
		if ep.Name == "kproxy-sourcevip-10.244.1.250" && ep.MacAddress != "00-15-5d-00-00-01" {
			t.Errorf("source VIP endpoint MAC %q, want the host's", ep.MacAddress)
		}
	}
	// A remote subnet moves to another node: the endpoints in it are replaced.
	h.f.SetRemoteSubnets(h.net, []hns.RemoteSubnet{
		{DestinationPrefix: "10.244.2.0/24", ProviderAddress: "10.0.0.22"},
		{DestinationPrefix: "10.244.3.0/24", ProviderAddress: "10.0.0.3"},
	})
	h.clock.Step(DefaultResyncPeriod)
	calls = h.mustSync(webAndDNS(), proxy.Changes{})
	expectCalls(t, "provider address change", calls, "CreateEndpoint=2 CreateLoadBalancer=3 DeleteEndpoint=2 DeleteLoadBalancer=3 "+listCalls)
	if d := h.f.Dump(); !strings.Contains(d, "ep 10.244.2.5 remote pa=10.0.0.22") || !strings.Contains(d, "ep 10.244.2.9 remote pa=10.0.0.22") {
		t.Errorf("provider addresses not updated:\n%s", d)
	}
}

func overlayNamed(name string) hns.Network {
	n := wt.Overlay
	n.Name = name
	return n
}

func TestBackendWarnsOncePerService(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	ranged := func(ranges bool) *proxy.Snapshot {
		opts := []wt.PortOpt{wt.LBIPs("192.168.70.1"), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))}
		if ranges {
			opts = append(opts, wt.SourceRanges("203.0.113.0/24"))
		}
		return wt.Snap(node(), wt.SvcPort("lb", v1.ProtocolTCP, "10.96.0.10", 80, opts...))
	}
	h.mustSync(ranged(true), proxy.Changes{Full: true})
	h.mustSync(ranged(true), changed)
	h.mustSync(ranged(true), proxy.Changes{Full: true})
	if want := []string{"ns/lb LoadBalancerSourceRangesIgnored"}; fmt.Sprint(h.warns) != fmt.Sprint(want) {
		t.Errorf("warnings %v, want %v", h.warns, want)
	}
	h.mustSync(ranged(false), changed)
	h.mustSync(ranged(true), changed)
	if len(h.warns) != 2 {
		t.Errorf("a warning that went away and came back is reported again: %v", h.warns)
	}
}

func TestBackendDualStack(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	v6 := h.newBackend(func(o *Options) { o.Family = v1.IPv6Protocol })
	h.f.AddEndpoint(hns.Endpoint{HostComputeNetwork: h.net, Name: "pod-a6", IPConfigurations: []hns.IPConfig{{IPAddress: "fd00:244:1::5"}}})
	both := wt.Snap([]string{"10.0.0.1", "fd00::1"},
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
		wt.SvcPort("web", v1.ProtocolTCP, "fd00:10:96::10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("fd00:244:1::5", 8080), wt.RemoteEP("fd00:244:2::5", 8080))),
	)
	h.mustSync(both, proxy.Changes{Full: true})
	if err := syncSnap(context.Background(), v6, both, proxy.Changes{Full: true}); err != nil {
		t.Fatal(err)
	}
	want := h.f.Dump()
	if n := len(h.f.LoadBalancers()); n != 4 {
		t.Fatalf("%d load balancers, want 2 per family:\n%s", n, want)
	}
	// A restart of the IPv4 backend adopts its own and leaves IPv6 alone.
	h.b = h.newBackend()
	expectCalls(t, "IPv4 restart", h.mustSync(both, proxy.Changes{Full: true}), listCalls+" Version=1")
	wt.MustEqual(t, "after the IPv4 restart", h.f.Dump(), want)
}

func TestBackendMetrics(t *testing.T) {
	m := &recordingMetrics{}
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern, func(o *Options) { o.Metrics = m })
	h.f.FailOp(hns.OpCreateLoadBalancer, hns.NewError(hns.OpCreateLoadBalancer, hns.CodeInvalidArg, errors.New("bad")))
	_, err := h.sync(webAndDNS(), proxy.Changes{Full: true})
	if err != nil {
		t.Fatal(err) // the rejected load balancer is isolated (quarantine_test.go)
	}
	if q := h.b.Quarantined(); len(q) != 1 {
		t.Errorf("want the rejected load balancer's port quarantined, got %+v", q)
	}
	if m.calls[hns.OpCreateLoadBalancer] != 3 || m.calls[hns.OpVersion] != 1 {
		t.Errorf("latency observations %v", m.calls)
	}
	if fmt.Sprint(m.errors) != "[CreateLoadBalancer 0x80070057]" {
		t.Errorf("errors %v", m.errors)
	}
}

type recordingMetrics struct {
	mu     sync.Mutex
	calls  map[string]int
	errors []string
}

func (m *recordingMetrics) HNSCall(op string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.calls == nil {
		m.calls = map[string]int{}
	}
	m.calls[op]++
}

func (m *recordingMetrics) HNSError(op, code string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.errors = append(m.errors, op+" "+code)
}

func TestBackendDryRun(t *testing.T) {
	s := wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))))

	t.Run("offline", func(t *testing.T) {
		b, err := New(Options{NetworkName: "vxlan0", SourceVIP: wt.MustAddr("10.244.1.250"),
			Interfaces: func() ([]HostInterface, error) { return nil, errors.New("none") },
			Offline:    OfflineFacts{Network: &wt.Overlay}})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := b.DryRun(&buf, FullView(v1.IPv4Protocol, s)); err != nil {
			t.Fatal(err)
		}
		golden(t, "dryrun/offline-overlay", buf.String())
		if err := syncSnap(context.Background(), b, s, proxy.Changes{Full: true}); !errors.Is(err, ErrDryRunOnly) {
			t.Errorf("Sync without HNS: %v", err)
		}
	})

	t.Run("online", func(t *testing.T) {
		h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
		var buf bytes.Buffer
		if err := h.b.DryRun(&buf, FullView(v1.IPv4Protocol, s)); err != nil {
			t.Fatal(err)
		}
		if c := h.f.Calls(); c[hns.OpCreateEndpoint]+c[hns.OpCreateLoadBalancer]+c[hns.OpDeleteEndpoint]+c[hns.OpDeleteLoadBalancer]+c[hns.OpUpdateLoadBalancer] != 0 {
			t.Errorf("dry run changed HNS: %s", callsString(c))
		}
		var out DryRunOutput
		if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		if out.Offline || len(out.Operations) != 3 || len(out.LoadBalancers) != 2 || len(out.Endpoints) != 1 {
			t.Errorf("online dry run: %s", buf.String())
		}
		// Existing endpoints are referred to by HNS ID, new ones by address.
		refs := strings.Join(out.LoadBalancers[0].HostComputeEndpoints, " ")
		if !strings.Contains(refs, "10.244.2.5") || strings.Contains(refs, "10.244.1.5") {
			t.Errorf("endpoint references %q", refs)
		}
		// The dry run did not stand in for the first listing.
		expectCalls(t, "first sync after a dry run", h.mustSync(s, proxy.Changes{Full: true}), "CreateEndpoint=1 CreateLoadBalancer=2 "+listCalls+" Version=1")
	})
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"no network name", Options{}},
		{"bad family", Options{NetworkName: "n", Family: "IPv5"}},
		{"bad healthz port", Options{NetworkName: "n", HealthzPort: 70000}},
	} {
		if _, err := New(tc.opts); err == nil {
			t.Errorf("%s: want an error", tc.name)
		}
	}
}

func TestBackendCleanup(t *testing.T) {
	h := newHarness(t, overlayNamed("net"), wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	// Something the CNI owns, which cleanup must leave alone.
	h.f.AddEndpoint(hns.Endpoint{HostComputeNetwork: h.net, Name: "cbr0", IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.1.2"}}})
	if err := h.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	wt.MustEqual(t, "after cleanup", h.f.Dump(), `ep 10.244.1.2 local name=cbr0
ep 10.244.1.5 local name=pod-a
ep 10.244.1.6 local name=pod-b
`)
	// The next sync lists again and programs everything.
	calls := h.mustSync(webAndDNS(), proxy.Changes{})
	expectCalls(t, "sync after cleanup", calls, "CreateEndpoint=6 CreateLoadBalancer=3 "+listCalls)
}

func TestNodeIPChoice(t *testing.T) {
	s := wt.Snap([]string{"10.0.0.1", "192.0.2.10", "fd00::1"})
	ifaces := []HostInterface{{Name: "Ethernet 2", MAC: "00-15-5d-00-00-02", Addrs: addrs("192.0.2.10")}}
	for _, tc := range []struct {
		name   string
		opts   Options
		ifaces []HostInterface
		want   string
	}{
		{"first address of the family", Options{Family: v1.IPv4Protocol}, nil, "10.0.0.1"},
		{"the one a host interface holds", Options{Family: v1.IPv4Protocol}, ifaces, "192.0.2.10"},
		{"explicit", Options{Family: v1.IPv4Protocol, NodeIP: wt.MustAddr("10.0.0.9")}, ifaces, "10.0.0.9"},
		{"explicit of the other family is ignored", Options{Family: v1.IPv4Protocol, NodeIP: wt.MustAddr("fd00::9")}, nil, "10.0.0.1"},
		{"IPv6", Options{Family: v1.IPv6Protocol}, ifaces, "fd00::1"},
	} {
		f := GatherFacts(&tc.opts, hns.Capabilities{}, nil, tc.ifaces, nil, s.Node)
		if f.NodeIP.String() != tc.want {
			t.Errorf("%s: node IP %s, want %s", tc.name, f.NodeIP, tc.want)
		}
		if tc.name == "the one a host interface holds" && f.HostMAC != "00-15-5d-00-00-02" {
			t.Errorf("%s: host MAC %q, want the interface's", tc.name, f.HostMAC)
		}
	}
}
