package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/trace"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

func withLoadBalancing(alg proxy.Algorithm) proxytest.ServiceOption {
	return func(_ *proxytest.Topology, svc *v1.Service, _ int) {
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[proxy.AnnotationLoadBalancing] = string(alg)
	}
}

// TestRoundRobin: one client, 30 sequential connections to a round-robin
// Service of 3 endpoints → exactly 10 each, in both families.
func TestRoundRobin(t *testing.T) {
	backends := []string{proxytest.PodA1, proxytest.PodB1, proxytest.PodB2}
	top := proxytest.Default()
	svc := top.Service("rr", 110, withLoadBalancing(proxy.AlgorithmRoundRobin))
	sl, err := top.Slices(svc, proxytest.Ready(backends...)...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{svc, sl[0], sl[1]}})
	ctx := e.ctx(2 * time.Minute)
	for _, fam := range families() {
		addr := clusterIP(svc, fam)
		counts := map[string]int{}
		for range 30 {
			r := e.probe(ctx, "tcp", addr, echo.ProbeOptions{})
			if r.Outcome != echo.Answer {
				counts["<"+string(r.Outcome)+">"]++
				continue
			}
			counts[r.Reply.Name]++
		}
		t.Logf("%s: 30 connections to %s: %v", fam, addr, counts)
		for _, b := range backends {
			if counts[b] != 10 {
				t.Errorf("%s: %s got %d connections, want exactly 10 (%v)", fam, b, counts[b], counts)
			}
		}
	}
}

// TestSourceHash: 20 client addresses (added to client-1's interface) reach
// a source-hash Service of 4 endpoints: each always gets one endpoint, the
// one the table and the kernel's hash predict, the same after a kproxy
// restart; adding a fifth endpoint moves at most 30% of them (and exactly
// the ones the table predicts).
func TestSourceHash(t *testing.T) {
	top := proxytest.Default()
	four := []string{proxytest.PodA1, proxytest.PodB1, proxytest.PodB2, proxytest.PodB3}
	five := append(slices.Clone(four), proxytest.PodA2)
	svc := top.Service("sh", 111, withLoadBalancing(proxy.AlgorithmSourceHash))
	objects := func(pods []string) []any {
		sl, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{svc, sl[0], sl[1]}
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objects(four)})
	ctx := e.ctx(3 * time.Minute)

	var clients []netip.Addr
	var add, route []string
	for i := range 20 {
		a := netip.AddrFrom4([4]byte{10, 244, 1, byte(160 + i)})
		clients = append(clients, a)
		add = append(add, fmt.Sprintf("addr add %s/32 dev eth0", a))
		route = append(route, fmt.Sprintf("route add %s/32 dev v-%s", a, proxytest.Client1))
	}
	if err := e.c.NS(proxytest.Client1).IP(ctx, add...); err != nil {
		t.Fatal(err)
	}
	if err := e.c.NS(proxytest.Node1).IP(ctx, route...); err != nil {
		t.Fatal(err)
	}
	addr := clusterIP(svc, v1.IPv4Protocol)

	// predict names the endpoint each client should reach with pods.
	predict := func(pods []string) map[netip.Addr]string {
		var eps []proxy.Endpoint
		byIP := map[netip.Addr]string{}
		for _, p := range pods {
			h, _ := top.Host(p)
			eps = append(eps, proxy.Endpoint{IP: h.IPv4, Port: proxytest.EchoPort})
			byIP[h.IPv4] = p
		}
		proxy.SortEndpoints(eps)
		table := proxy.SourceHashTable(eps)
		out := map[netip.Addr]string{}
		for _, c := range clients {
			out[c] = byIP[eps[table[trace.ClusterSlot(c, 0x6b707278, proxy.SourceHashSlots)]].IP]
		}
		return out
	}
	// observe makes 3 connections from each client and requires one answer.
	observe := func(step string) map[netip.Addr]string {
		t.Helper()
		out := map[netip.Addr]string{}
		for _, c := range clients {
			for range 3 {
				r := e.probe(ctx, "tcp", addr, echo.ProbeOptions{LocalAddr: c})
				if r.Outcome != echo.Answer {
					t.Fatalf("%s: %s → %s: %v", step, c, addr, r)
				}
				if prev, ok := out[c]; ok && prev != r.Reply.Name {
					t.Errorf("%s: %s reached %s and %s", step, c, prev, r.Reply.Name)
				}
				out[c] = r.Reply.Name
			}
		}
		return out
	}
	same := func(step string, got, want map[netip.Addr]string) {
		t.Helper()
		for _, c := range clients {
			if got[c] != want[c] {
				t.Errorf("%s: %s reached %s, want %s", step, c, got[c], want[c])
			}
		}
	}

	before := observe("4 endpoints")
	same("4 endpoints vs the table", before, predict(four))
	used := map[string]int{}
	for _, n := range before {
		used[n]++
	}
	t.Logf("20 clients over 4 endpoints: %v", used)

	if err := e.p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.start()
	same("after a restart", observe("after a restart"), before)

	e.write("objects.yaml", objects(five)...)
	want := predict(five)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The change is programmed when the new endpoint answers a client
		// the table gives it (at least one does, or none moves).
		var probe netip.Addr
		for _, c := range clients {
			if want[c] == proxytest.PodA2 {
				probe = c
				break
			}
		}
		if !probe.IsValid() {
			time.Sleep(2 * time.Second)
			break
		}
		r := e.probe(ctx, "tcp", addr, echo.ProbeOptions{LocalAddr: probe})
		if r.Outcome == echo.Answer && r.Reply.Name == proxytest.PodA2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fifth endpoint never answered %s", probe)
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := observe("5 endpoints")
	same("5 endpoints vs the table", after, want)
	moved := 0
	for _, c := range clients {
		if after[c] != before[c] {
			moved++
		}
	}
	t.Logf("adding a fifth endpoint moved %d of 20 clients", moved)
	if moved > 6 {
		t.Errorf("%d of 20 clients moved, want at most 30%%", moved)
	}
}

// TestLeastConnection: a least-connection Service first has one endpoint,
// which gets 50 connections that stay open; then a second endpoint comes.
// Within 10 s new connections go ≥ 80% to the second one (conntrack counts
// 50 established on the first: weights 1/51 and 1).
func TestLeastConnection(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("lc", 112, withLoadBalancing(proxy.AlgorithmLeastConnection))
	objects := func(pods ...string) []any {
		sl, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{svc, sl[0], sl[1]}
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objects(proxytest.PodB1)})
	ctx := e.ctx(2 * time.Minute)
	addr := clusterIP(svc, v1.IPv4Protocol)
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			_ = c.Close()
		}
	})
	for i := range 50 {
		var conn net.Conn
		if err := e.c.NS(proxytest.Client1).Do(func() error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr.String())
			conn = c
			return err
		}); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		held = append(held, conn)
		if r := echo.Exchange(ctx, conn, "hold"); r.Outcome != echo.Answer || r.Reply.Name != proxytest.PodB1 {
			t.Fatalf("held connection %d: %v", i, r)
		}
	}
	e.write("objects.yaml", objects(proxytest.PodB1, proxytest.PodB2)...)
	t0 := time.Now()
	var share float64
	for time.Since(t0) < 10*time.Second {
		counts := map[string]int{}
		for range 50 {
			r := e.probe(ctx, "tcp", addr, echo.ProbeOptions{})
			if r.Outcome == echo.Answer {
				counts[r.Reply.Name]++
			}
		}
		share = float64(counts[proxytest.PodB2]) / 50
		t.Logf("%v after the change: %v", time.Since(t0).Round(100*time.Millisecond), counts)
		if share >= 0.8 {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("10 s after the second endpoint came, it got %.0f%% of 50 new connections, want ≥ 80%%", 100*share)
}
