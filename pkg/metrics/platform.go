package metrics

import (
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
)

// IPTables returns the recorder one Linux (iptables) backend of family uses.
// Its methods are what the backend alone sees during a sync.
func (m *Metrics) IPTables(f v1.IPFamily) *IPTablesMetrics {
	if m == nil {
		return nil
	}
	return &IPTablesMetrics{m: m, family: string(f)}
}

// IPTablesMetrics records the iptables and conntrack metrics of one IP
// family. The zero value is not usable; get one from Metrics.IPTables. A nil
// *IPTablesMetrics records nothing.
type IPTablesMetrics struct {
	m      *Metrics
	family string
}

// RestoreFailed counts one failed iptables-restore run. Every failure counts
// in kubeproxy_sync_proxy_rules_iptables_restore_failures_total; one of a
// partial sync (which the backend follows with a full one) also counts in
// kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total, as
// upstream does.
func (x *IPTablesMetrics) RestoreFailed(partial bool) {
	if x == nil {
		return
	}
	x.m.restoreFailures.WithLabelValues(x.family).Inc()
	if partial {
		x.m.partialRestoreFailures.WithLabelValues(x.family).Inc()
	}
}

// Rules records, after a successful sync, how many rules kproxy owns in
// table ("nat", "filter") and how many that sync wrote there.
func (x *IPTablesMetrics) Rules(table string, total, written int) {
	if x == nil {
		return
	}
	x.m.iptablesRules.WithLabelValues(x.family, table).Set(float64(total))
	x.m.iptablesRulesLast.WithLabelValues(x.family, table).Set(float64(written))
}

// Conntrack records one round of stale conntrack cleanup after a sync:
// kubeproxy_conntrack_reconciler_deleted_entries_total and
// kubeproxy_conntrack_reconciler_sync_duration_seconds as upstream, and
// kproxy_conntrack_reconciler_failures_total when the round failed.
func (x *IPTablesMetrics) Conntrack(deleted int, d time.Duration, failed bool) {
	if x == nil {
		return
	}
	if deleted > 0 {
		x.m.conntrackDeleted.WithLabelValues(x.family).Add(float64(deleted))
	}
	x.m.conntrackDuration.WithLabelValues(x.family).Observe(d.Seconds())
	if failed {
		x.m.conntrackFailures.WithLabelValues(x.family).Inc()
	}
}

// NFTables returns the recorder one Linux nftables backend of family uses.
func (m *Metrics) NFTables(f v1.IPFamily) *NFTablesMetrics {
	if m == nil {
		return nil
	}
	return &NFTablesMetrics{IPTablesMetrics: IPTablesMetrics{m: m, family: string(f)}}
}

// NFTablesMetrics records the nftables and conntrack metrics of one IP
// family (Conntrack is the iptables mode's). A nil *NFTablesMetrics records
// nothing.
type NFTablesMetrics struct {
	IPTablesMetrics
}

// SyncFailed counts one nftables transaction that failed
// (kubeproxy_sync_proxy_rules_nftables_sync_failures_total).
func (x *NFTablesMetrics) SyncFailed() {
	if x == nil {
		return
	}
	x.m.nftSyncFailures.WithLabelValues(x.family).Inc()
}

// CleanupFailed counts one failed removal, in the nftables mode, of what
// another proxy left (kube-proxy's table and chains, kproxy's iptables
// chains), which kproxy does after its first full sync
// (kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total; upstream
// counts its deletions of stale chains, which kproxy makes inside the
// sync's own transaction).
func (x *NFTablesMetrics) CleanupFailed() {
	if x == nil {
		return
	}
	x.m.nftCleanupFailures.WithLabelValues(x.family).Inc()
}

// Objects records what kproxy's table holds after a sync.
func (x *NFTablesMetrics) Objects(chains, rules, elements int) {
	if x == nil {
		return
	}
	x.m.nftObjects.WithLabelValues(x.family, "chains").Set(float64(chains))
	x.m.nftObjects.WithLabelValues(x.family, "rules").Set(float64(rules))
	x.m.nftObjects.WithLabelValues(x.family, "elements").Set(float64(elements))
}

// Conntrack records one round of stale conntrack cleanup (see
// IPTablesMetrics.Conntrack).
func (x *NFTablesMetrics) Conntrack(deleted int, d time.Duration, failed bool) {
	if x == nil {
		return
	}
	x.IPTablesMetrics.Conntrack(deleted, d, failed)
}

// HNSCall observes the latency of one HNS call by operation, successful or
// not. With HNSError, *Metrics implements platform/windows.Metrics.
func (m *Metrics) HNSCall(op string, d time.Duration) {
	m.hnsDuration.WithLabelValues(op).Observe(d.Seconds())
}

// HNSError counts one failed HNS call by operation and HNS error code
// ("0x803b0013"; "none" when HNS gave no code).
func (m *Metrics) HNSError(op, code string) {
	m.hnsErrors.WithLabelValues(op, code).Inc()
}

func itoa(i int) string { return strconv.Itoa(i) }
