package windows

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// The scale cluster: 2,000 Services (one TCP port each; every fourth a
// NodePort) with 10 endpoints each, drawn from 5,000 remote pod addresses
// (10.244.2.0 - 10.244.21.x) plus 50 local pods (10.244.1.x).
const (
	scaleServices = 2000
	scaleRemote   = 5000
	scaleLocal    = 50
	scalePerSvc   = 10
)

func scaleRemoteIP(i int) netip.Addr {
	i %= scaleRemote
	return netip.AddrFrom4([4]byte{10, 244, byte(2 + i/250), byte(1 + i%250)})
}

func scaleLocalIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i%scaleLocal)})
}

// scalePort builds Service i; shift moves its remote endpoints along the
// address list (a different shift is an endpoint change).
func scalePort(i, shift int) *proxy.ServicePort {
	var list []proxy.Endpoint
	for k := 0; k < scalePerSvc-1; k++ {
		list = append(list, proxy.Endpoint{IP: scaleRemoteIP(i*(scalePerSvc-1) + k + shift), Port: 8080, Ready: true, Serving: true})
	}
	list = append(list, proxy.Endpoint{IP: scaleLocalIP(i), Port: 8080, Ready: true, Serving: true, Local: true})
	opts := []wt.PortOpt{wt.Eps(list...), wt.Named("ns", fmt.Sprintf("svc-%04d", i), "http")}
	if i%4 == 0 {
		opts = append(opts, wt.NodePort(int32(30000+i)))
	}
	cip := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(1 + i%250)})
	return wt.SvcPort("x", v1.ProtocolTCP, cip.String(), 80, opts...)
}

func scaleSnapshot() (*proxy.Snapshot, []*proxy.ServicePort) {
	ports := make([]*proxy.ServicePort, scaleServices)
	for i := range ports {
		ports[i] = scalePort(i, 0)
	}
	return wt.Snap([]string{"10.0.0.1"}, ports...), ports
}

func scaleHarness(tb testing.TB, n hns.Network, v hns.Version) (*fakehns.Fake, *Backend) {
	f := fakehns.New(v)
	net := f.AddNetwork(n)
	for i := 0; i < scaleLocal; i++ {
		f.AddLocalEndpoint(net, scaleLocalIP(i), fmt.Sprintf("pod-%d", i))
	}
	b, err := New(Options{HNS: f, NetworkName: n.Name, SourceVIP: wt.MustAddr("10.244.1.250"),
		Clock:      clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		Interfaces: func() ([]HostInterface, error) { return nil, nil }})
	if err != nil {
		tb.Fatal(err)
	}
	return f, b
}

var scaleNetworks = []hns.Network{
	{Name: "cbr0", Type: hns.NetworkTypeL2Bridge},
	{Name: "vxlan0", Type: hns.NetworkTypeOverlay, RemoteSubnets: func() []hns.RemoteSubnet {
		var rs []hns.RemoteSubnet
		for n := 2; n < 2+scaleRemote/250+1; n++ {
			rs = append(rs, hns.RemoteSubnet{DestinationPrefix: fmt.Sprintf("10.244.%d.0/24", n), ProviderAddress: fmt.Sprintf("10.0.0.%d", n)})
		}
		return rs
	}()},
}

// TestScaleCallCounts checks the HNS call budget on the scale cluster:
// programming from scratch makes one call per object created (plus the one
// listing of a first sync), a sync without change makes none, and one
// endpoint change touches only the load balancers holding it plus one
// endpoint.
func TestScaleCallCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test")
	}
	for _, n := range scaleNetworks {
		for _, v := range []hns.Version{{Major: 15, Minor: 5}, {Major: 15, Minor: 4}} {
			t.Run(fmt.Sprintf("%s/HNS-%s", n.Type, v), func(t *testing.T) {
				f, b := scaleHarness(t, n, v)
				s, ports := scaleSnapshot()
				ctx := context.Background()
				f.ResetCalls()
				if err := syncSnap(ctx, b, s, proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				c := f.Calls()
				objects := c[hns.OpCreateEndpoint] + c[hns.OpCreateLoadBalancer]
				listing := c[hns.OpVersion] + c[hns.OpGetNetwork] + c[hns.OpListEndpoints] + c[hns.OpListLoadBalancers]
				wantLBs := scaleServices + scaleServices/4
				wantEPs := scaleRemote
				if n.Type == hns.NetworkTypeOverlay {
					wantEPs += scaleServices + 1 // service VIPs and the source VIP
				}
				if c[hns.OpCreateLoadBalancer] != wantLBs || c[hns.OpCreateEndpoint] != wantEPs {
					t.Errorf("from scratch: %d load balancers and %d endpoints created, want %d and %d", c[hns.OpCreateLoadBalancer], c[hns.OpCreateEndpoint], wantLBs, wantEPs)
				}
				if total := f.TotalCalls(); total != objects+listing || listing != 4 {
					t.Errorf("from scratch: %d calls for %d objects and %d listing calls (%s)", total, objects, listing, callsString(c))
				}
				t.Logf("from scratch: %d objects created with %d calls (%d of them the first listing)", objects, f.TotalCalls(), listing)

				for _, ch := range []proxy.Changes{{}, {Full: true}} {
					f.ResetCalls()
					if err := syncSnap(ctx, b, s, ch); err != nil {
						t.Fatal(err)
					}
					if f.TotalCalls() != 0 {
						t.Errorf("no change (full=%v): %d calls (%s)", ch.Full, f.TotalCalls(), callsString(f.Calls()))
					}
				}

				// Service 8 (a NodePort: two load balancers) loses one remote
				// endpoint (other Services still use it).
				changed := append([]*proxy.ServicePort(nil), ports...)
				p := *ports[8]
				p.ClusterEndpoints = p.ClusterEndpoints[1:]
				changed[8] = &p
				f.ResetCalls()
				if err := syncSnap(ctx, b, wt.Snap([]string{"10.0.0.1"}, changed...), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{p.Name: {}}}); err != nil {
					t.Fatal(err)
				}
				lbCalls := 2 // update in place
				if !hns.CapabilitiesFor(v).ModifyLoadBalancer {
					lbCalls = 4 // delete and create
				}
				if got := f.TotalCalls(); got > lbCalls+1 {
					t.Errorf("one endpoint removed: %d calls (%s), want at most %d", got, callsString(f.Calls()), lbCalls+1)
				}
				t.Logf("one endpoint removed from a NodePort Service: %s", callsString(f.Calls()))

				// It gains an endpoint no other Service uses.
				q := p
				// A pod of a known node (an address outside every remote
				// subnet costs one more call on overlay: the network is read
				// again for a new node's subnet).
				q.ClusterEndpoints = append([]proxy.Endpoint{{IP: wt.MustAddr("10.244.2.254"), Port: 8080, Ready: true, Serving: true}}, p.ClusterEndpoints...)
				changed[8] = &q
				f.ResetCalls()
				if err := syncSnap(ctx, b, wt.Snap([]string{"10.0.0.1"}, changed...), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{p.Name: {}}}); err != nil {
					t.Fatal(err)
				}
				if got, c := f.TotalCalls(), f.Calls(); got > lbCalls+1 || c[hns.OpCreateEndpoint] != 1 {
					t.Errorf("one new endpoint: %d calls (%s), want one endpoint and at most %d in all", got, callsString(c), lbCalls+1)
				}
				t.Logf("one new endpoint in a NodePort Service: %s", callsString(f.Calls()))
			})
		}
	}
}

// cpuMetric reports the process CPU time per operation ("cpu-ns/op")
// from the moment it is called to the end of the benchmark.
func cpuMetric(b *testing.B) func() {
	start, ok := processCPU()
	return func() {
		if end, ok2 := processCPU(); ok && ok2 && b.N > 0 {
			b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

// BenchmarkPlanReconcile measures planning and reconciling the scale cluster
// against a record that matches it: "full" plans every port (a first sync,
// or after node facts changed); "one-port-changed" is the steady state, where
// the plan reuses the last plan's result for every port but the one that changed (each iteration flips
// one Service's endpoints) and one load balancer needs an update.
func BenchmarkPlanReconcile(b *testing.B) {
	for _, n := range scaleNetworks {
		b.Run(n.Type+"/full", func(b *testing.B) {
			_, be := scaleHarness(b, n, wt.HNSModern)
			s, _ := scaleSnapshot()
			if err := syncSnap(context.Background(), be, s, proxy.Changes{Full: true}); err != nil {
				b.Fatal(err)
			}
			facts := be.facts(s.Node, nil)
			v := wt.IPv4View(s)
			b.ReportAllocs()
			b.ResetTimer()
			defer cpuMetric(b)()
			for i := 0; i < b.N; i++ {
				p := plan.Build(facts, v, nil)
				if r := reconcile.Reconcile(p, be.rec.State, true); !r.Empty() {
					b.Fatalf("not in sync: %d operations", len(r.Ops))
				}
			}
		})
		b.Run(n.Type+"/one-port-changed", func(b *testing.B) {
			_, be := scaleHarness(b, n, wt.HNSModern)
			s, ports := scaleSnapshot()
			if err := syncSnap(context.Background(), be, s, proxy.Changes{Full: true}); err != nil {
				b.Fatal(err)
			}
			// Two snapshots that differ in Service 9's endpoint order only
			// at the HNS level: the same endpoints, a new *ServicePort.
			alt := append([]*proxy.ServicePort(nil), ports...)
			p := *ports[9]
			alt[9] = &p
			vs := NewViews(v1.IPv4Protocol)
			changed := proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{p.Name: {}}}
			views := []*intent.View{vs.Of(s, proxy.Changes{Full: true}), vs.Of(wt.Snap([]string{"10.0.0.1"}, alt...), changed)}
			facts := be.facts(s.Node, nil)
			prev := be.plan // the plan the record was programmed from
			b.ReportAllocs()
			b.ResetTimer()
			defer cpuMetric(b)()
			for i := 0; i < b.N; i++ {
				p := plan.Build(facts, views[i%2], prev)
				if r := reconcile.Reconcile(p, be.rec.State, true); !r.Empty() {
					b.Fatalf("not in sync: %d operations", len(r.Ops))
				}
			}
		})
	}
}

// BenchmarkSyncNoChange measures a whole Sync with a full change set and
// nothing to do (the runner's periodic full sync).
func BenchmarkSyncNoChange(b *testing.B) {
	f, be := scaleHarness(b, scaleNetworks[0], wt.HNSModern)
	s, _ := scaleSnapshot()
	ctx := context.Background()
	if err := syncSnap(ctx, be, s, proxy.Changes{Full: true}); err != nil {
		b.Fatal(err)
	}
	f.ResetCalls()
	b.ReportAllocs()
	b.ResetTimer()
	defer cpuMetric(b)()
	for i := 0; i < b.N; i++ {
		if err := syncSnap(ctx, be, s, proxy.Changes{Full: true}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(f.TotalCalls())/float64(b.N), "hns-calls/op")
}

// BenchmarkSyncFromScratch measures programming the scale cluster into an
// empty (fake) HNS, reporting the calls made and the objects created.
func BenchmarkSyncFromScratch(b *testing.B) {
	for _, n := range scaleNetworks {
		b.Run(n.Type, func(b *testing.B) {
			s, _ := scaleSnapshot()
			var calls, objects int
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				f, be := scaleHarness(b, n, wt.HNSModern)
				f.ResetCalls()
				b.StartTimer()
				if err := syncSnap(context.Background(), be, s, proxy.Changes{Full: true}); err != nil {
					b.Fatal(err)
				}
				c := f.Calls()
				calls += f.TotalCalls()
				objects += c[hns.OpCreateEndpoint] + c[hns.OpCreateLoadBalancer]
			}
			b.ReportMetric(float64(calls)/float64(b.N), "hns-calls/op")
			b.ReportMetric(float64(objects)/float64(b.N), "objects/op")
		})
	}
}
