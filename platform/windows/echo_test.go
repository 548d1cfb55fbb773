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

// echoSnap uses every field HNS may not return: a NodePort (port mapping
// flags), ClientIP affinity (distribution), DSR (load balancer flags), and
// on wt.Overlay the source VIP and remote endpoints' provider addresses.
func echoSnap() *proxy.Snapshot {
	return wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Affinity(10800),
			wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.5", 8080))),
	)
}

// An HNS that does not return the provider address policy, the port mapping
// flags, the distribution type, the source VIP or the DSR flag: the resync
// and the per-period check find nothing to change, so nothing is deleted
// and created again.
func TestBackendNoReprogrammingWhenHNSDropsFields(t *testing.T) {
	for _, v := range []hns.Version{wt.HNSModern, {Major: 15, Minor: 4}} {
		t.Run(v.String(), func(t *testing.T) {
			h := newHarness(t, overlayNet(), v, func(o *Options) { o.EnableDSR = true; o.CheckPeriod = 30 * time.Second })
			h.f.DropOnRead(hns.FieldsUnechoed)
			s := echoSnap()
			h.mustSync(s, proxy.Changes{Full: true})
			want := h.f.Dump()

			expectCalls(t, "right after", h.mustSync(s, changed), "")
			h.clock.Step(30 * time.Second)
			expectCalls(t, "check", h.mustSync(s, proxy.Changes{}), overlayCheckCalls)
			for i := range 3 {
				h.clock.Step(DefaultResyncPeriod)
				expectCalls(t, "resync "+string(rune('1'+i)), h.mustSync(s, proxy.Changes{}), listCalls)
			}
			wt.MustEqual(t, "after resyncs", h.f.Dump(), want)
		})
	}
}

// What HNS does return is still reconciled: a load balancer whose port
// mapping flags read back differ (not just missing) is reprogrammed.
func TestBackendEchoedDifferenceIsRepaired(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern)
	s := echoSnap()
	h.mustSync(s, proxy.Changes{Full: true})
	want := h.f.Dump()
	for _, lb := range h.f.LoadBalancers() {
		if lb.PortMappings[0].ExternalPort == 30080 {
			h.f.RemoveLoadBalancer(lb.ID)
			lb.PortMappings[0].Flags = hns.PortFlagVIPExternalIP // someone changed it out of band
			h.f.AddLoadBalancer(lb)
		}
	}
	h.clock.Step(DefaultResyncPeriod)
	calls := h.mustSync(s, proxy.Changes{})
	if calls[hns.OpUpdateLoadBalancer] != 1 {
		t.Errorf("resync: calls %s, want the changed load balancer updated", callsString(calls))
	}
	wt.MustEqual(t, "after the repair", h.f.Dump(), want)
}

// mutating counts the calls that change HNS.
func mutating(calls map[string]int) int {
	return calls[hns.OpCreateEndpoint] + calls[hns.OpDeleteEndpoint] + calls[hns.OpCreateLoadBalancer] +
		calls[hns.OpUpdateLoadBalancer] + calls[hns.OpDeleteLoadBalancer]
}

// A kproxy restart (a new backend, with an empty record, over the same HNS)
// on an HNS that leaves fields out: what HNS did not say and kproxy has no
// record of is unknown, adopted as planned, never a difference; nothing is
// deleted, created or updated. The adopted values are kept as a record: a
// later real change (a remote subnet moving to another node) is still
// programmed.
func TestBackendRestartWhenHNSDropsFields(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v     hns.Version
		drops hns.Fields
	}{
		{"15.5 unechoed", wt.HNSModern, hns.FieldsUnechoed},
		{"15.4 unechoed", hns.Version{Major: 15, Minor: 4}, hns.FieldsUnechoed},
		{"15.5 all", wt.HNSModern, hns.FieldsAll},
		{"15.4 all", hns.Version{Major: 15, Minor: 4}, hns.FieldsAll},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsr := func(o *Options) { o.EnableDSR = true }
			h := newHarness(t, overlayNet(), tc.v, dsr)
			h.f.DropOnRead(tc.drops)
			s := echoSnap()
			h.mustSync(s, proxy.Changes{Full: true})
			want := h.f.Dump()

			h.b = h.newBackend(dsr) // kproxy restarts
			expectCalls(t, "restart", h.mustSync(s, proxy.Changes{Full: true}), listCalls+" Version=1")
			wt.MustEqual(t, "after the restart", h.f.Dump(), want)
			expectCalls(t, "right after", h.mustSync(s, changed), "")
			h.clock.Step(DefaultResyncPeriod)
			expectCalls(t, "resync", h.mustSync(s, proxy.Changes{}), listCalls)

			h.f.SetRemoteSubnets(h.net, []hns.RemoteSubnet{
				{DestinationPrefix: "10.244.2.0/24", ProviderAddress: "10.0.0.22"},
				{DestinationPrefix: "10.244.3.0/24", ProviderAddress: "10.0.0.3"},
			})
			h.clock.Step(DefaultResyncPeriod)
			calls := h.mustSync(s, proxy.Changes{})
			if calls[hns.OpCreateEndpoint] != 1 || calls[hns.OpDeleteEndpoint] != 1 {
				t.Errorf("subnet moved: calls %s, want its endpoint replaced", callsString(calls))
			}
			if d := h.f.Dump(); !strings.Contains(d, "ep 10.244.2.5 remote pa=10.0.0.22") {
				t.Errorf("provider address not updated:\n%s", d)
			}
			h.b = h.newBackend(dsr) // and restarts again
			expectCalls(t, "second restart", h.mustSync(s, proxy.Changes{Full: true}), listCalls+" Version=1")
		})
	}
}

// A restart on an HNS that drops every field, after Services changed while
// kproxy was away: the load balancers it cannot match (their frontend VIPs
// are not said) are replaced within the first sync, without a failed sync,
// and the next syncs change nothing. Endpoints it no longer needs are left:
// with neither names nor MACs returned, nothing says they are kproxy's.
func TestBackendRestartWithoutVIPsAfterChanges(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern)
	h.f.DropOnRead(hns.FieldsAll)
	before := wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
		wt.SvcPort("api", v1.ProtocolTCP, "10.96.0.11", 80, wt.Eps(wt.RemoteEP("10.244.3.5", 8080))),
		wt.SvcPort("gone", v1.ProtocolTCP, "10.96.0.12", 80, wt.Eps(wt.RemoteEP("10.244.3.6", 8080))),
	)
	h.mustSync(before, proxy.Changes{Full: true})
	// While kproxy is away: web's endpoints change, gone is deleted, new appears.
	after := wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.6", 8080))),
		wt.SvcPort("api", v1.ProtocolTCP, "10.96.0.11", 80, wt.Eps(wt.RemoteEP("10.244.3.5", 8080))),
		wt.SvcPort("new", v1.ProtocolTCP, "10.96.0.13", 80, wt.Eps(wt.RemoteEP("10.244.3.7", 8080))),
	)
	fresh := newHarness(t, overlayNet(), wt.HNSModern)
	fresh.mustSync(after, proxy.Changes{Full: true})
	want := fresh.f.Dump()

	h.b = h.newBackend()
	calls := h.mustSync(after, proxy.Changes{Full: true})
	if calls[hns.OpUpdateLoadBalancer]+calls[hns.OpDeleteLoadBalancer] == 0 {
		t.Errorf("restart: calls %s, want the changed load balancers reprogrammed", callsString(calls))
	}
	lines := func(dump, prefix string) (out []string) {
		for _, l := range strings.Split(dump, "\n") {
			if strings.HasPrefix(l, prefix) {
				out = append(out, l)
			}
		}
		return out
	}
	got := h.f.Dump()
	wt.MustEqual(t, "load balancers after the restart", strings.Join(lines(got, "lb "), "\n"), strings.Join(lines(want, "lb "), "\n"))
	for _, ep := range lines(want, "ep ") {
		if !strings.Contains(got, ep+"\n") {
			t.Errorf("after the restart, HNS lacks %q:\n%s", ep, got)
		}
	}
	expectCalls(t, "right after", h.mustSync(after, changed), "")
	h.clock.Step(DefaultResyncPeriod)
	expectCalls(t, "resync", h.mustSync(after, proxy.Changes{}), listCalls)
}

// What HNS is seen returning is trusted even without a record: after a
// restart on an HNS that returns every field, a load balancer whose source
// VIP and a remote endpoint whose provider address were removed out of band
// are repaired, since other objects show HNS returns those fields.
func TestBackendRestartRepairsWhatHNSShowsItReturns(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern)
	s := echoSnap()
	h.mustSync(s, proxy.Changes{Full: true})
	want := h.f.Dump()
	for _, lb := range h.f.LoadBalancers() {
		if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == "10.96.0.10" {
			h.f.RemoveLoadBalancer(lb.ID)
			lb.SourceVIP = ""
			h.f.AddLoadBalancer(lb)
		}
	}
	for _, ep := range h.f.Endpoints() {
		if ep.Name == "kproxy-remote-10.244.3.5" {
			h.f.RemoveEndpoint(ep.ID)
			ep.Policies = nil
			h.f.AddEndpoint(ep)
		}
	}
	h.b = h.newBackend()
	calls := h.mustSync(s, proxy.Changes{Full: true})
	if calls[hns.OpCreateEndpoint] != 1 || calls[hns.OpDeleteEndpoint] != 1 || calls[hns.OpUpdateLoadBalancer]+calls[hns.OpCreateLoadBalancer] == 0 {
		t.Errorf("restart: calls %s, want the endpoint replaced and the load balancers reprogrammed", callsString(calls))
	}
	wt.MustEqual(t, "after the restart", h.f.Dump(), want)
	h.b = h.newBackend()
	if n := mutating(h.mustSync(s, proxy.Changes{Full: true})); n != 0 {
		t.Errorf("second restart: %d changes, want none", n)
	}
}

// explain --live reads HNS without kproxy's record: what HNS did not say is
// not drift either.
func TestExplainLiveWhenHNSDropsFields(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern, func(o *Options) { o.EnableDSR = true })
	h.f.DropOnRead(hns.FieldsAll)
	s := echoSnap()
	h.mustSync(s, proxy.Changes{Full: true})
	e, err := h.b.Explainer(FullView(v1.IPv4Protocol, s), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.drift) != 0 {
		t.Errorf("drift on an HNS that leaves fields out: %q", e.drift)
	}
	if len(e.lbs) != 2 {
		t.Errorf("%d load balancers traced, want the ClusterIP and the NodePort", len(e.lbs))
	}
}
