package deploy

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
)

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
	for _, mode := range []string{string(config.ModeIPTables), string(config.ModeKernelspace)} {
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
// serves about itself (the prose of the guide mentions them).
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
	x := m.IPTables(f)
	x.RestoreFailed(true)
	x.Rules("nat", 1, 1)
	x.Conntrack(1, time.Millisecond, true)
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
		modes := "both"
		if len(r.modes) == 1 {
			modes = r.modes[0]
		}
		note := notes[r.name]
		if note == "" {
			note = todoNote
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", r.name, r.typ, labels, modes, note)
	}
	return b.String()
}

// TestMetricNames checks the names dashboards and alerts rely on: upstream
// kube-proxy's, which the guide promises, are all served.
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
