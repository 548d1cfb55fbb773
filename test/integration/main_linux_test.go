package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// Binaries built once per test binary by TestMain, as root with kernel tests
// enabled (otherwise every test skips before using them).
var (
	echoBin, kproxyBin string
	kproxyBuildErr     error
)

func TestMain(m *testing.M) {
	os.Exit(netns.MainWithBinaries(m, e2e.KProxyPackage, raceEnabled, func(b netns.Binaries) {
		echoBin, kproxyBin, kproxyBuildErr = b.Echo, b.Main, b.MainErr
	}))
}

// LogDirEnv names a directory that keeps kproxy's logs of every test
// (kproxy-<run>.log under <dir>/<test>-<random>/); by default they go to
// the test's temporary directory and only failures print their end.
const LogDirEnv = "KPROXY_INTEGRATION_LOGS"

// flavour is the iptables flavour the tests seed node1 with.
const flavour = "nft"

// requireIntegration skips (fails under CI=true) without kernel tests
// enabled, root, the tools, kproxy or the control-plane binaries, and
// returns the binaries.
func requireIntegration(t testing.TB) controlplane.Binaries {
	t.Helper()
	netns.Require(t, "iptables", "iptables-"+flavour, "ip6tables-"+flavour, "iptables-"+flavour+"-save", "iptables-"+flavour+"-restore")
	if kproxyBuildErr != nil {
		skipOrFail(t, fmt.Sprintf("building kproxy: %v", kproxyBuildErr))
	}
	return controlPlaneBinaries(t)
}

func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true: " + msg)
	}
	t.Skip(msg)
}

// controlPlaneBinaries returns the built etcd and kube-apiserver. Outside
// CI, missing binaries skip the test (a cold build takes many minutes)
// unless KPROXY_CONTROLPLANE_BUILD=1. Under CI=true they are built ("make
// test-integration" builds them first, so this is a check), and a build
// that would run past the test deadline is cancelled with advice.
func controlPlaneBinaries(t testing.TB) controlplane.Binaries {
	t.Helper()
	bins, err := controlplane.Ensure(context.Background(), controlplane.BuildOptions{NoBuild: true})
	if err == nil {
		return bins
	}
	if !errors.Is(err, controlplane.ErrNotBuilt) {
		t.Fatal(err)
	}
	if os.Getenv("CI") != "true" && os.Getenv("KPROXY_CONTROLPLANE_BUILD") != "1" {
		t.Skipf("%v; or set KPROXY_CONTROLPLANE_BUILD=1 to build from the test", err)
	}
	ctx := context.Background()
	if dl, ok := t.(*testing.T); ok {
		if d, ok := dl.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Minute))
			defer cancel()
		}
	}
	if bins, err = controlplane.Ensure(ctx, controlplane.BuildOptions{Logf: t.Logf}); err != nil {
		if ctx.Err() != nil {
			t.Fatalf("building the control plane did not finish before the test deadline: run make controlplane "+
				"(go run ./test/controlplane/build) before the tests, or raise -timeout: %v", err)
		}
		t.Fatal(err)
	}
	return bins
}

// env is one test's world: the namespace topology, the control plane on its
// node network, and kproxy in node1.
type env struct {
	t *testing.T
	*Env
	top   *proxytest.Topology
	proxy *e2e.Proxy
	// sentinel is the readiness Service (ClusterIP, endpoint pod-a2).
	sentinel *v1.Service
}

// newEnv builds the topology and the control plane, seeds node1's
// firewall, creates the sentinel Service through the API and starts kproxy
// with deploy/'s RBAC, waiting until the sentinel answers. Cleanup stops
// kproxy, then checks every request it made against RBAC (CheckRBAC).
func newEnv(t *testing.T, extra ...string) *env {
	t.Helper()
	bins := requireIntegration(t)
	c := netns.New(t, netns.Options{EchoBinary: echoBin})
	ctx := testCtx(t, 3*time.Minute)
	ie, err := Start(ctx, Options{Cluster: c, Binaries: bins, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, Env: ie, top: c.Topology}
	t.Cleanup(func() {
		if t.Failed() {
			logTail(t, "kube-apiserver.log", e.ControlPlane.Dir+"/kube-apiserver.log", 40)
		}
		if err := e.Close(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	if err := SeedFlavour(ctx, c, proxytest.Node1, flavour); err != nil {
		t.Fatal(err)
	}
	e.sentinel = e.createService(ctx, e.top.Service("kpt-ready", e2e.SentinelIndex), proxytest.Ready(proxytest.PodA2)...)
	logDir := os.Getenv(LogDirEnv)
	if logDir == "" {
		logDir = t.TempDir()
	} else if logDir, err = os.MkdirTemp(logDir, t.Name()+"-"); err != nil {
		t.Fatal(err)
	}
	e.proxy = e.Proxy(kproxyBin, "", logDir, append([]string{"--cluster-cidr", e.top.ClusterCIDR4.String() + "," + e.top.ClusterCIDR6.String()}, extra...)...)
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpKproxy()
		}
		if e.proxy.Running() {
			if err := e.proxy.Stop(5 * time.Second); err != nil {
				t.Errorf("kproxy did not stop cleanly: %v", err)
			}
		}
		rep, err := e.CheckRBAC()
		if err != nil {
			t.Errorf("RBAC: %v", err)
		}
		t.Logf("kproxy's API calls, all granted by deploy/'s ClusterRole: %s", strings.Join(rep.Calls, ", "))
		for _, r := range rep.WhileStarting {
			t.Logf("refused while kube-apiserver was starting (its RBAC caches not filled yet): %s at %s", r, r.Received.Format(time.RFC3339Nano))
		}
	})
	e.startKproxy()
	return e
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startKproxy starts a kproxy run and waits until the sentinel answers in
// both families from node1.
func (e *env) startKproxy() {
	e.t.Helper()
	begin := time.Now()
	if err := e.proxy.Start(); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e2e.WaitReady(ctx, e.Cluster, proxytest.Node1, e2e.ServiceAddrs(e.sentinel)...) }()
	select {
	case err := <-done:
		if err != nil {
			e.t.Fatalf("kproxy never programmed the sentinel Service: %v", err)
		}
	case <-e.proxy.Process().Done():
		cancel()
		<-done
		e.t.Fatalf("kproxy exited before programming anything: %v", e.proxy.Process().Err())
	}
	e.t.Logf("kproxy programmed the sentinel %v after its start", time.Since(begin).Round(time.Millisecond))
}

// createService creates svc through the API and, as the EndpointSlice
// controller would, its slices listing eps. It returns the stored Service.
func (e *env) createService(ctx context.Context, svc *v1.Service, eps ...proxytest.EP) *v1.Service {
	e.t.Helper()
	out, err := e.Writer.CreateService(ctx, svc)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.Writer.SetEndpoints(ctx, out, eps...); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) dumpKproxy() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, table := range []string{"nat", "filter"} {
			if out, err := Save(ctx, e.Cluster, proxytest.Node1, fam, flavour, table); err == nil {
				e.t.Logf("%s %s in node1:\n%s", fam, table, e2e.LastLines(out, 80))
			}
		}
	}
	if p := e.proxy.Process(); p != nil {
		e.t.Logf("kproxy output (desired-state dumps left out):\n%s", e2e.LastLines(e2e.WithoutDumps(p.Output()), 60))
	}
}

func logTail(t *testing.T, name, path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("%s: %v", name, err)
		return
	}
	t.Logf("end of %s:\n%s", name, e2e.LastLines(string(data), n))
}

// clusterIP returns a Service's ClusterIP of one family on ServicePort.
func clusterIP(svc *v1.Service, fam v1.IPFamily) netip.AddrPort {
	for _, a := range e2e.ServiceAddrs(svc) {
		if (fam == v1.IPv6Protocol) == a.Addr().Is6() {
			return a
		}
	}
	return netip.AddrPort{}
}

// nodePort returns node1's IPv4 address with a Service's first NodePort.
func (e *env) nodePort(svc *v1.Service) netip.AddrPort {
	n, _ := e.top.Node(proxytest.Node1)
	return netip.AddrPortFrom(n.IPv4, uint16(svc.Spec.Ports[0].NodePort))
}

// expectation is what probes of one address must show: answers from
// exactly the backends named (each at least once, no other), or a refusal.
type expectation struct {
	backends []string
	rejected bool
	// notAnswered accepts anything but an answer (no rule: the packet goes
	// nowhere, or an ICMP error from elsewhere).
	notAnswered bool
	// why, when set, is added to a failure: what a timeout usually means.
	why string
}

func (x expectation) String() string {
	switch {
	case x.rejected:
		return "rejected"
	case x.notAnswered:
		return "no answer"
	}
	return "answers from " + strings.Join(x.backends, ", ")
}

// await probes addr from a host (new connections, 300 ms timeout each,
// 1.5 s when a refusal is expected) in rounds until one round satisfies x,
// or limit passes. A round is 4×len(backends)+2 probes (1 for refusals and
// silences). It returns how long it took.
func (e *env) await(from, proto string, addr netip.AddrPort, x expectation, limit time.Duration) time.Duration {
	e.t.Helper()
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last []echo.Result
	for ctx.Err() == nil {
		last = e.round(ctx, from, proto, addr, x)
		if x.holds(last) {
			return time.Since(begin)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if x.why != "" {
		e.t.Errorf("%s", x.why)
	}
	e.t.Fatalf("%s %s from %s: want %s within %v; last round: %v", proto, addr, from, x, limit, last)
	return 0
}

func (e *env) round(ctx context.Context, from, proto string, addr netip.AddrPort, x expectation) []echo.Result {
	n, timeout := 1, 300*time.Millisecond
	if len(x.backends) > 0 {
		n = 4*len(x.backends) + 2
	}
	if x.rejected {
		// Over IPv6, a pod's connect() on node1 ignores the ICMPv6 error
		// answering its first SYN (the client counts it in
		// Icmp6InDestUnreachs) and fails only on the one answering the
		// retransmission, 1 s later; the e2e table's 1.5 s probes allow
		// for that too.
		timeout = 1500 * time.Millisecond
	}
	out := make([]echo.Result, 0, n)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		out = append(out, e.Cluster.Probe(ctx, from, proto, addr, echo.ProbeOptions{Timeout: timeout}))
	}
	return out
}

func (x expectation) holds(rs []echo.Result) bool {
	if len(rs) == 0 {
		return false
	}
	seen := map[string]bool{}
	for _, r := range rs {
		switch {
		case x.rejected:
			if r.Outcome != echo.Rejected {
				return false
			}
		case x.notAnswered:
			if r.Outcome == echo.Answer {
				return false
			}
		default:
			if r.Outcome != echo.Answer {
				return false
			}
			seen[r.Reply.Name] = true
		}
	}
	if x.rejected || x.notAnswered {
		return true
	}
	for _, b := range x.backends {
		if !seen[b] {
			return false
		}
		delete(seen, b)
	}
	return len(seen) == 0
}
