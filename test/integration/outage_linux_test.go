package integration

import (
	"net/http"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// outage is how long TestAPIServerOutage keeps kube-apiserver down.
const outage = 60 * time.Second

// TestAPIServerOutage stops kube-apiserver for a minute: connections
// through the ClusterIP and the NodePort keep working with the rules in
// place, /livez stays 200, and kproxy keeps running (same process). Changes
// written right after the API server is back (an endpoint moved, a new
// Service) are programmed once kproxy's jittered backoff (at most 30 s
// between attempts, see pkg/source) brings it back: within 45 s.
func TestAPIServerOutage(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 4*time.Minute)
	steady := e.createService(ctx, e.top.Service("steady", 40, proxytest.WithNodePort()), proxytest.Ready(proxytest.PodB1)...)
	v4, np := clusterIP(steady, v1.IPv4Protocol), e.nodePort(steady)
	e.await(proxytest.Client1, "tcp", v4, expectation{backends: []string{proxytest.PodB1}}, 10*time.Second)
	pid := e.proxy.Process().Pid()

	if err := e.ControlPlane.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	t.Logf("kube-apiserver stopped; checking traffic and /livez for %v", outage)
	checks := 0
	for time.Since(down) < outage {
		checks++
		for _, p := range []struct {
			from string
			addr string
			r    echo.Result
		}{
			{proxytest.Client1, v4.String(), e.Cluster.Probe(ctx, proxytest.Client1, "tcp", v4, echo.ProbeOptions{Timeout: time.Second})},
			{proxytest.Outside, np.String(), e.Cluster.Probe(ctx, proxytest.Outside, "tcp", np, echo.ProbeOptions{Timeout: time.Second})},
		} {
			if p.r.Outcome != echo.Answer || p.r.Reply.Name != proxytest.PodB1 {
				t.Errorf("%v into the outage: %s from %s: %v, want an answer from %s", time.Since(down).Round(time.Second), p.addr, p.from, p.r, proxytest.PodB1)
			}
		}
		if code, body, err := e.Health(ctx, proxytest.Node1, "/livez"); err != nil || code != http.StatusOK {
			t.Errorf("%v into the outage: /livez %d %s (%v), want 200", time.Since(down).Round(time.Second), code, body, err)
		}
		if !e.proxy.Running() {
			t.Fatalf("kproxy exited during the outage: %v", e.proxy.Process().Err())
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("%d rounds of checks during the outage", checks)

	if err := e.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kube-apiserver back after %v", back.Sub(down).Round(time.Second))
	e.setEndpoints(ctx, steady, proxytest.Ready(proxytest.PodB2)...)
	after := e.createService(ctx, e.top.Service("after-outage", 41), proxytest.Ready(proxytest.PodA1)...)
	const within = 45 * time.Second // the 30 s backoff cap, one sync, margin
	took := e.await(proxytest.Client1, "tcp", v4, expectation{backends: []string{proxytest.PodB2},
		why: "kproxy did not pick up a change written right after the outage: its reconnect backoff is capped " +
			"at 30 s, and client-go's reflector must not add its own backoff on top"}, within)
	t.Logf("endpoint change written after the restart: programmed %v after the write", took.Round(time.Millisecond))
	e.await(proxytest.Client1, "tcp", clusterIP(after, v1.IPv6Protocol), expectation{backends: []string{proxytest.PodA1}}, within)
	e.await(proxytest.Outside, "tcp", np, expectation{backends: []string{proxytest.PodB2}}, within)
	t.Logf("both changes programmed %v after kube-apiserver was ready", time.Since(back).Round(time.Millisecond))

	if !e.proxy.Running() || e.proxy.Process().Pid() != pid {
		t.Fatalf("kproxy did not keep running through the outage (pid %d → %d, running %v)", pid, e.proxy.Process().Pid(), e.proxy.Running())
	}
	e.awaitHealth(ctx, "/healthz", http.StatusOK, true, 10*time.Second)
}

// TestNewClusterBehindSameAddress replaces the cluster behind kproxy's API
// server address: etcd's data is wiped and both servers start again (RBAC
// and Nodes are bootstrapped before kproxy can reach the new API server),
// with different objects, one of them reusing an old ClusterIP with other
// endpoints. kproxy converges to the new state and no rule of the old
// cluster's Services is left.
func TestNewClusterBehindSameAddress(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 3*time.Minute)
	const limit = 45 * time.Second // the 30 s reconnect backoff cap plus margin
	oldA := e.createService(ctx, e.top.Service("old-a", 50), proxytest.Ready(proxytest.PodA1)...)
	oldB := e.createService(ctx, e.top.Service("old-b", 51, proxytest.WithNodePort()), proxytest.Ready(proxytest.PodB1)...)
	e.await(proxytest.Client1, "tcp", clusterIP(oldA, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodA1}}, limit)
	e.await(proxytest.Outside, "tcp", e.nodePort(oldB), expectation{backends: []string{proxytest.PodB1}}, limit)
	pid := e.proxy.Process().Pid()

	if err := e.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	reset := time.Now()
	// The new cluster: the same ClusterIP as old-b for another Service with
	// other endpoints and no NodePort, and a new Service.
	reused := e.createService(ctx, e.top.Service("reused", 51), proxytest.Ready(proxytest.PodA2)...)
	fresh := e.createService(ctx, e.top.Service("fresh", 60), proxytest.Ready(proxytest.PodB3)...)
	took := e.await(proxytest.Client1, "tcp", clusterIP(fresh, v1.IPv4Protocol), expectation{backends: []string{proxytest.PodB3},
		why: "kproxy did not converge to the new cluster: its watches resume at the old cluster's resourceVersion, " +
			"which the new API server must refuse as too large (or 410), and kproxy must then list again"},
		60*time.Second) // backoff up to 30 s, the server's too-large-resourceVersion wait, a relist
	t.Logf("new cluster's Service programmed %v after the reset", took.Round(time.Millisecond))
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		e.await(proxytest.Client1, "tcp", clusterIP(reused, fam), expectation{backends: []string{proxytest.PodA2}}, limit)
		e.await(proxytest.Client1, "tcp", clusterIP(oldA, fam), expectation{notAnswered: true}, limit)
	}
	e.await(proxytest.Outside, "tcp", e.nodePort(oldB), expectation{rejected: true}, limit)
	e.awaitNoRules(ctx, "default/old-", limit)
	e.awaitNoRules(ctx, "default/kpt-ready:", limit) // the sentinel was in the old cluster only
	t.Logf("converged %v after the reset", time.Since(reset).Round(time.Millisecond))
	if !e.proxy.Running() || e.proxy.Process().Pid() != pid {
		t.Fatalf("kproxy did not keep running (pid %d → %d, running %v)", pid, e.proxy.Process().Pid(), e.proxy.Running())
	}
}
