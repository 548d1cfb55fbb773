package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/healthcheck"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// sliceWithTrigger is the web slice with a second endpoint and a trigger
// time after kproxy started.
func sliceWithTrigger(hcPort int32) string {
	trigger := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339)
	s := strings.Replace(lbYAML(hcPort, "node1"), "2020-01-01T00:00:00Z", trigger, 1)
	return s + "- addresses: [10.244.2.21]\n  nodeName: node2\n"
}

// TestMetricsAfterSync scrapes /metrics over HTTP after syncs and checks the
// upstream and kproxy metric names, their types, and that their values
// follow what the syncs did.
func TestMetricsAfterSync(t *testing.T) {
	hc := freePort(t)
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(hc, "node1"), "cache.yaml": localOnlyYAML})
	h := start(t, dir, run{})
	gen := h.waitSync("first sync", succeeded).gen
	h.waitServers("metrics", "healthz")
	fetch(t, "http://"+h.servers["healthz"]+"/healthz")

	fams := scrape(t, h.servers["metrics"])
	for name, typ := range map[string]dto.MetricType{
		"kubeproxy_sync_proxy_rules_duration_seconds":                        dto.MetricType_HISTOGRAM,
		"kubeproxy_sync_full_proxy_rules_duration_seconds":                   dto.MetricType_HISTOGRAM,
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":                  dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds":           dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":                  dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":                dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_service_changes_total":                   dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_service_changes_pending":                 dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total":                dto.MetricType_GAUGE,
		"kubeproxy_proxy_healthz_total":                                      dto.MetricType_COUNTER,
		"kubeproxy_conntrack_reconciler_deleted_entries_total":               dto.MetricType_COUNTER,
		"kproxy_sync_failures_total":                                         dto.MetricType_COUNTER,
		"kproxy_build_info":                                                  dto.MetricType_GAUGE,
		"process_cpu_seconds_total":                                          dto.MetricType_COUNTER,
	} {
		if mf := fams[name]; mf == nil {
			t.Errorf("%s missing from /metrics", name)
		} else if mf.GetType() != typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), typ)
		}
	}
	if _, ok := fams["kproxy_hns_call_duration_seconds"]; ok {
		t.Errorf("HNS metrics exposed in iptables mode")
	}
	type check struct {
		name   string
		labels []string
		ok     func(float64) bool
		want   string
	}
	positive := func(v float64) bool { return v > 0 }
	atLeast := func(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
	equal := func(n float64) func(float64) bool { return func(v float64) bool { return v == n } }
	verify := func(stage string, checks []check) {
		t.Helper()
		fams := scrape(t, h.servers["metrics"])
		for _, c := range checks {
			v, found := sample(fams, c.name, c.labels...)
			if !found || !c.ok(v) {
				t.Errorf("%s: %s%v = %v (found %v), want %s", stage, c.name, c.labels, v, found, c.want)
			}
		}
	}
	verify("first sync", []check{
		{"kubeproxy_sync_proxy_rules_duration_seconds", []string{"ip_family", "IPv4"}, atLeast(1), ">= 1 sync"},
		{"kubeproxy_sync_proxy_rules_duration_seconds", []string{"ip_family", "IPv6"}, atLeast(1), ">= 1 sync"},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", []string{"ip_family", "IPv4"}, atLeast(1), "the first sync is full"},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", []string{"ip_family", "IPv4"}, positive, "> 0"},
		{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", []string{"ip_family", "IPv6"}, positive, "> 0"},
		{"kubeproxy_sync_proxy_rules_service_changes_total", nil, atLeast(2), ">= 2 (two Services)"},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, atLeast(2), ">= 2 (two slices)"},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"ip_family", "IPv4", "traffic_policy", "internal"}, equal(1), "1 (cache)"},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"ip_family", "IPv4", "traffic_policy", "external"}, equal(0), "0 (web has a local endpoint)"},
		{"kubeproxy_proxy_healthz_total", []string{"code", "200"}, equal(1), "1"},
		{"kproxy_build_info", nil, equal(1), "1"},
		{"kproxy_sync_failures_total", []string{"ip_family", "IPv4", "cause", "rejected"}, equal(0), "0"},
	})
	if v, _ := sample(scrape(t, h.servers["metrics"]), "kubeproxy_network_programming_duration_seconds", "ip_family", "IPv4"); v != 0 {
		t.Errorf("changes made before kproxy started were measured: %v samples", v)
	}

	// An EndpointSlice change with a trigger time: network programming
	// latency is measured, changes are counted.
	before, _ := sample(scrape(t, h.servers["metrics"]), "kubeproxy_sync_proxy_rules_endpoint_changes_total")
	h.write("web.yaml", sliceWithTrigger(hc))
	gen = h.changed("trigger time", gen)
	verify("after an EndpointSlice change", []check{
		{"kubeproxy_network_programming_duration_seconds", []string{"ip_family", "IPv4"}, equal(1), "1 sample"},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, atLeast(before + 1), fmt.Sprintf(">= %v", before+1)},
		{"kubeproxy_sync_partial_proxy_rules_duration_seconds", []string{"ip_family", "IPv4"}, atLeast(1), "a partial sync"},
	})

	// A backend failure is counted by family and cause.
	h.backends[v1.IPv4Protocol].setFail(fmt.Errorf("restore: %w", errRejected))
	h.write("cache.yaml", strings.ReplaceAll(localOnlyYAML, "6379", "6380"))
	h.waitSync("failed sync", func(r syncResult) bool { return r.err != nil })
	verify("after a failed sync", []check{
		{"kproxy_sync_failures_total", []string{"ip_family", "IPv4", "cause", "rejected"}, atLeast(1), ">= 1"},
		{"kproxy_sync_failures_total", []string{"ip_family", "IPv6", "cause", "rejected"}, equal(0), "0"},
	})
	h.backends[v1.IPv4Protocol].setFail(nil)
	h.changed("recovery", gen)
}

// TestHealth checks /healthz, /livez and a health check node port through
// local endpoints coming and going, node deletion, sync failures and the
// Service's deletion.
func TestHealth(t *testing.T) {
	hc := freePort(t)
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(hc, "node1")})
	h := start(t, dir, run{})
	gen := h.waitSync("first sync", succeeded).gen
	h.waitServers("healthz")
	healthz, livez, hcURL := "http://"+h.servers["healthz"]+"/healthz", "http://"+h.servers["healthz"]+"/livez", fmt.Sprintf("http://127.0.0.1:%d/", hc)

	expect := func(stage string, hz, lz, port int, weight string, eligible bool) {
		t.Helper()
		r := fetch(t, healthz)
		if r.code != hz || r.json(t)["nodeEligible"] != eligible {
			t.Errorf("%s: /healthz %d %s, want %d nodeEligible=%v", stage, r.code, r.body, hz, eligible)
		}
		if r := fetch(t, livez); r.code != lz {
			t.Errorf("%s: /livez %d %s, want %d", stage, r.code, r.body, lz)
		}
		r = fetch(t, hcURL)
		if r.code != port || r.header.Get(healthcheck.WeightHeader) != weight {
			t.Errorf("%s: health check node port %d weight %q, want %d %q (%s)", stage, r.code, r.header.Get(healthcheck.WeightHeader), port, weight, r.body)
		}
	}
	expect("local endpoint", 200, 200, 200, "1", true)

	h.write("web.yaml", lbYAML(hc, "node2"))
	gen = h.changed("endpoint moved away", gen)
	expect("no local endpoint", 200, 200, 503, "0", true)

	h.write("web.yaml", lbYAML(hc, "node1"))
	gen = h.changed("endpoint back", gen)
	h.write("node.yaml", fmt.Sprintf(nodeYAML, deletingNode))
	gen = h.changed("node tainted", gen)
	expect("node being deleted", 503, 200, 200, "1", false)

	h.write("node.yaml", fmt.Sprintf(nodeYAML, ""))
	gen = h.changed("taint removed", gen)
	expect("node back", 200, 200, 200, "1", true)

	// Syncs fail: once a queued change is older than 2 × syncPeriod (1s),
	// the proxy is unhealthy, and so is every health check node port.
	h.backends[v1.IPv4Protocol].setFail(errors.New("HNS is restarting"))
	h.write("web.yaml", strings.Replace(lbYAML(hc, "node1"), "port: 80\n", "port: 81\n", 1))
	h.waitSync("failed sync of the change", func(r syncResult) bool { return r.err != nil && r.gen > gen })
	h.clock.Step(2*time.Second + time.Millisecond)
	expect("syncs failing", 503, 503, 503, "1", true)
	if body := fetch(t, hcURL).json(t); body["serviceProxyHealthy"] != false {
		t.Errorf("health check node port body %v", body)
	}
	h.backends[v1.IPv4Protocol].setFail(nil)
	gen = h.changed("recovered", gen)
	expect("recovered", 200, 200, 200, "1", true)

	// The Service and its slice go away in two events, maybe two syncs.
	h.remove("web.yaml")
	h.waitSync("Service deleted", func(r syncResult) bool { return r.err == nil && r.snap.IPv4.Len() == 0 })
	if _, err := httpClient.Get(hcURL); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("health check node port of a deleted Service: %v, want connection refused", err)
	}
}

// TestManifestModeWarnsInLogs checks that without an API server what a
// backend left out is logged once per Service and reason (two ports of one
// Service with one reason: one line), and nothing else; the gauge counts
// every entry by reason.
func TestManifestModeWarnsInLogs(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer()
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "cache.yaml": localOnlyYAML})
	svc := types.NamespacedName{Namespace: "demo", Name: "cache"}
	h := start(t, dir, run{ctx: ctx, unsupported: []proxy.Unsupported{
		{Service: svc, Port: "a", Reason: "NoSessionAffinity", Message: "HNS cannot do it"},
		{Service: svc, Port: "b", Reason: "NoSessionAffinity", Message: "HNS cannot do it"},
	}})
	gen := h.waitSync("first sync", succeeded).gen
	h.write("cache.yaml", strings.ReplaceAll(localOnlyYAML, "6379", "6380"))
	h.changed("second sync", gen)
	if n := strings.Count(buf.String(), "Warning: Part of a Service is not programmed as asked"); n != 2 {
		t.Errorf("warning logged %d times, want once per family:\n%s", n, buf.String())
	}
	h.waitServers("metrics")
	got := fetch(t, "http://"+h.servers["metrics"]+"/metrics")
	if !strings.Contains(string(got.body), `kproxy_unsupported_service_ports{ip_family="IPv4",reason="NoSessionAffinity"} 2`) {
		t.Errorf("metrics lack the unsupported gauge:\n%s", got.body)
	}
}

// TestQuarantinedPortsAreReportedAndSyncSucceeds: a backend that leaves out
// a port the platform rejected still syncs successfully (health stays good);
// the port is counted in kproxy_sync_quarantined_service_ports and warned
// about once (log line; Event with an API server).
func TestQuarantinedPortsAreReportedAndSyncSucceeds(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer()
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "cache.yaml": localOnlyYAML})
	h := start(t, dir, run{ctx: ctx})
	q := proxy.QuarantinedPort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "cache"}, Protocol: v1.ProtocolSCTP},
		Family: v1.IPv4Protocol, Reason: "iptables-restore: line 7 failed"}
	gen := h.waitSync("first sync", succeeded).gen
	h.backends[v1.IPv4Protocol].mu.Lock()
	h.backends[v1.IPv4Protocol].quarantine = []proxy.QuarantinedPort{q}
	h.backends[v1.IPv4Protocol].mu.Unlock()
	h.write("cache.yaml", strings.ReplaceAll(localOnlyYAML, "6379", "6380"))
	h.changed("second sync", gen)
	h.waitServers("metrics", "healthz")
	if code := fetch(t, "http://"+h.servers["healthz"]+"/healthz").code; code != 200 {
		t.Errorf("/healthz %d with a quarantined port, want 200", code)
	}
	fams := scrape(t, h.servers["metrics"])
	got := map[string]float64{}
	for _, m := range fams["kproxy_sync_quarantined_service_ports"].GetMetric() {
		got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
	}
	if got["IPv4"] != 1 || got["IPv6"] != 0 {
		t.Errorf("kproxy_sync_quarantined_service_ports %v, want IPv4 1, IPv6 0", got)
	}
	if n := strings.Count(buf.String(), "reason=\"Quarantined\""); n != 1 {
		t.Errorf("quarantine warned %d times, want once:\n%s", n, buf.String())
	}
}

// TestServerBindFailure checks --bind-address-hard-fail: without it a
// healthz port in use is logged and kproxy keeps programming; with it kproxy
// stops with an error.
func TestServerBindFailure(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Close() }()
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "cache.yaml": localOnlyYAML})
	useBusy := func(o *config.Options, _ *Deps) { o.Config.HealthzBindAddress = busy.Addr().String() }

	h := start(t, dir, run{tweak: useBusy})
	h.waitSync("sync despite the busy healthz port", succeeded)

	hard := func(o *config.Options, d *Deps) {
		useBusy(o, d)
		o.Config.BindAddressHardFail = true
	}
	h2 := start(t, dir, run{tweak: hard})
	h2.expectErr = true
	select {
	case <-h2.done:
		if err := h2.runErr; err == nil || !strings.Contains(err.Error(), "healthz server on "+busy.Addr().String()) {
			t.Errorf("RunWith: %v, want the healthz bind error", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("kproxy kept running with a busy healthz port and --bind-address-hard-fail")
	}
}

// TestProfiling: /debug/pprof/ is served on the metrics server only when
// enableProfiling (--profiling) is set.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("enableProfiling=", on), func(t *testing.T) {
			dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "cache.yaml": localOnlyYAML})
			h := start(t, dir, run{tweak: func(o *config.Options, _ *Deps) { o.Config.EnableProfiling = on }})
			h.waitSync("first sync", succeeded)
			h.waitServers("metrics", "healthz")
			heap := fetch(t, "http://"+h.servers["metrics"]+"/debug/pprof/heap?debug=1")
			if !on {
				if heap.code != http.StatusNotFound {
					t.Errorf("profiling off: /debug/pprof/heap answered %d, want 404", heap.code)
				}
				return
			}
			if heap.code != http.StatusOK || !strings.Contains(string(heap.body), "heap profile:") {
				t.Errorf("profiling on: /debug/pprof/heap answered %d: %.100q", heap.code, heap.body)
			}
			if idx := fetch(t, "http://"+h.servers["metrics"]+"/debug/pprof/"); idx.code != http.StatusOK || !strings.Contains(string(idx.body), "goroutine") {
				t.Errorf("profiling on: /debug/pprof/ answered %d", idx.code)
			}
			if healthz := fetch(t, "http://"+h.servers["healthz"]+"/debug/pprof/"); healthz.code == http.StatusOK {
				t.Errorf("profiles served on the healthz port too")
			}
		})
	}
}

// TestMetricsServerURLs: the metrics server answers upstream kube-proxy's
// URLs besides /metrics: /healthz, /proxyMode (read by sig-network's e2e
// tests), /configz and /flagz.
func TestMetricsServerURLs(t *testing.T) {
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "cache.yaml": localOnlyYAML})
	h := start(t, dir, run{tweak: func(o *config.Options, _ *Deps) { o.Config.Mode = config.ModeIPVS }})
	h.waitSync("first sync", succeeded)
	h.waitServers("metrics")
	base := "http://" + h.servers["metrics"]
	for _, tc := range []struct{ path, want string }{
		{"/healthz", "ok"},
		// kproxy runs its iptables backend for mode ipvs: that is the mode
		// whose rules the node has.
		{"/proxyMode", "iptables"},
		{"/configz", `{"kubeproxy.config.k8s.io":{"kind":"KubeProxyConfiguration","apiVersion":"kubeproxy.config.k8s.io/v1alpha1"`},
		{"/flagz", "kproxy flags"},
	} {
		got := fetch(t, base+tc.path)
		if got.code != http.StatusOK || !strings.HasPrefix(string(got.body), tc.want) {
			t.Errorf("%s: %d %.200q, want 200 starting with %q", tc.path, got.code, got.body, tc.want)
		}
	}
	got := fetch(t, base+"/configz")
	if !strings.Contains(string(got.body), `"mode":"ipvs"`) {
		t.Errorf("/configz does not show the configured mode: %.300s", got.body)
	}
}

// TestQuarantineRetryIsScheduled: a backend's quarantined port is retried at
// its retry time: the runner is asked for a sync then, without any change
// and long before the periodic sync.
func TestQuarantineRetryIsScheduled(t *testing.T) {
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "cache.yaml": localOnlyYAML})
	retries := make(chan time.Duration, 100)
	tweak := func(o *config.Options, d *Deps) {
		o.Config.IPTables.SyncPeriod.Duration = time.Hour
		d.OnRetryScheduled = func(delay time.Duration) { retries <- delay }
	}
	h := start(t, dir, run{tweak: tweak})
	gen := h.waitSync("first sync", succeeded).gen
	select {
	case d := <-retries:
		t.Fatalf("a retry after %v was asked with nothing quarantined", d)
	default:
	}
	b := h.backends[v1.IPv4Protocol]
	// The app's clock is fake (it does not move): the delay asked is
	// exactly the time to the port's retry.
	const retryIn = 700 * time.Millisecond
	b.mu.Lock()
	b.quarantine = []proxy.QuarantinedPort{{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "cache"}, Protocol: v1.ProtocolTCP},
		Family: v1.IPv4Protocol, Reason: "rejected", Since: h.clock.Now(), Retry: h.clock.Now().Add(retryIn)}}
	b.mu.Unlock()
	h.write("cache.yaml", strings.ReplaceAll(localOnlyYAML, "6379", "6380"))
	h.changed("the sync that publishes the quarantine", gen)
	select {
	case d := <-retries:
		if d != retryIn {
			t.Errorf("the app asked the runner for a sync in %v, want %v (the port's retry)", d, retryIn)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app never asked the runner for the quarantined port's retry")
	}
	// That the runner then runs a sync at that delay, whatever the sync
	// period, is pkg/runner's TestTriggerAfter (on a fake clock).
	b.mu.Lock()
	b.quarantine = nil
	b.mu.Unlock()
}
