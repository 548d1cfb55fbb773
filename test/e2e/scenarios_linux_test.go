package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// clusterIP returns a Service's ClusterIP:ServicePort of one family.
func clusterIP(svc *v1.Service, fam v1.IPFamily) netip.AddrPort {
	for _, a := range ServiceAddrs(svc) {
		if (fam == v1.IPv4Protocol) == a.Addr().Is4() {
			return a
		}
	}
	return netip.AddrPort{}
}

// probe makes one new connection from client-1.
func (e *env) probe(ctx context.Context, proto string, addr netip.AddrPort, opts echo.ProbeOptions) echo.Result {
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	return e.c.Probe(ctx, proxytest.Client1, proto, addr, opts)
}

// TestDistribution: 3 endpoints, 300 new connections per family → each
// endpoint gets between 20% and 47% of them.
func TestDistribution(t *testing.T) {
	backends := []string{proxytest.PodA1, proxytest.PodB1, proxytest.PodB2}
	var objs []any
	top := proxytest.Default()
	svc := top.Service("dist", 100)
	slices, err := top.Slices(svc, proxytest.Ready(backends...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, svc, slices[0], slices[1])
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objs})
	ctx := e.ctx(2 * time.Minute)
	const n = 300
	for _, fam := range families() {
		t.Run(string(fam), func(t *testing.T) {
			addr := clusterIP(svc, fam)
			counts := map[string]int{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			sem := make(chan struct{}, 4)
			for i := 0; i < n; i++ {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					r := e.probe(ctx, "tcp", addr, echo.ProbeOptions{})
					mu.Lock()
					defer mu.Unlock()
					if r.Outcome != echo.Answer {
						counts["<"+string(r.Outcome)+">"]++
						return
					}
					counts[r.Reply.Name]++
				}()
			}
			wg.Wait()
			t.Logf("%d connections to %s: %v", n, addr, counts)
			for _, b := range backends {
				share := float64(counts[b]) / n
				if share < 0.20 || share > 0.47 {
					t.Errorf("%s got %.1f%% of the connections, want 20%%..47%%", b, 100*share)
				}
			}
			if len(counts) != len(backends) {
				t.Errorf("answers from %v, want only %v", counts, backends)
			}
		})
	}
}

// TestEndpointChurn: an endpoint removed gets no new connection 2 s after the
// manifest change; added back, it is reachable within 2 s.
func TestEndpointChurn(t *testing.T) {
	all := []string{proxytest.PodA1, proxytest.PodB1, proxytest.PodB2}
	top := proxytest.Default()
	svc := top.Service("churn", 101)
	objects := func(pods ...string) []any {
		slices, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{svc, slices[0], slices[1]}
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objects(all...)})
	ctx := e.ctx(2 * time.Minute)
	const victim = proxytest.PodB2
	addrs := []netip.AddrPort{clusterIP(svc, v1.IPv4Protocol), clusterIP(svc, v1.IPv6Protocol)}

	// Before: the victim answers some of the connections.
	if _, ok := e.until(ctx, addrs, 5*time.Second, func(r echo.Result) bool { return r.Reply.Name == victim }); !ok {
		t.Fatalf("%s never answered before the change", victim)
	}

	// Removed: track the last connection that still reached it.
	e.write("objects.yaml", objects(proxytest.PodA1, proxytest.PodB1)...)
	t0 := time.Now()
	var last time.Time
	probes := 0
	for i := 0; time.Since(t0) < 3*time.Second; i++ {
		r := e.probe(ctx, "tcp", addrs[i%2], echo.ProbeOptions{})
		probes++
		if r.Outcome != echo.Answer {
			t.Errorf("connection %d after the removal: %v", i, r)
			continue
		}
		if r.Reply.Name == victim {
			last = time.Now()
		}
	}
	if last.IsZero() {
		t.Logf("removed endpoint got none of %d connections after the change", probes)
	} else {
		t.Logf("removed endpoint got its last connection %v after the change (%d probes)", last.Sub(t0).Round(time.Millisecond), probes)
		if last.Sub(t0) > 2*time.Second {
			t.Errorf("removed endpoint still reached %v after the change, want < 2s", last.Sub(t0))
		}
	}

	// Added back: reachable within 2 s.
	e.write("objects.yaml", objects(all...)...)
	t1 := time.Now()
	at, ok := e.until(ctx, addrs, 5*time.Second, func(r echo.Result) bool { return r.Reply.Name == victim })
	if !ok {
		t.Fatalf("re-added endpoint not reached within 5s")
	}
	t.Logf("re-added endpoint reached %v after the change", at.Sub(t1).Round(time.Millisecond))
	if at.Sub(t1) > 2*time.Second {
		t.Errorf("re-added endpoint first reached %v after the change, want <= 2s", at.Sub(t1))
	}
}

// until makes new TCP connections (alternating addrs) until ok accepts an
// answer or limit passes; it returns when that happened. Each connection
// waits at most 200ms, so the time is measured to about that.
func (e *env) until(ctx context.Context, addrs []netip.AddrPort, limit time.Duration, ok func(echo.Result) bool) (time.Time, bool) {
	deadline := time.Now().Add(limit)
	for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
		r := e.probe(ctx, "tcp", addrs[i%len(addrs)], echo.ProbeOptions{Timeout: 200 * time.Millisecond})
		if r.Outcome == echo.Answer && ok(r) {
			return time.Now(), true
		}
	}
	return time.Time{}, false
}

// TestUDPConntrack: a UDP client that keeps its source port follows an
// endpoint change (stale conntrack entries are flushed), and a client on
// node1 reaches a Service that gets its first endpoint although it sent to
// the ClusterIP before any rule existed (the stale entry without DNAT would
// black-hole it).
func TestUDPConntrack(t *testing.T) {
	top := proxytest.Default()
	moving := top.Service("udp-move", 102)
	first := top.Service("udp-first", 103)
	slicesOf := func(svc *v1.Service, pods ...string) []any {
		slices, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{svc, slices[0], slices[1]}
	}
	// Fixed client ports, one per family and case.
	base := 20000 + rand.IntN(20000)
	port := func(i int) int { return base + i }

	e := newEnv(t, envOptions{
		config:  proxytest.DefaultConfig(),
		objects: append(slicesOf(moving, proxytest.PodB1), slicesOf(first)...),
		before: func(e *env) {
			// Before kproxy runs, nothing handles the ClusterIP: node1
			// sends the datagrams to its default router, which drops
			// them, and conntrack remembers the flow as it is.
			for i, fam := range families() {
				r := e.c.Probe(e.ctx(time.Minute), proxytest.Node1, "udp", clusterIP(first, fam), echo.ProbeOptions{LocalPort: port(2 + i), Timeout: 300 * time.Millisecond})
				if r.Outcome != echo.Dropped {
					t.Fatalf("%s to udp-first before kproxy: %v, want dropped", fam, r)
				}
			}
		},
	})
	ctx := e.ctx(2 * time.Minute)

	// Steady state: the udp-move clients reach pod-b1.
	for i, fam := range families() {
		r := e.probe(ctx, "udp", clusterIP(moving, fam), echo.ProbeOptions{LocalPort: port(i)})
		if r.Outcome != echo.Answer || r.Reply.Name != proxytest.PodB1 {
			t.Fatalf("%s before the change: %v, want an answer from pod-b1", fam, r)
		}
	}

	// Move udp-move to pod-b2 and give udp-first its first endpoint.
	e.write("objects.yaml", append(slicesOf(moving, proxytest.PodB2), slicesOf(first, proxytest.PodA1)...)...)
	t0 := time.Now()
	var wg sync.WaitGroup
	for i, fam := range families() {
		for _, tc := range []struct {
			from string
			svc  *v1.Service
			port int
			want string
		}{{proxytest.Client1, moving, port(i), proxytest.PodB2}, {proxytest.Node1, first, port(2 + i), proxytest.PodA1}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var last echo.Result
				for time.Since(t0) < 5*time.Second && ctx.Err() == nil {
					last = e.c.Probe(ctx, tc.from, "udp", clusterIP(tc.svc, fam), echo.ProbeOptions{LocalPort: tc.port, Timeout: 300 * time.Millisecond})
					if last.Outcome == echo.Answer && last.Reply.Name == tc.want {
						took := time.Since(t0)
						t.Logf("%s %s: fixed-port client reached %s %v after the change", fam, tc.svc.Name, tc.want, took.Round(time.Millisecond))
						if took > 2500*time.Millisecond {
							t.Errorf("%s %s: the fixed-port client needed %v to follow the change, want about 2s", fam, tc.svc.Name, took)
						}
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				t.Errorf("%s %s from fixed port %d: still %v 5s after the change, want %s", fam, tc.svc.Name, tc.port, last, tc.want)
			}()
		}
	}
	wg.Wait()
}

// TestRestart: kproxy stopped (SIGTERM) or killed (SIGKILL to its process
// group, as a container runtime kills a container) and started again →
// established TCP connections survive and new connections succeed
// throughout: the rules stay in place while kproxy is down. Afterwards the
// tables are exactly what a fresh kproxy programs.
func TestRestart(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("restart", 104, proxytest.WithNodePort())
	slices, err := top.Slices(svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{svc, slices[0], slices[1]}})
	ctx := e.ctx(3 * time.Minute)

	// Established connections, one per family.
	var conns []net.Conn
	for _, fam := range families() {
		addr := clusterIP(svc, fam)
		var conn net.Conn
		if err := e.c.NS(proxytest.Client1).Do(func() error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr.String())
			conn = c
			return err
		}); err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		conns = append(conns, conn)
	}
	exchange := func(step string) {
		t.Helper()
		for i, c := range conns {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			r := echo.Exchange(cctx, c, fmt.Sprintf("%s-%d", step, i))
			cancel()
			if r.Outcome != echo.Answer {
				t.Errorf("established connection %d %s: %v", i, step, r)
			}
		}
	}
	exchange("before")

	// New connections all along, from a pod and from outside (NodePort).
	connecting := e.connectAllAlong(ctx, svc)

	for _, how := range []string{"SIGTERM", "SIGKILL of the process group"} {
		var err error
		if how == "SIGTERM" {
			err = e.p.Stop(10 * time.Second)
		} else {
			err = e.p.KillGroup()
		}
		if err != nil {
			t.Errorf("%s: %v", how, err)
		}
		time.Sleep(time.Second) // down for a while
		exchange("while down after " + how)
		e.start()
		time.Sleep(time.Second) // and up for a while
		exchange("after restart after " + how)
	}
	count, failures := connecting()
	t.Logf("%d new connections during two restarts, %d failed", count, len(failures))
	for _, f := range failures {
		t.Errorf("new connection failed: %s", f)
	}
	e.checkRulesLikeFresh(ctx)
}

// connectAllAlong opens a new connection every 50 ms, alternating families,
// to svc's ClusterIP from a pod and to its NodePort from outside, until the
// returned function is called; that returns how many were made and the
// failed ones.
func (e *env) connectAllAlong(ctx context.Context, svc *v1.Service) func() (int, []string) {
	stop := make(chan struct{})
	var mu sync.Mutex
	var failures []string
	count := 0
	done := make(chan struct{})
	node1, _ := e.top.Node(proxytest.Node1)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			fam := families()[i%2]
			var r echo.Result
			if i%4 < 2 {
				r = e.probe(ctx, "tcp", clusterIP(svc, fam), echo.ProbeOptions{})
			} else {
				r = e.c.Probe(ctx, proxytest.Outside, "tcp", netip.AddrPortFrom(node1.Addr(fam), uint16(svc.Spec.Ports[0].NodePort)), echo.ProbeOptions{Timeout: time.Second})
			}
			mu.Lock()
			count++
			if r.Outcome != echo.Answer {
				failures = append(failures, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), r))
			}
			mu.Unlock()
		}
	}()
	return func() (int, []string) {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return count, failures
	}
}

// TestFlushedChainsRestored: someone flushes the nat and filter tables (and,
// second, also deletes every user chain, the canary included) → kproxy
// restores its rules within one syncPeriod.
func TestFlushedChainsRestored(t *testing.T) {
	const syncPeriod = 5 * time.Second
	top := proxytest.Default()
	svc := top.Service("flush", 105)
	slices, err := top.Slices(svc, proxytest.Ready(proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{svc, slices[0], slices[1]},
		extra: []string{"--iptables-sync-period", syncPeriod.String()}})
	ctx := e.ctx(2 * time.Minute)
	addrs := []netip.AddrPort{clusterIP(svc, v1.IPv4Protocol), clusterIP(svc, v1.IPv6Protocol)}
	type change struct {
		name string
		args [][]string
	}
	changes := []change{
		{"flush", [][]string{{"-t", "nat", "-F"}, {"-t", "filter", "-F"}}},
		{"flush and delete chains", [][]string{{"-t", "nat", "-F"}, {"-t", "filter", "-F"}, {"-t", "nat", "-X"}, {"-t", "filter", "-X"}}},
		// Another agent rewriting the built-in chains: kproxy's chains stay,
		// its jumps into them go.
		{"built-in chains flushed", [][]string{{"-t", "nat", "-F", "PREROUTING"}, {"-t", "nat", "-F", "OUTPUT"}}},
	}
	if nftMode() {
		// The same in nftables: kproxy's table flushed, deleted, or its
		// entry chains emptied (args: nft commands, "%s" the family).
		changes = []change{
			{"table flushed", [][]string{{"flush", "table", "%s", "kproxy"}}},
			{"table deleted", [][]string{{"delete", "table", "%s", "kproxy"}}},
			{"entry chains flushed", [][]string{{"flush", "chain", "%s", "kproxy", "nat-prerouting"}, {"flush", "chain", "%s", "kproxy", "nat-output"}}},
			{"dispatch map flushed", [][]string{{"flush", "map", "%s", "kproxy", "frontends"}}},
		}
	}
	for _, tc := range changes {
		t.Run(tc.name, func(t *testing.T) {
			for _, fam := range families() {
				for _, a := range tc.args {
					if !nftMode() {
						e.iptables(fam, a...)
						continue
					}
					cmd := []string{"nft"}
					for _, w := range a {
						cmd = append(cmd, strings.ReplaceAll(w, "%s", nftFamily(fam)))
					}
					if _, err := e.c.Exec(ctx, proxytest.Node1, cmd...); err != nil {
						t.Fatal(err)
					}
				}
			}
			t0 := time.Now()
			// The flush broke the Service (otherwise the test proves nothing)...
			if r := e.probe(ctx, "tcp", addrs[0], echo.ProbeOptions{Timeout: 300 * time.Millisecond}); r.Outcome == echo.Answer && time.Since(t0) < 200*time.Millisecond {
				t.Logf("note: the Service answered right after the flush (%v); kproxy may have resynced already", r)
			}
			// ...and comes back within one syncPeriod.
			for _, addr := range addrs {
				at, ok := e.until(ctx, []netip.AddrPort{addr}, syncPeriod+5*time.Second, func(r echo.Result) bool { return r.Reply.Name == proxytest.PodB1 })
				if !ok {
					t.Fatalf("%s not restored %v after the flush", addr, syncPeriod+5*time.Second)
				}
				t.Logf("%s restored %v after the flush", addr, at.Sub(t0).Round(time.Millisecond))
				// One syncPeriod, plus the sync itself and scheduling on a
				// busy machine.
				if at.Sub(t0) > syncPeriod+2*time.Second {
					t.Errorf("%s restored after %v, want within one syncPeriod (%v)", addr, at.Sub(t0), syncPeriod)
				}
			}
		})
	}
}

// TestLocalhostNodePortMartians: NodePorts answer on 127.0.0.1 from the node
// itself (localhostNodePorts, which needs route_localnet), and route_localnet
// does not expose the node's localhost to the network: a packet for
// 127.0.0.1 arriving from outside never reaches a local socket unless it is
// Service traffic (the CVE-2020-8558 guard). A server listens on node1
// (port 9999), the outside client is made to send to 127.0.0.1 (its own
// loopback routes are replaced by a route to 127.0.0.0/8 via node1), and
// node1's conntrack table must show no connection from it: without the
// guard the kernel accepts the SYN and the server answers it.
func TestLocalhostNodePortMartians(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("martians", 107, proxytest.WithNodePort())
	slices, err := top.Slices(svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	netns.Require(t, "conntrack")
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{svc, slices[0], slices[1]}})
	ctx := e.ctx(time.Minute)
	localhost := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(svc.Spec.Ports[0].NodePort))
	for _, proto := range []string{"tcp", "udp"} {
		if r := e.c.Probe(ctx, proxytest.Node1, proto, localhost, echo.ProbeOptions{Timeout: time.Second}); r.Outcome != echo.Answer {
			t.Errorf("node1 -> %s/%s: %v, want an answer (localhost NodePort)", localhost, proto, r)
		}
	}
	const port = 9999
	srv, err := e.c.Start(proxytest.Node1, "echo-node1", "", echoBin, "serve", "-name", "node1-local", "-port", fmt.Sprint(port))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitOutput(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	node1, _ := top.Node(proxytest.Node1)
	if r := e.c.Probe(ctx, proxytest.Outside, "tcp", netip.AddrPortFrom(node1.IPv4, port), echo.ProbeOptions{Timeout: time.Second}); r.Outcome != echo.Answer {
		t.Fatalf("outside -> node1:%d: %v, want the node1 server to answer", port, r)
	}
	outside := e.c.NS(proxytest.Outside)
	if err := outside.Sysctl(map[string]string{
		"net.ipv4.conf.all.route_localnet":  "1",
		"net.ipv4.conf.eth0.route_localnet": "1",
	}); err != nil {
		t.Fatal(err)
	}
	if err := outside.IP(ctx,
		"route del local 127.0.0.1 dev lo table local",
		"route del local 127.0.0.0/8 dev lo table local",
		fmt.Sprintf("route add 127.0.0.0/8 via %s dev eth0", node1.IPv4),
	); err != nil {
		t.Fatal(err)
	}
	target := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	if r := e.c.Probe(ctx, proxytest.Outside, "tcp", target, echo.ProbeOptions{Timeout: time.Second}); r.Outcome == echo.Answer {
		t.Errorf("outside -> %s via node1: %v, want no answer", target, r)
	}
	out, err := e.c.Exec(ctx, proxytest.Node1, "conntrack", "-L", "-p", "tcp", "-s", top.OutsideHost.IPv4.String(), "-d", "127.0.0.1", "--dport", fmt.Sprint(port))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "dport=") {
		t.Errorf("node1 accepted a connection to its localhost from the network:\n%s", out)
	}
}
