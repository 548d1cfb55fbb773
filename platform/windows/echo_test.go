package windows

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// echoSnap uses every field HNS may not return: a NodePort (port mapping
// flags), ClientIP affinity (distribution), DSR (load balancer flags), and
// on overlay the source VIP and remote endpoints' provider addresses.
func echoSnap() *proxy.Snapshot {
	return snap(node(),
		svcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, nodePort(30080), affinity(defaultAffinitySeconds),
			eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080), remoteEP("10.244.3.5", 8080))),
	)
}

// An HNS that does not return the provider address policy, the port mapping
// flags, the distribution type, the source VIP or the DSR flag: the resync
// and the per-period check find nothing to change, so nothing is deleted
// and created again.
func TestBackendNoReprogrammingWhenHNSDropsFields(t *testing.T) {
	for _, v := range []Version{hnsModern, {Major: 15, Minor: 4}} {
		t.Run(v.String(), func(t *testing.T) {
			h := newHarness(t, overlayNet(), v, func(o *Options) { o.EnableDSR = true; o.CheckPeriod = 30 * time.Second })
			h.f.DropOnRead(DropUnechoed)
			s := echoSnap()
			h.mustSync(s, proxy.Changes{Full: true})
			want := h.f.Dump()

			expectCalls(t, "right after", h.mustSync(s, changed), "")
			h.clock.Step(30 * time.Second)
			expectCalls(t, "check", h.mustSync(s, proxy.Changes{}), checkCalls)
			for i := range 3 {
				h.clock.Step(DefaultResyncPeriod)
				expectCalls(t, "resync "+string(rune('1'+i)), h.mustSync(s, proxy.Changes{}), listCalls)
			}
			mustEqual(t, "after resyncs", h.f.Dump(), want)
		})
	}
}

// What HNS does return is still reconciled: a load balancer whose port
// mapping flags read back differ (not just missing) is reprogrammed.
func TestBackendEchoedDifferenceIsRepaired(t *testing.T) {
	h := newHarness(t, overlayNet(), hnsModern)
	s := echoSnap()
	h.mustSync(s, proxy.Changes{Full: true})
	want := h.f.Dump()
	for _, lb := range h.f.LoadBalancers() {
		if lb.PortMappings[0].ExternalPort == 30080 {
			h.f.RemoveLoadBalancer(lb.ID)
			lb.PortMappings[0].Flags = PortFlagVIPExternalIP // someone changed it out of band
			h.f.AddLoadBalancer(lb)
		}
	}
	h.clock.Step(DefaultResyncPeriod)
	calls := h.mustSync(s, proxy.Changes{})
	if calls[OpUpdateLoadBalancer] != 1 {
		t.Errorf("resync: calls %s, want the changed load balancer updated", callsString(calls))
	}
	mustEqual(t, "after the repair", h.f.Dump(), want)
}
