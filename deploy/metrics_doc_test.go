package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
)

// metricModes are the proxy modes whose metrics the reference lists, in
// the order of its modes column.
var metricModes = []string{string(config.ModeIPTables), string(config.ModeNFTables), string(config.ModeKernelspace)}

// metricRow is one metric family kproxy serves.
type metricRow struct {
	name, typ string
	labels    []string
	modes     []string
}

// servedMetrics lists the metric families kproxy registers in each proxy
// mode, after recording one value of each so that labelled families show
// up, except the Go runtime's and the process's.
func servedMetrics(t *testing.T) []metricRow {
	t.Helper()
	rows := map[string]*metricRow{}
	for _, mode := range metricModes {
		m := metrics.New(metrics.Options{Mode: mode, Version: "doc", Pending: func() (int, int) { return 0, 0 }, FrontendConflicts: func() int { return 0 }})
		record(m)
		if mode == string(config.ModeIPTables) {
			// The iptables backend registers these (cmd/kproxy).
			m.IPTablesPacketCounters(func() (metrics.PacketCounters, error) { return metrics.PacketCounters{}, nil })
		}
		fams, err := m.Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			name := f.GetName()
			if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || componentBaseMeta[name] {
				continue
			}
			r := rows[name]
			if r == nil {
				r = &metricRow{name: name, typ: strings.ToLower(f.GetType().String())}
				for _, l := range f.GetMetric()[0].GetLabel() {
					r.labels = append(r.labels, l.GetName())
				}
				rows[name] = r
			}
			r.modes = append(r.modes, mode)
		}
	}
	out := make([]metricRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// componentBaseMeta are the metrics component-base's legacy registry always
// serves about itself (the prose of the reference mentions them).
var componentBaseMeta = map[string]bool{
	"registered_metrics_total": true, "disabled_metrics_total": true, "hidden_metrics_total": true,
	"cardinality_enforcement_unexpected_categorizations_total": true,
}

// record exercises every recording method of m once.
func record(m *metrics.Metrics) {
	f := v1.IPv4Protocol
	m.Families(f)
	m.Queued(f)
	m.Synced(f, true, time.Millisecond)
	m.Synced(f, false, time.Millisecond)
	m.SyncFailed(f, metrics.CauseOther)
	m.Programmed(f, []time.Time{time.Now()})
	m.ChangesProgrammed(1, 1)
	m.Served("/healthz", 200)
	m.Served("/livez", 200)
	m.Quarantined(f, 1)
	m.Unsupported(f, map[string]int{"InvalidField": 1})
	x := m.IPTables(f)
	x.RestoreFailed(true)
	x.Rules("nat", 1, 1)
	x.Conntrack(1, time.Millisecond, true)
	n := m.NFTables(f)
	n.SyncFailed()
	n.CleanupFailed()
	n.Objects(1, 1, 1)
	n.Conntrack(1, time.Millisecond, true)
	m.HNSCall("ListLoadBalancers", time.Millisecond)
	m.HNSError("ListLoadBalancers", "none")
}

func metricsTable(t *testing.T, notes map[string]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("| metric | type | labels | modes | meaning |\n|---|---|---|---|---|\n")
	for _, r := range servedMetrics(t) {
		labels := "—"
		if len(r.labels) > 0 {
			labels = "`" + strings.Join(r.labels, "`, `") + "`"
		}
		modes := "all"
		if len(r.modes) < len(metricModes) {
			modes = strings.Join(r.modes, ", ")
		}
		note := notes[r.name]
		if note == "" {
			note = todoNote
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", r.name, r.typ, labels, modes, note)
	}
	return b.String()
}

// declaredMetric finds the metric names pkg/metrics declares: the helpers'
// (ns, "name", ...) calls, the Namespace/Name options and full names given
// to prometheus.NewDesc.
var declaredMetric = regexp.MustCompile(`(?:\((upstream|own), "|Namespace: (upstream|own), Name: "|NewDesc\(")([a-z_]+)"`)

// TestEveryMetricIsDocumented reads pkg/metrics' sources for the metrics
// it declares and checks that servedMetrics (hence the reference) has each:
// a metric that record does not exercise, or that no mode registers, would
// otherwise be missing from the reference without a failure.
func TestEveryMetricIsDocumented(t *testing.T) {
	served := map[string]bool{}
	for _, r := range servedMetrics(t) {
		served[r.name] = true
	}
	files, err := filepath.Glob("../pkg/metrics/*.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range declaredMetric.FindAllStringSubmatch(string(data), -1) {
			prefix := map[string]string{"upstream": "kubeproxy_", "own": "kproxy_", "": ""}[m[1]+m[2]]
			n++
			if name := prefix + m[3]; !served[name] {
				t.Errorf("%s declares %s, which the reference does not list (record it in record)", f, name)
			}
		}
	}
	if n < 20 {
		t.Fatalf("found only %d metric declarations in pkg/metrics: the pattern no longer matches its code", n)
	}
}

// TestMetricNames checks the names dashboards and alerts rely on: upstream
// kube-proxy's, which the reference promises, are all served.
func TestMetricNames(t *testing.T) {
	served := map[string]bool{}
	for _, r := range servedMetrics(t) {
		served[r.name] = true
	}
	for _, name := range []string{
		"kubeproxy_sync_proxy_rules_duration_seconds",
		"kubeproxy_sync_full_proxy_rules_duration_seconds",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
		"kubeproxy_network_programming_duration_seconds",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending",
		"kubeproxy_sync_proxy_rules_service_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_pending",
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
		"kubeproxy_sync_proxy_rules_iptables_total",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
	} {
		if !served[name] {
			t.Errorf("%s is not served", name)
		}
	}
}
