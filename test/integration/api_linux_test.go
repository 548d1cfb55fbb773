package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

// programmingLatency is upstream's network programming latency histogram.
const programmingLatency = "kubeproxy_network_programming_duration_seconds"

// TestServicesFollowTheAPI: a Service and its EndpointSlices created,
// updated and deleted through the API (the slices as the EndpointSlice
// controller writes them, with a trigger time) reach node1's kernel: real
// connections through the ClusterIP (both families, from a pod) and the
// NodePort (from outside) follow every change, and each endpoint change
// adds a network programming latency sample no older than the change.
func TestServicesFollowTheAPI(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 3*time.Minute)
	const limit = 10 * time.Second
	svc := e.createService(ctx, e.top.Service("web", 10, proxytest.WithNodePort()), proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	v4, v6, np := clusterIP(svc, v1.IPv4Protocol), clusterIP(svc, v1.IPv6Protocol), e.nodePort(svc)

	step := func(name string, x expectation, change func() time.Time, checkMetric bool) {
		t.Helper()
		before := e.latency(ctx)
		trigger := change()
		took := e.await(proxytest.Client1, "tcp", v4, x, limit)
		e.await(proxytest.Client1, "tcp", v6, x, limit)
		e.await(proxytest.Outside, "tcp", np, x, limit)
		e.await(proxytest.Client1, "udp", v4, x, limit)
		t.Logf("%s: ClusterIP traffic followed after %v", name, took.Round(time.Millisecond))
		if !checkMetric {
			return
		}
		// The sample is recorded at the end of the sync that programmed the
		// change, after every family's rules are written: traffic can follow
		// a moment before it. Give it (bounded) time to appear.
		after := e.latency(ctx)
		for wait := time.Now().Add(5 * time.Second); after.count == before.count && time.Now().Before(wait); {
			time.Sleep(50 * time.Millisecond)
			after = e.latency(ctx)
		}
		n, sum := after.count-before.count, after.sum-before.sum
		bound := time.Since(trigger).Seconds()
		t.Logf("%s: %s gained %v samples, %.3f s in total (bound %.3f s per sample)", name, programmingLatency, n, sum, bound)
		if n < 1 || sum <= 0 || sum > n*bound {
			t.Errorf("%s: %s moved by %v samples / %.3f s; want at least 1 sample, each in (0, %.3f] s",
				name, programmingLatency, n, sum, bound)
		}
	}

	step("created", expectation{backends: []string{proxytest.PodA1, proxytest.PodB1}}, func() time.Time {
		// The Service and slices exist already; this step only measures.
		return time.Now().Add(-time.Minute)
	}, false)

	step("endpoints changed", expectation{backends: []string{proxytest.PodB2}}, func() time.Time {
		return e.setEndpoints(ctx, svc, proxytest.Ready(proxytest.PodB2)...)
	}, true)

	step("endpoints added", expectation{backends: []string{proxytest.PodA1, proxytest.PodB2, proxytest.PodB3}}, func() time.Time {
		return e.setEndpoints(ctx, svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB2, proxytest.PodB3)...)
	}, true)

	step("endpoints emptied", expectation{rejected: true}, func() time.Time {
		return e.setEndpoints(ctx, svc)
	}, true)

	// The Service itself changes: NodePort → ClusterIP. The ClusterIP keeps
	// working, the NodePort is closed (node1 itself refuses the connection).
	e.setEndpoints(ctx, svc, proxytest.Ready(proxytest.PodA2)...)
	e.await(proxytest.Client1, "tcp", v4, expectation{backends: []string{proxytest.PodA2}}, limit)
	e.await(proxytest.Outside, "tcp", np, expectation{backends: []string{proxytest.PodA2}}, limit)
	svc = e.updateService(ctx, svc, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeClusterIP
		s.Spec.ExternalTrafficPolicy = ""
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	})
	took := e.await(proxytest.Outside, "tcp", np, expectation{rejected: true}, limit)
	e.await(proxytest.Client1, "tcp", v4, expectation{backends: []string{proxytest.PodA2}}, limit)
	t.Logf("Service type changed to ClusterIP: NodePort closed after %v", took.Round(time.Millisecond))

	// Deleted: no rule mentions it any more, its ClusterIP answers no more.
	if err := e.Writer.DeleteService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	e.await(proxytest.Client1, "tcp", v4, expectation{notAnswered: true}, limit)
	e.awaitNoRules(ctx, "default/web:", limit)
	e.await(proxytest.Client1, "tcp", clusterIP(e.sentinel, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodA2}}, limit)
}

// TestInvalidCombinations: objects the API accepts but kproxy cannot fully
// use are handled as documented (pkg/cache): a LoadBalancer ingress with a
// hostname and no IP captures nothing on the node (its ClusterIP and
// NodePort work); an EndpointSlice of address type FQDN is not proxied
// (the Service's IP slices still are). kproxy keeps running and the other
// Services are unaffected.
func TestInvalidCombinations(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 2*time.Minute)
	const limit = 10 * time.Second
	control := e.createService(ctx, e.top.Service("control", 30), proxytest.Ready(proxytest.PodB3)...)
	e.await(proxytest.Client1, "tcp", clusterIP(control, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodB3}}, limit)

	t.Run("LoadBalancer ingress with a hostname only", func(t *testing.T) {
		lb := e.top.Service("lb-hostname", 31, proxytest.WithLoadBalancer())
		wouldBe := lb.Status.LoadBalancer.Ingress[0].IP
		lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{Hostname: "lb-31.example.com"}}
		lb = e.createService(ctx, lb, proxytest.Ready(proxytest.PodA1)...)
		if got := lb.Status.LoadBalancer.Ingress; len(got) != 1 || got[0].Hostname == "" || got[0].IP != "" {
			t.Fatalf("the API server stored ingress %+v, want the hostname only", got)
		}
		e.await(proxytest.Client1, "tcp", clusterIP(lb, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodA1}}, limit)
		e.await(proxytest.Outside, "tcp", e.nodePort(lb), expectation{backends: []string{proxytest.PodA1}}, limit)
		if nat := e.save(ctx, v1.IPv4Protocol, "nat"); strings.Contains(nat, wouldBe+"/32") {
			t.Errorf("node1 captures %s, which is not in the Service's ingress:\n%s", wouldBe, grep(nat, wouldBe))
		}
	})

	t.Run("EndpointSlice of address type FQDN", func(t *testing.T) {
		svc := e.createService(ctx, e.top.Service("fqdn", 32), proxytest.Ready(proxytest.PodB1)...)
		name, proto, port := proxytest.PortTCP, v1.ProtocolTCP, int32(proxytest.EchoPort)
		fqdn := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "fqdn-names", Namespace: svc.Namespace},
			AddressType: discovery.AddressTypeFQDN,
			Endpoints:   []discovery.Endpoint{{Addresses: []string{"backend.example.com"}}},
			Ports:       []discovery.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		}
		AsController(svc, time.Now(), fqdn)
		if err := e.Writer.ApplySlices(ctx, fqdn); err != nil {
			t.Fatal(err)
		}
		// Move the IP endpoint afterwards: once it is programmed, kproxy has
		// seen the FQDN slice too (events of one kind arrive in order).
		e.setEndpoints(ctx, svc, proxytest.Ready(proxytest.PodB2)...)
		e.await(proxytest.Client1, "tcp", clusterIP(svc, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodB2}}, limit)
		e.await(proxytest.Client1, "tcp", clusterIP(svc, v1.IPv6Protocol), expectation{backends: []string{proxytest.PodB2}}, limit)
	})

	if !e.proxy.Running() {
		t.Fatalf("kproxy exited: %v", e.proxy.Process().Err())
	}
	e.await(proxytest.Client1, "tcp", clusterIP(control, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodB3}}, limit)
	e.await(proxytest.Client1, "tcp", clusterIP(e.sentinel, v1.IPv6Protocol), expectation{backends: []string{proxytest.PodA2}}, limit)
}

// histogram is a histogram's count and sum at one scrape.
type histogram struct{ count, sum float64 }

// latency scrapes kproxy's network programming latency (all families).
func (e *env) latency(ctx context.Context) histogram {
	e.t.Helper()
	m, err := e.Scrape(ctx, proxytest.Node1)
	if err != nil {
		e.t.Fatal(err)
	}
	// A histogram vector has no series before its first sample; the sync
	// timestamp shows the scrape is kproxy's.
	if _, ok := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv4"); !ok {
		e.t.Fatalf("/metrics has no kubeproxy_sync_proxy_rules_last_timestamp_seconds for IPv4")
	}
	c, s := m.Histogram(programmingLatency)
	return histogram{c, s}
}

// setEndpoints writes a Service's slices and returns their trigger time.
func (e *env) setEndpoints(ctx context.Context, svc *v1.Service, eps ...proxytest.EP) time.Time {
	e.t.Helper()
	trigger, err := e.Writer.SetEndpoints(ctx, svc, eps...)
	if err != nil {
		e.t.Fatal(err)
	}
	return trigger
}

// updateService reads the Service, changes it with fn and writes it back.
func (e *env) updateService(ctx context.Context, svc *v1.Service, fn func(*v1.Service)) *v1.Service {
	e.t.Helper()
	c := e.Admin.CoreV1().Services(svc.Namespace)
	cur, err := c.Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	fn(cur)
	out, err := c.Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("updating Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

// save returns iptables-save of one table of node1 (the tests' flavour).
func (e *env) save(ctx context.Context, fam v1.IPFamily, table string) string {
	e.t.Helper()
	out, err := Save(ctx, e.Cluster, proxytest.Node1, fam, flavour, table)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// awaitNoRules waits until no rule of node1 (nat and filter, both families)
// contains s.
func (e *env) awaitNoRules(ctx context.Context, s string, limit time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var left []string
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			for _, table := range []string{"nat", "filter"} {
				if g := grep(e.save(ctx, fam, table), s); g != "" {
					left = append(left, string(fam)+" "+table+":\n"+g)
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("rules mentioning %q still in node1 after %v:\n%s", s, limit, strings.Join(left, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// grep returns the lines of text containing s.
func grep(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
