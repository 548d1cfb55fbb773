package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/pkg/proxy"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// families gathers the registry: metric name → type.
func families(t *testing.T, m *Metrics) map[string]dto.MetricType {
	t.Helper()
	mfs, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]dto.MetricType{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetType()
	}
	return out
}

func histogram(t *testing.T, o prometheus.Observer) *dto.Histogram {
	t.Helper()
	var d dto.Metric
	if err := o.(prometheus.Metric).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram()
}

var (
	common = map[string]dto.MetricType{
		"kubeproxy_sync_proxy_rules_duration_seconds":              dto.MetricType_HISTOGRAM,
		"kubeproxy_sync_full_proxy_rules_duration_seconds":         dto.MetricType_HISTOGRAM,
		"kubeproxy_sync_partial_proxy_rules_duration_seconds":      dto.MetricType_HISTOGRAM,
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": dto.MetricType_GAUGE,
		"kubeproxy_network_programming_duration_seconds":           dto.MetricType_HISTOGRAM,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":        dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_service_changes_total":         dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_service_changes_pending":       dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      dto.MetricType_GAUGE,
		"kubeproxy_proxy_healthz_total":                            dto.MetricType_COUNTER,
		"kubeproxy_proxy_livez_total":                              dto.MetricType_COUNTER,
		"kproxy_sync_failures_total":                               dto.MetricType_COUNTER,
		"kproxy_sync_quarantined_service_ports":                    dto.MetricType_GAUGE,
		"kproxy_frontend_conflicts":                                dto.MetricType_GAUGE,
		"kproxy_service_ports_by_algorithm":                        dto.MetricType_GAUGE,
		"kproxy_build_info":                                        dto.MetricType_GAUGE,
		"process_start_time_seconds":                               dto.MetricType_GAUGE,
		"go_goroutines":                                            dto.MetricType_GAUGE,
	}
	iptablesOnly = map[string]dto.MetricType{
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": dto.MetricType_COUNTER,
		"kubeproxy_sync_proxy_rules_iptables_total":                          dto.MetricType_GAUGE,
		"kubeproxy_sync_proxy_rules_iptables_last":                           dto.MetricType_GAUGE,
		"kubeproxy_conntrack_reconciler_deleted_entries_total":               dto.MetricType_COUNTER,
		"kubeproxy_conntrack_reconciler_sync_duration_seconds":               dto.MetricType_HISTOGRAM,
		"kproxy_conntrack_reconciler_failures_total":                         dto.MetricType_COUNTER,
	}
	hnsOnly = map[string]dto.MetricType{
		"kproxy_hns_call_duration_seconds": dto.MetricType_HISTOGRAM,
		"kproxy_hns_errors_total":          dto.MetricType_COUNTER,
	}
)

// touch records one of everything, so every vector has a series.
func touch(m *Metrics) {
	m.Families(v1.IPv4Protocol)
	m.Queued(v1.IPv4Protocol)
	m.Synced(v1.IPv4Protocol, true, time.Millisecond)
	m.Synced(v1.IPv4Protocol, false, time.Millisecond)
	m.Programmed(v1.IPv4Protocol, []time.Time{t0})
	m.Served("/healthz", 200)
	m.IPTables(v1.IPv4Protocol).Conntrack(1, time.Millisecond, false)
	m.Served("/livez", 200)
	ipt := m.IPTables(v1.IPv4Protocol)
	ipt.Rules("nat", 10, 2)
	m.HNSCall("CreateLoadBalancer", time.Millisecond)
	m.HNSError("CreateLoadBalancer", "0x803b0013")
}

func TestRegisteredPerMode(t *testing.T) {
	for _, tc := range []struct {
		mode          string
		want, missing []map[string]dto.MetricType
	}{
		{ModeIPTables, []map[string]dto.MetricType{common, iptablesOnly}, []map[string]dto.MetricType{hnsOnly}},
		{ModeKernelspace, []map[string]dto.MetricType{common, hnsOnly}, []map[string]dto.MetricType{iptablesOnly}},
		{"", []map[string]dto.MetricType{common, iptablesOnly, hnsOnly}, nil},
	} {
		t.Run("mode="+tc.mode, func(t *testing.T) {
			m := New(Options{Mode: tc.mode, Version: "v9.9.9", Pending: func() (int, int) { return 0, 0 }, FrontendConflicts: func() int { return 0 },
				Clock: clocktesting.NewFakePassiveClock(t0)})
			touch(m)
			got := families(t, m)
			for _, set := range tc.want {
				for name, typ := range set {
					if g, ok := got[name]; !ok {
						t.Errorf("%s not registered", name)
					} else if g != typ {
						t.Errorf("%s: type %v, want %v", name, g, typ)
					}
				}
			}
			for _, set := range tc.missing {
				for name := range set {
					if _, ok := got[name]; ok {
						t.Errorf("%s registered in mode %q", name, tc.mode)
					}
				}
			}
		})
	}
}

func TestBucketsMatchUpstream(t *testing.T) {
	if len(syncBuckets) != 15 || syncBuckets[0] != 0.001 || syncBuckets[14] != 16.384 {
		t.Errorf("sync buckets %v", syncBuckets)
	}
	b := programmingBuckets()
	if len(b) != 81 {
		t.Fatalf("%d network programming buckets, want 81", len(b))
	}
	for i, want := range map[int]float64{0: 0, 1: 0.25, 2: 0.5, 3: 1, 61: 59, 62: 60, 73: 115, 74: 120, 80: 300} {
		if b[i] != want {
			t.Errorf("bucket %d = %v, want %v", i, b[i], want)
		}
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Errorf("buckets not increasing at %d: %v", i, b[i-1:i+1])
		}
	}
}

func TestSyncedAndQueued(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	m := New(Options{Clock: clk})
	for _, tc := range []struct {
		full                bool
		took                time.Duration
		wantFull, wantPartl uint64
	}{
		{true, 20 * time.Millisecond, 1, 0},
		{false, 3 * time.Millisecond, 1, 1},
		{false, 4 * time.Millisecond, 1, 2},
	} {
		clk.SetTime(clk.Now().Add(time.Second))
		m.Synced(v1.IPv6Protocol, tc.full, tc.took)
		if got := histogram(t, m.syncFullDuration.WithLabelValues("IPv6")).GetSampleCount(); got != tc.wantFull {
			t.Errorf("full syncs %d, want %d", got, tc.wantFull)
		}
		if got := histogram(t, m.syncPartialDuration.WithLabelValues("IPv6")).GetSampleCount(); got != tc.wantPartl {
			t.Errorf("partial syncs %d, want %d", got, tc.wantPartl)
		}
		if got, want := testutil.ToFloat64(m.lastSync.WithLabelValues("IPv6")), seconds(clk.Now()); got != want {
			t.Errorf("last sync %v, want %v", got, want)
		}
	}
	if got := histogram(t, m.syncDuration.WithLabelValues("IPv6")); got.GetSampleCount() != 3 || got.GetSampleSum() < 0.0269 || got.GetSampleSum() > 0.0271 {
		t.Errorf("all syncs: count %d sum %v, want 3 and 0.027", got.GetSampleCount(), got.GetSampleSum())
	}
	if n := testutil.CollectAndCount(m.syncDuration); n != 1 {
		t.Errorf("%d series, want only IPv6", n)
	}
	m.Queued(v1.IPv4Protocol)
	if got := testutil.ToFloat64(m.lastQueued.WithLabelValues("IPv4")); got != seconds(clk.Now()) {
		t.Errorf("last queued %v", got)
	}
}

func TestProgrammed(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	m := New(Options{Clock: clk})
	m.Programmed(v1.IPv4Protocol, nil)
	if n := testutil.CollectAndCount(m.programming); n != 0 {
		t.Errorf("no triggers made %d series", n)
	}
	m.Programmed(v1.IPv4Protocol, []time.Time{t0.Add(-1500 * time.Millisecond), t0.Add(-70 * time.Second), t0.Add(time.Minute)})
	h := histogram(t, m.programming.WithLabelValues("IPv4"))
	if h.GetSampleCount() != 3 || h.GetSampleSum() != 71.5 {
		t.Errorf("count %d sum %v, want 3 and 71.5 (future trigger counts 0)", h.GetSampleCount(), h.GetSampleSum())
	}
	cum := map[float64]uint64{}
	for _, b := range h.GetBucket() {
		cum[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for bound, want := range map[float64]uint64{0: 1, 1: 1, 2: 2, 65: 2, 70: 3} {
		if cum[bound] != want {
			t.Errorf("le=%v: %d, want %d", bound, cum[bound], want)
		}
	}
}

func TestChangesAndPending(t *testing.T) {
	svc, eps := 3, 7
	m := New(Options{Pending: func() (int, int) { return svc, eps }})
	m.ChangesProgrammed(2, 5)
	m.ChangesProgrammed(1, 0)
	if got := testutil.ToFloat64(m.serviceChanges); got != 3 {
		t.Errorf("service changes %v", got)
	}
	if got := testutil.ToFloat64(m.endpointChanges); got != 5 {
		t.Errorf("endpoint changes %v", got)
	}
	body := scrape(t, m)
	for _, want := range []string{"kubeproxy_sync_proxy_rules_service_changes_pending 3", "kubeproxy_sync_proxy_rules_endpoint_changes_pending 7"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	svc, eps = 0, 0
	if body := scrape(t, m); !strings.Contains(body, "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0\n") {
		t.Errorf("pending not read at scrape time")
	}
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestIPTables(t *testing.T) {
	m := New(Options{Mode: ModeIPTables})
	v4, v6 := m.IPTables(v1.IPv4Protocol), m.IPTables(v1.IPv6Protocol)
	v4.RestoreFailed(false)
	v4.RestoreFailed(true)
	v6.RestoreFailed(true)
	v4.Rules("nat", 120, 7)
	v4.Rules("filter", 30, 0)
	v4.Conntrack(4, time.Millisecond, false)
	v4.Conntrack(0, time.Millisecond, true)
	v6.Conntrack(-1, time.Millisecond, false)
	var nilRecorder *IPTablesMetrics
	nilRecorder.RestoreFailed(true)
	nilRecorder.Rules("nat", 1, 1)
	nilRecorder.Conntrack(1, time.Millisecond, true)
	for _, tc := range []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"restore v4", m.restoreFailures.WithLabelValues("IPv4"), 2},
		{"partial v4", m.partialRestoreFailures.WithLabelValues("IPv4"), 1},
		{"restore v6", m.restoreFailures.WithLabelValues("IPv6"), 1},
		{"partial v6", m.partialRestoreFailures.WithLabelValues("IPv6"), 1},
		{"nat total", m.iptablesRules.WithLabelValues("IPv4", "nat"), 120},
		{"nat last", m.iptablesRulesLast.WithLabelValues("IPv4", "nat"), 7},
		{"filter total", m.iptablesRules.WithLabelValues("IPv4", "filter"), 30},
		{"conntrack v4", m.conntrackDeleted.WithLabelValues("IPv4"), 4},
		{"conntrack v6", m.conntrackDeleted.WithLabelValues("IPv6"), 0},
		{"conntrack failures v4", m.conntrackFailures.WithLabelValues("IPv4"), 1},
		{"conntrack failures v6", m.conntrackFailures.WithLabelValues("IPv6"), 0},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestHNSAndServed(t *testing.T) {
	m := New(Options{Mode: ModeKernelspace})
	m.HNSCall("ListLoadBalancers", 3*time.Millisecond)
	m.HNSCall("ListLoadBalancers", 5*time.Millisecond)
	m.HNSError("CreateLoadBalancer", "0x803b0013")
	m.HNSError("CreateLoadBalancer", "0x803b0013")
	m.HNSError("DeleteEndpoint", "none")
	if h := histogram(t, m.hnsDuration.WithLabelValues("ListLoadBalancers")); h.GetSampleCount() != 2 {
		t.Errorf("HNS calls %d", h.GetSampleCount())
	}
	if got := testutil.ToFloat64(m.hnsErrors.WithLabelValues("CreateLoadBalancer", "0x803b0013")); got != 2 {
		t.Errorf("HNS errors %v", got)
	}
	m.Served("/healthz", 503)
	m.Served("/healthz", 200)
	m.Served("/healthz", 503)
	m.Served("/livez", 200)
	m.Served("/other", 200)
	if got := testutil.ToFloat64(m.healthz.WithLabelValues("503")); got != 2 {
		t.Errorf("healthz 503: %v", got)
	}
	if got := testutil.ToFloat64(m.livez.WithLabelValues("200")); got != 1 {
		t.Errorf("livez 200: %v", got)
	}
}

func TestBuildInfoAndFamilies(t *testing.T) {
	m := New(Options{Version: "v1.2.3"})
	m.Families(v1.IPv4Protocol, v1.IPv6Protocol)
	body := scrape(t, m)
	for _, want := range []string{
		`kproxy_build_info{go_version="go`,
		`platform="`,
		`version="v1.2.3"} 1`,
		`kproxy_sync_failures_total{cause="rejected",ip_family="IPv6"} 0`,
		`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestClassify(t *testing.T) {
	platformSays := func(c Cause) func(error) Cause { return func(error) Cause { return c } }
	for _, tc := range []struct {
		name     string
		err      error
		platform func(error) Cause
		want     Cause
	}{
		{"plain", errors.New("boom"), nil, CauseOther},
		{"deadline", fmt.Errorf("sync: %w", context.DeadlineExceeded), nil, CauseTimeout},
		{"unknown platform value ignored", errors.New("x"), platformSays("weird"), CauseOther},
		{"platform", errors.New("exit status 2"), platformSays(CauseRejected), CauseRejected},
		{"platform without opinion", errors.New("x"), platformSays(""), CauseOther},
		{"platform before deadline", context.DeadlineExceeded, platformSays(CauseUnavailable), CauseUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.err, tc.platform); got != tc.want {
				t.Errorf("Classify = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCountNoLocalEndpoints(t *testing.T) {
	ep := func(local bool) proxy.Endpoint {
		return proxy.Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Port: 80, Ready: true, Serving: true, Local: local}
	}
	port := func(name string, itpLocal, etpLocal, any bool, local ...proxy.Endpoint) *proxy.ServicePort {
		p := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Protocol: v1.ProtocolTCP},
			InternalPolicyLocal: itpLocal, ExternalPolicyLocal: etpLocal, HasAnyEndpoints: any, LocalEndpoints: local}
		if etpLocal {
			p.NodePort = 30000
		}
		return p
	}
	for _, tc := range []struct {
		name                   string
		ports                  []*proxy.ServicePort
		wantInternal, wantExtl int
	}{
		{"empty", nil, 0, 0},
		{"cluster policies never count", []*proxy.ServicePort{port("a", false, false, true)}, 0, 0},
		{"internal local, none here", []*proxy.ServicePort{port("a", true, false, true)}, 1, 0},
		{"external local, none here", []*proxy.ServicePort{port("a", false, true, true)}, 0, 1},
		{"both local, none here", []*proxy.ServicePort{port("a", true, true, true)}, 1, 1},
		{"local endpoint present", []*proxy.ServicePort{port("a", true, true, true, ep(true))}, 0, 0},
		{"no endpoints anywhere: rejected, not counted", []*proxy.ServicePort{port("a", true, true, false)}, 0, 0},
		{"several", []*proxy.ServicePort{port("a", true, false, true), port("b", true, false, true), port("c", false, true, true), port("d", false, true, true, ep(true))}, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ports := map[proxy.ServicePortName]*proxy.ServicePort{}
			for _, p := range tc.ports {
				ports[p.Name] = p
			}
			in, ex := CountNoLocalEndpoints(proxy.NewFamilyView(v1.IPv4Protocol, ports))
			if in != tc.wantInternal || ex != tc.wantExtl {
				t.Errorf("got internal %d external %d, want %d %d", in, ex, tc.wantInternal, tc.wantExtl)
			}
			m := New(Options{})
			m.NoLocalEndpoints(v1.IPv4Protocol, proxy.NewFamilyView(v1.IPv4Protocol, ports))
			if got := testutil.ToFloat64(m.noLocalEndpoints.WithLabelValues("IPv4", TrafficPolicyInternal)); got != float64(tc.wantInternal) {
				t.Errorf("gauge internal %v", got)
			}
			if got := testutil.ToFloat64(m.noLocalEndpoints.WithLabelValues("IPv4", TrafficPolicyExternal)); got != float64(tc.wantExtl) {
				t.Errorf("gauge external %v", got)
			}
		})
	}
	if in, ex := CountNoLocalEndpoints(nil); in != 0 || ex != 0 {
		t.Errorf("nil view: %d %d", in, ex)
	}
}

func TestPortsByAlgorithm(t *testing.T) {
	port := func(name string, a proxy.Algorithm, affinity int32) *proxy.ServicePort {
		return &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Protocol: v1.ProtocolTCP},
			Algorithm: a, AffinityTimeoutSeconds: affinity}
	}
	ports := map[proxy.ServicePortName]*proxy.ServicePort{}
	for _, p := range []*proxy.ServicePort{
		port("a", "", 0), port("b", proxy.AlgorithmRoundRobin, 0), port("c", proxy.AlgorithmRoundRobin, 0),
		port("d", proxy.AlgorithmSourceHash, 0), port("e", proxy.AlgorithmSourceHash, 60), // affinity wins: random
	} {
		ports[p.Name] = p
	}
	m := New(Options{})
	m.PortsByAlgorithm(v1.IPv4Protocol, proxy.NewFamilyView(v1.IPv4Protocol, ports))
	want := map[proxy.Algorithm]float64{proxy.AlgorithmRandom: 2, proxy.AlgorithmRoundRobin: 2, proxy.AlgorithmSourceHash: 1, proxy.AlgorithmLeastConnection: 0}
	for a, w := range want {
		if got := testutil.ToFloat64(m.byAlgorithm.WithLabelValues("IPv4", string(a))); got != w {
			t.Errorf("%s: %v, want %v", a, got, w)
		}
	}
	m.PortsByAlgorithm(v1.IPv4Protocol, nil)
	if got := testutil.ToFloat64(m.byAlgorithm.WithLabelValues("IPv4", string(proxy.AlgorithmRoundRobin))); got != 0 {
		t.Errorf("after an empty view: %v", got)
	}
}

// TestNFTablesCleanupFailures: CleanupFailed counts in
// kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total, per family.
func TestNFTablesCleanupFailures(t *testing.T) {
	m := New(Options{Mode: ModeNFTables})
	v4 := m.NFTables(v1.IPv4Protocol)
	v4.CleanupFailed()
	v4.CleanupFailed()
	var nilRecorder *NFTablesMetrics
	nilRecorder.CleanupFailed()
	if got := testutil.ToFloat64(m.nftCleanupFailures.WithLabelValues("IPv4")); got != 2 {
		t.Errorf("IPv4 cleanup failures = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.nftCleanupFailures.WithLabelValues("IPv6")); got != 0 {
		t.Errorf("IPv6 cleanup failures = %v, want 0", got)
	}
}
