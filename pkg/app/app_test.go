package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// testTimeout bounds every wait of these tests; nothing is timed.
const testTimeout = 60 * time.Second

var errRejected = errors.New("fake backend: rejected")

// fakeBackend records the snapshots it is asked to program and fails while
// fail is set. unsupported, when set, is what it says it left out.
type fakeBackend struct {
	family v1.IPFamily
	env    Env
	mu     sync.Mutex
	fail   error
	syncs  []*intent.View
	// unsupported lists what the backend says it cannot program as asked.
	unsupported []proxy.Unsupported
	// quarantine lists the ports the backend says it left out.
	quarantine []proxy.QuarantinedPort
}

func (b *fakeBackend) Quarantined() []proxy.QuarantinedPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.quarantine
}

func (b *fakeBackend) Unsupported() []proxy.Unsupported {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unsupported
}

func (b *fakeBackend) Sync(_ context.Context, v *intent.View) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncs = append(b.syncs, v)
	return b.fail
}

func (b *fakeBackend) syncCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.syncs)
}

func (b *fakeBackend) setFail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail = err
}

// harness runs kproxy (RunWith) on a manifest directory with fake backends.
type harness struct {
	t        *testing.T
	dir      string
	backends map[v1.IPFamily]*fakeBackend
	clock    *clocktesting.FakeClock
	addrs    chan [2]string // server name, address
	synced   chan syncResult
	// done is closed when RunWith returns, with its error in runErr.
	done    chan struct{}
	runErr  error
	cancel  context.CancelFunc
	servers map[string]string
	// expectErr: RunWith's error is checked by the test.
	expectErr bool
}

type syncResult struct {
	gen  uint64
	snap *proxy.Snapshot
	err  error
}

// options parses kproxy flags the way the command does.
func options(t *testing.T, args ...string) *config.Options {
	t.Helper()
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o := config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	return o
}

// run configures a harness.
type run struct {
	// tweak adjusts the options and dependencies.
	tweak func(o *config.Options, d *Deps)
	// unsupported is what every fake backend reports it left out.
	unsupported []proxy.Unsupported
	// ctx is the base context (default: Background), e.g. with a logger.
	ctx context.Context
	// args are added to the command line (e.g. --config).
	args []string
}

// start runs kproxy as node1 over dir with an IPv4 and an IPv6 fake
// backend, metrics and healthz on loopback port 0, and health check node
// ports on 127.0.0.1.
func start(t *testing.T, dir string, cfg run) *harness {
	t.Helper()
	h := &harness{t: t, dir: dir, backends: map[v1.IPFamily]*fakeBackend{},
		clock: clocktesting.NewFakeClock(time.Now()), addrs: make(chan [2]string, 8),
		synced: make(chan syncResult, 1000), done: make(chan struct{}), servers: map[string]string{}}
	o := options(t, append([]string{"--manifests", dir, "--hostname-override", "node1", "--proxy-mode", "iptables",
		"--iptables-min-sync-period", "10ms", "--iptables-sync-period", "1s"}, cfg.args...)...)
	o.Config.MetricsBindAddress = "127.0.0.1:0"
	o.Config.HealthzBindAddress = "127.0.0.1:0"
	mode := Mode{
		NewBackend: func(_ context.Context, _ *config.Options, env Env) (Backends, error) {
			if env.Metrics == nil || env.NodeName != "node1" {
				return nil, fmt.Errorf("incomplete Env %+v", env)
			}
			var bs Backends
			for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				b := &fakeBackend{family: f, env: env, unsupported: cfg.unsupported}
				h.backends[f] = b
				bs = append(bs, FamilyBackend{Family: f, Backend: b})
			}
			return bs, nil
		},
		ClassifyError: func(err error) metrics.Cause {
			if errors.Is(err, errRejected) {
				return metrics.CauseRejected
			}
			return ""
		},
	}
	d := Deps{
		Modes:          Modes{"iptables": mode},
		HealthCheckIPs: loopback,
		Clock:          h.clock,
		OnListen:       func(server string, addr net.Addr) { h.addrs <- [2]string{server, addr.String()} },
		AfterSync: func(snap *proxy.Snapshot, err error) {
			h.synced <- syncResult{gen: snap.Generation, snap: snap, err: err}
		},
	}
	if cfg.tweak != nil {
		cfg.tweak(o, &d)
	}
	base := cfg.ctx
	if base == nil {
		// Logs go to the test's output, shown when it fails.
		_, base = ktesting.NewTestContext(t)
	}
	ctx, cancel := context.WithTimeout(base, testTimeout)
	h.cancel = cancel
	go func() {
		h.runErr = RunWith(ctx, o, d)
		close(h.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
		if h.runErr != nil && !h.expectErr {
			t.Errorf("RunWith: %v", h.runErr)
		}
	})
	return h
}

// waitServers waits until each named server listens.
func (h *harness) waitServers(names ...string) {
	h.t.Helper()
	for _, n := range names {
		for h.servers[n] == "" {
			select {
			case a := <-h.addrs:
				h.servers[a[0]] = a[1]
			case <-h.done:
				h.t.Fatalf("kproxy stopped: %v", h.runErr)
			case <-time.After(testTimeout):
				h.t.Fatalf("server %s never listened", n)
			}
		}
	}
}

// waitSync waits for the next sync that satisfies ok.
func (h *harness) waitSync(what string, ok func(syncResult) bool) syncResult {
	h.t.Helper()
	deadline := time.After(testTimeout)
	for {
		select {
		case r := <-h.synced:
			if ok(r) {
				return r
			}
		case <-h.done:
			h.t.Fatalf("kproxy stopped while waiting for %s: %v", what, h.runErr)
		case <-deadline:
			h.t.Fatalf("no sync: %s", what)
		}
	}
}

func succeeded(r syncResult) bool { return r.err == nil }

// write replaces a manifest file atomically.
func (h *harness) write(name, content string) {
	h.t.Helper()
	tmp := filepath.Join(h.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.dir, name)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) remove(name string) {
	h.t.Helper()
	if err := os.Remove(filepath.Join(h.dir, name)); err != nil {
		h.t.Fatal(err)
	}
}

// changed waits for a successful sync of a generation after gen.
func (h *harness) changed(what string, gen uint64) uint64 {
	h.t.Helper()
	return h.waitSync(what, func(r syncResult) bool { return r.err == nil && r.gen > gen }).gen
}

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

type reply struct {
	code   int
	header http.Header
	body   []byte
}

func fetch(t *testing.T, url string) reply {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

// scrape reads /metrics over HTTP and parses the text format.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	r := fetch(t, "http://"+addr+"/metrics")
	if r.code != http.StatusOK {
		t.Fatalf("/metrics: %d", r.code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(r.body)))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// sample returns the value of the series of name with the given labels
// (a histogram's sample count), and whether it exists.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func manifests(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func freePort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

const nodeYAML = `apiVersion: v1
kind: Node
metadata:
  name: node1
%s
status:
  addresses:
  - type: InternalIP
    address: 192.168.50.11
`

const deletingNode = `spec:
  taints:
  - key: ToBeDeletedByClusterAutoscaler
    effect: NoSchedule`

// lbYAML is a LoadBalancer Service with externalTrafficPolicy Local and a
// health check node port, and its slice with an endpoint on nodeName.
func lbYAML(hcPort int32, nodeName string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ports:
  - name: http
    port: 80
    targetPort: 8080
    nodePort: 30080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels:
    kubernetes.io/service-name: web
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: "2020-01-01T00:00:00Z"
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
- addresses: [10.244.1.20]
  nodeName: %s
`, hcPort, nodeName)
}

// localOnlyYAML is a Service with internalTrafficPolicy Local whose only
// endpoint runs on another node.
const localOnlyYAML = `apiVersion: v1
kind: Service
metadata:
  name: cache
  namespace: demo
spec:
  internalTrafficPolicy: Local
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30]
  ports:
  - port: 6379
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: cache-1
  namespace: demo
  labels:
    kubernetes.io/service-name: cache
addressType: IPv4
ports:
- port: 6379
  protocol: TCP
endpoints:
- addresses: [10.244.2.30]
  nodeName: node2
`

// TestOtherFamilyChangesSkipABackend: a change that only concerns IPv4
// ports does not sync the IPv6 backend; periodic and full syncs reach both.
func TestOtherFamilyChangesSkipABackend(t *testing.T) {
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(freePort(t), "node1")})
	h := start(t, dir, run{})
	gen := h.waitSync("first sync", succeeded).gen
	v4, v6 := h.backends[v1.IPv4Protocol].syncCount(), h.backends[v1.IPv6Protocol].syncCount()
	if v4 == 0 || v6 == 0 {
		t.Fatalf("first sync reached IPv4 %d, IPv6 %d times", v4, v6)
	}
	h.write("web.yaml", strings.Replace(lbYAML(freePort(t), "node1"), "port: 80\n", "port: 81\n", 1))
	h.changed("IPv4-only change", gen)
	if got := h.backends[v1.IPv6Protocol].syncCount(); got != v6 {
		t.Errorf("an IPv4-only change synced the IPv6 backend (%d → %d calls)", v6, got)
	}
	if got := h.backends[v1.IPv4Protocol].syncCount(); got <= v4 {
		t.Errorf("the IPv4 backend was not synced (%d → %d calls)", v4, got)
	}
}

// With Deps.CollectAfterFullSync, a collection runs once the first (full)
// sync is over, before AfterSync is told.
func TestCollectAfterFullSync(t *testing.T) {
	forced := func() uint32 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.NumForcedGC
	}
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(freePort(t), "node1")})
	before := forced()
	h := start(t, dir, run{tweak: func(_ *config.Options, d *Deps) { d.CollectAfterFullSync = true }})
	h.waitSync("first sync", succeeded)
	if forced() == before {
		t.Error("no collection after the first full sync")
	}
}
