package windows

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

const checkCalls = "ListEndpoints=1 ListLoadBalancers=1"

// An out-of-band deletion and an HNS restart are repaired by the first sync
// one check period later, not at the 5-minute resync; in between, a sync with
// no change makes no call, and a check that finds everything costs two
// listings.
func TestBackendCheckRepairsWithinOneSyncPeriod(t *testing.T) {
	h := newHarness(t, l2bridgeNet, hnsModern, func(o *Options) { o.CheckPeriod = 30 * time.Second })
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
	mustEqual(t, "after the repair", h.f.Dump(), webAndDNSDump)

	h.f.Restart() // HNS restarts: load balancers and remote endpoints lost
	h.clock.Step(30 * time.Second)
	expectCalls(t, "HNS restarted", h.mustSync(s, proxy.Changes{}), "CreateEndpoint=3 CreateLoadBalancer=3 GetNetwork=1 ListEndpoints=1 ListLoadBalancers=2")
	mustEqual(t, "after the restart", h.f.Dump(), webAndDNSDump)

	net2 := h.f.RecreateNetwork(h.net) // the CNI recreates the network
	h.f.AddLocalEndpoint(net2, mustAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(net2, mustAddr("10.244.1.6"), "pod-b")
	h.clock.Step(30 * time.Second)
	if _, err := h.sync(s, proxy.Changes{}); err != nil {
		t.Fatalf("sync after the network was recreated: %v", err)
	}
	mustEqual(t, "after the network was recreated", h.f.Dump(), webAndDNSDump)
}

// A pod on a node whose subnet HNS learnt after the last listing gets that
// node's provider address at its first programming, without waiting for
// the resync; the network is read once for it, not at every sync.
func TestBackendNewRemoteSubnetOnFirstSync(t *testing.T) {
	h := newHarness(t, overlayNet(), hnsModern, func(o *Options) { o.CheckPeriod = -1 })
	base := svcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080)))
	h.mustSync(snap(node(), base), proxy.Changes{Full: true})

	// node4 joins: flannel adds its subnet to the network, then a pod there
	// becomes an endpoint.
	h.f.SetRemoteSubnets(h.net, append(overlayNet().RemoteSubnets,
		RemoteSubnet{DestinationPrefix: "10.244.4.0/24", ProviderAddress: "10.0.0.4", IsolationID: 4096}))
	grown := svcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080), remoteEP("10.244.4.7", 8080)))
	calls := h.mustSync(snap(node(), grown), changed)
	if !strings.Contains(h.f.Dump(), "ep 10.244.4.7 remote pa=10.0.0.4 ") {
		t.Errorf("the new node's pod must get its provider address at once:\n%s", h.f.Dump())
	}
	if calls[OpGetNetwork] != 1 || calls[OpDeleteEndpoint] != 0 {
		t.Errorf("new subnet: calls %s, want one network read and no endpoint churn", callsString(calls))
	}

	// An address outside every subnet (a public IP): read once, then not again.
	public := svcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080), remoteEP("10.244.4.7", 8080), remoteEP("192.0.2.9", 8080)))
	calls = h.mustSync(snap(node(), public), changed)
	if calls[OpGetNetwork] != 1 {
		t.Errorf("outside every subnet: calls %s, want one network read", callsString(calls))
	}
	calls = h.mustSync(snap(node(), public), changed)
	if calls[OpGetNetwork] != 0 {
		t.Errorf("same address again: calls %s, want no network read", callsString(calls))
	}
}

// overlayNet is the overlay network of the tests, named as the harness expects.
func overlayNet() Network {
	n := overlay
	n.Name = "net"
	n.RemoteSubnets = append([]RemoteSubnet(nil), overlay.RemoteSubnets...)
	return n
}

// HNS calls take time, and the runner counts its intervals from the start
// of a run: the check is due at the first sync one period after the start
// of the sync that listed or checked, not one period after its HNS calls
// returned (that would skip a check and repair only a period later).
func TestBackendCheckCadenceWithSlowHNS(t *testing.T) {
	h := newHarness(t, l2bridgeNet, hnsModern, func(o *Options) { o.CheckPeriod = 30 * time.Second })
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
	mustEqual(t, "after the repair", h.f.Dump(), webAndDNSDump)

	// And again from a check (not a listing): the next one is due one
	// period after that sync began.
	h.clock.SetTime(start.Add(60 * time.Second))
	expectCalls(t, "second period", h.mustSync(s, proxy.Changes{}), checkCalls)
	removeLB("10.96.0.10")
	h.clock.SetTime(start.Add(90 * time.Second))
	expectCalls(t, "third period", h.mustSync(s, proxy.Changes{}), "CreateLoadBalancer=1 GetNetwork=1 ListEndpoints=1 ListLoadBalancers=2")
	mustEqual(t, "after the second repair", h.f.Dump(), webAndDNSDump)
}
