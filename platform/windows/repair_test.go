package windows

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

const checkCalls = "ListEndpoints=1 ListLoadBalancers=1"

// overlayCheckCalls: on overlay, the check also reads the network's remote
// subnets (a node's new route or provider address).
const overlayCheckCalls = "GetNetwork=1 " + checkCalls

// An out-of-band deletion and an HNS restart are repaired by the first sync
// one check period later, not at the 5-minute resync; in between, a sync with
// no change makes no call, and a check that finds everything costs two
// listings.
func TestBackendCheckRepairsWithinOneSyncPeriod(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern, func(o *Options) { o.CheckPeriod = 30 * time.Second })
	s := webAndDNS()
	h.mustSync(s, proxy.Changes{Full: true})

	h.clock.Step(30 * time.Second)
	expectCalls(t, "check, nothing lost", h.mustSync(s, proxy.Changes{}), checkCalls)
	expectCalls(t, "right after the check", h.mustSync(s, proxy.Changes{}), "")

	for _, lb := range h.f.LoadBalancers() {
		if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == "10.96.0.53" {
			h.f.RemoveLoadBalancer(lb.ID) // an operator deletes it
		}
	}
	h.clock.Step(29 * time.Second)
	expectCalls(t, "before the period", h.mustSync(s, proxy.Changes{}), "")
	h.clock.Step(time.Second)
	expectCalls(t, "load balancer deleted", h.mustSync(s, proxy.Changes{}), "CreateLoadBalancer=1 GetNetwork=1 ListEndpoints=1 ListLoadBalancers=2")
	wt.MustEqual(t, "after the repair", h.f.Dump(), webAndDNSDump)

	h.f.Restart() // HNS restarts: load balancers and remote endpoints lost
	h.clock.Step(30 * time.Second)
	expectCalls(t, "HNS restarted", h.mustSync(s, proxy.Changes{}), "CreateEndpoint=3 CreateLoadBalancer=3 GetNetwork=1 ListEndpoints=1 ListLoadBalancers=2")
	wt.MustEqual(t, "after the restart", h.f.Dump(), webAndDNSDump)

	net2 := h.f.RecreateNetwork(h.net) // the CNI recreates the network
	h.f.AddLocalEndpoint(net2, wt.MustAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(net2, wt.MustAddr("10.244.1.6"), "pod-b")
	h.clock.Step(30 * time.Second)
	if _, err := h.sync(s, proxy.Changes{}); err != nil {
		t.Fatalf("sync after the network was recreated: %v", err)
	}
	wt.MustEqual(t, "after the network was recreated", h.f.Dump(), webAndDNSDump)
}

// A pod on a node whose subnet HNS learnt after the last listing gets that
// node's provider address at its first programming, without waiting for
// the resync; the network is read once for it, not at every sync.
func TestBackendNewRemoteSubnetOnFirstSync(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern, func(o *Options) { o.CheckPeriod = -1 })
	base := wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080)))
	h.mustSync(wt.Snap(node(), base), proxy.Changes{Full: true})

	// node4 joins: flannel adds its subnet to the network, then a pod there
	// becomes an endpoint.
	h.f.SetRemoteSubnets(h.net, append(overlayNet().RemoteSubnets,
		hns.RemoteSubnet{DestinationPrefix: "10.244.4.0/24", ProviderAddress: "10.0.0.4", IsolationID: 4096}))
	grown := wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.4.7", 8080)))
	calls := h.mustSync(wt.Snap(node(), grown), changed)
	if !strings.Contains(h.f.Dump(), "ep 10.244.4.7 remote pa=10.0.0.4 ") {
		t.Errorf("the new node's pod must get its provider address at once:\n%s", h.f.Dump())
	}
	if calls[hns.OpGetNetwork] != 1 || calls[hns.OpDeleteEndpoint] != 0 {
		t.Errorf("new subnet: calls %s, want one network read and no endpoint churn", callsString(calls))
	}

	// An address outside every subnet (a public IP, or a pod of a node
	// whose route HNS has not yet): it gets this node's provider address,
	// and the network is read again at every sync while it has none other,
	// one call each (a route may appear at any time).
	public := wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.4.7", 8080), wt.RemoteEP("192.0.2.9", 8080)))
	calls = h.mustSync(wt.Snap(node(), public), changed)
	if calls[hns.OpGetNetwork] != 1 {
		t.Errorf("outside every subnet: calls %s, want one network read", callsString(calls))
	}
	calls = h.mustSync(wt.Snap(node(), public), changed)
	if calls[hns.OpGetNetwork] != 1 || calls[hns.OpDeleteEndpoint] != 0 || calls[hns.OpCreateEndpoint] != 0 {
		t.Errorf("same address again: calls %s, want one network read and nothing else", callsString(calls))
	}
}

// A remote endpoint created before its node's route exists gets this
// node's provider address; once the route appears, the next sync, whatever
// brings it, gives the endpoint its node's provider address (not the next
// full listing, up to 5 minutes later).
func TestBackendLateRouteRefreshesProviderAddress(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern, func(o *Options) { o.CheckPeriod = -1 })
	late := wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.4.7", 8080)))
	h.mustSync(wt.Snap(node(), late), proxy.Changes{Full: true})
	if !strings.Contains(h.f.Dump(), "ep 10.244.4.7 remote pa=10.0.0.1 ") {
		t.Fatalf("before the route: want this node's provider address:\n%s", h.f.Dump())
	}
	h.f.SetRemoteSubnets(h.net, append(overlayNet().RemoteSubnets,
		hns.RemoteSubnet{DestinationPrefix: "10.244.4.0/24", ProviderAddress: "10.0.0.4", IsolationID: 4096}))
	other := wt.SvcPort("dns", v1.ProtocolUDP, "10.96.0.53", 53, wt.Eps(wt.LocalEP("10.244.1.6", 53)))
	h.clock.Step(time.Second)
	h.mustSync(wt.Snap(node(), late, other), changed) // an unrelated change
	if !strings.Contains(h.f.Dump(), "ep 10.244.4.7 remote pa=10.0.0.4 ") {
		t.Errorf("after the route appeared, at the next sync: want the node's provider address:\n%s", h.f.Dump())
	}
	expectCalls(t, "then no change", h.mustSync(wt.Snap(node(), late, other), changed), "")
}

// overlayNet is the wt.Overlay network of the tests, named as the harness expects.
func overlayNet() hns.Network {
	n := wt.Overlay
	n.Name = "net"
	n.RemoteSubnets = append([]hns.RemoteSubnet(nil), wt.Overlay.RemoteSubnets...)
	return n
}

// HNS calls take time, and the runner counts its intervals from the start
// of a run: the check is due at the first sync one period after the start
// of the sync that listed or checked, not one period after its HNS calls
// returned (that would skip a check and repair only a period later).
func TestBackendCheckCadenceWithSlowHNS(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern, func(o *Options) { o.CheckPeriod = 30 * time.Second })
	h.f.OnCall(func(string) { h.clock.Step(100 * time.Millisecond) }) // every HNS call takes 100 ms
	s := webAndDNS()
	start := h.clock.Now()
	h.mustSync(s, proxy.Changes{Full: true})

	removeLB := func(vip string) {
		for _, lb := range h.f.LoadBalancers() {
			if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == vip {
				h.f.RemoveLoadBalancer(lb.ID)
			}
		}
	}
	removeLB("10.96.0.53")
	// The runner's next run: one sync period after the first one began.
	h.clock.SetTime(start.Add(30 * time.Second))
	expectCalls(t, "first period after the listing", h.mustSync(s, proxy.Changes{}), "CreateLoadBalancer=1 GetNetwork=1 ListEndpoints=1 ListLoadBalancers=2")
	wt.MustEqual(t, "after the repair", h.f.Dump(), webAndDNSDump)

	// And again from a check (not a listing): the next one is due one
	// period after that sync began.
	h.clock.SetTime(start.Add(60 * time.Second))
	expectCalls(t, "second period", h.mustSync(s, proxy.Changes{}), checkCalls)
	removeLB("10.96.0.10")
	h.clock.SetTime(start.Add(90 * time.Second))
	expectCalls(t, "third period", h.mustSync(s, proxy.Changes{}), "CreateLoadBalancer=1 GetNetwork=1 ListEndpoints=1 ListLoadBalancers=2")
	wt.MustEqual(t, "after the second repair", h.f.Dump(), webAndDNSDump)
}
