package integration

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestPacketCounterMetrics: upstream's two iptables packet counters are
// served as counters, and connections from node1 to a NodePort on
// 127.0.0.1 (localhost NodePorts, on by default) each count once in
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total.
func TestPacketCounterMetrics(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 2*time.Minute)
	svc := e.createService(ctx, e.top.Service("web", 11, proxytest.WithNodePort()), proxytest.Ready(proxytest.PodA1)...)
	local := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(svc.Spec.Ports[0].NodePort))
	e.await(proxytest.Node1, "tcp", local, expectation{backends: []string{proxytest.PodA1}}, 10*time.Second)

	const name = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
	value := func(metric string) float64 {
		t.Helper()
		m, err := e.Scrape(ctx, proxytest.Node1)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := m.Get(metric)
		if !ok {
			t.Fatalf("%s missing from /metrics", metric)
		}
		return v
	}
	before := value(name)
	value("kubeproxy_iptables_ct_state_invalid_dropped_packets_total")
	const n = 5
	for i := 0; i < n; i++ {
		if r := e.Cluster.Probe(ctx, proxytest.Node1, "tcp", local, echo.ProbeOptions{Timeout: time.Second}); r.Outcome != echo.Answer {
			t.Fatalf("connection %d to %s: %v", i, local, r)
		}
	}
	// Other traffic does not count: the ClusterIP, from node1.
	for i := 0; i < n; i++ {
		e.Cluster.Probe(ctx, proxytest.Node1, "tcp", clusterIP(svc, "IPv4"), echo.ProbeOptions{Timeout: time.Second})
	}
	if got := value(name) - before; got != n {
		t.Errorf("%s grew by %v over %d localhost NodePort connections (and %d ClusterIP ones), want %d", name, got, n, n, n)
	}
}
