// Package metrics holds kproxy's Prometheus metrics: upstream kube-proxy's
// (same names, types, buckets and labels, so dashboards, alerts and
// clusterloader2 keep working) and kproxy's own (prefix kproxy_).
//
// Every Metrics has its own registry for kproxy's metrics. What upstream
// kube-proxy gets from component-base is taken from there, the way
// kube-proxy gets it: importing component-base's client-go adapters and its
// version metric registers rest_client_* (and client-go's workqueue, fifo
// and leader election metrics), kubernetes_build_info and the Go runtime and
// process collectors in component-base's global legacy registry, and the
// handler serves that registry together with kproxy's own. The sync loop (pkg/app) records sync durations, timestamps, change counts and
// network programming latency; platform backends record what only they see
// through IPTables (Linux) and HNSCall/HNSError (Windows). Every method is
// safe for concurrent use and never blocks on I/O.
package metrics

import (
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // rest_client_* and client-go's other metrics, as kube-proxy registers them
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info, as kube-proxy registers it
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Proxy modes, for Options.Mode (the values of --proxy-mode).
const (
	ModeIPTables    = "iptables"
	ModeNFTables    = "nftables"
	ModeKernelspace = "kernelspace"
)

// Label values of kubeproxy_sync_proxy_rules_no_local_endpoints_total.
const (
	TrafficPolicyInternal = "internal"
	TrafficPolicyExternal = "external"
)

// Options configure a Metrics.
type Options struct {
	// Mode selects the platform metrics registered besides the common ones:
	// ModeIPTables adds the iptables and conntrack metrics, ModeNFTables
	// the nftables and conntrack ones, ModeKernelspace the HNS ones (as
	// upstream registers its metrics per mode). Any other value registers
	// every set.
	Mode string
	// Version is kproxy's version, for kproxy_build_info.
	Version string
	// Pending, when set, is read at every scrape for the
	// *_changes_pending gauges: the Service and EndpointSlice events not yet
	// programmed.
	Pending func() (services, endpoints int)
	// FrontendConflicts, when set, is read at every scrape for
	// kproxy_frontend_conflicts: external frontends left out because they
	// are a Service's ClusterIP.
	FrontendConflicts func() int
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
}

// Metrics records kproxy's metrics in its own registry.
type Metrics struct {
	reg   *prometheus.Registry
	clock clock.PassiveClock

	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	lastSync            *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	programming         *prometheus.HistogramVec
	endpointChanges     prometheus.Counter
	serviceChanges      prometheus.Counter
	noLocalEndpoints    *prometheus.GaugeVec
	healthz, livez      *prometheus.CounterVec
	syncFailures        *prometheus.CounterVec
	quarantined         *prometheus.GaugeVec
	unsupported         *prometheus.GaugeVec
	byAlgorithm         *prometheus.GaugeVec

	restoreFailures        *prometheus.CounterVec
	partialRestoreFailures *prometheus.CounterVec
	iptablesRules          *prometheus.GaugeVec
	iptablesRulesLast      *prometheus.GaugeVec
	conntrackDeleted       *prometheus.CounterVec
	conntrackDuration      *prometheus.HistogramVec
	conntrackFailures      *prometheus.CounterVec

	nftSyncFailures    *prometheus.CounterVec
	nftCleanupFailures *prometheus.CounterVec
	nftObjects         *prometheus.GaugeVec

	hnsDuration *prometheus.HistogramVec
	hnsErrors   *prometheus.CounterVec
}

// syncBuckets are upstream's buckets for the sync durations: 1ms doubling
// up to about 16s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are upstream's buckets for network programming
// latency: 0, 0.25s and 0.5s, every second up to 59s, every 5s up to 115s,
// every 30s up to 5min.
func programmingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// hnsBuckets cover HNS calls from 0.5ms to about 16s.
var hnsBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

const (
	upstream = "kubeproxy"
	own      = "kproxy"
	family   = "ip_family"
	// alpha is the help prefix component-base gives upstream's metrics
	// (every kubeproxy_* metric of v1.37 is ALPHA); kproxy registers them
	// with client_golang directly, so it adds the prefix itself.
	alpha = "[ALPHA] "
)

// helpFor is help as component-base would show it in namespace ns.
func helpFor(ns, help string) string {
	if ns == upstream {
		return alpha + help
	}
	return help
}

// New returns a Metrics with every metric of its mode registered.
func New(o Options) *Metrics {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	m := &Metrics{reg: prometheus.NewRegistry(), clock: o.Clock}
	hist := func(ns, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: helpFor(ns, help), Buckets: buckets}, labels)
	}
	gauge := func(ns, name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: helpFor(ns, help)}, labels)
	}
	counter := func(ns, name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: helpFor(ns, help)}, labels)
	}

	m.syncDuration = hist(upstream, "sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets, family)
	m.syncFullDuration = hist(upstream, "sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets, family)
	m.syncPartialDuration = hist(upstream, "sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets, family)
	m.lastSync = gauge(upstream, "sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", family)
	m.lastQueued = gauge(upstream, "sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", family)
	m.programming = hist(upstream, "network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", programmingBuckets(), family)
	m.endpointChanges = prometheus.NewCounter(prometheus.CounterOpts{Namespace: upstream, Name: "sync_proxy_rules_endpoint_changes_total", Help: alpha + "Cumulative proxy rules Endpoint changes"})
	m.serviceChanges = prometheus.NewCounter(prometheus.CounterOpts{Namespace: upstream, Name: "sync_proxy_rules_service_changes_total", Help: alpha + "Cumulative proxy rules Service changes"})
	m.byAlgorithm = gauge(own, "service_ports_by_algorithm", "Number of service ports per load-balancing algorithm (kproxy.io/load-balancing after session affinity; a backend without the algorithm uses random and warns)", family, "algorithm")
	m.noLocalEndpoints = gauge(upstream, "sync_proxy_rules_no_local_endpoints_total", "Number of services with a Local traffic policy and no endpoints", family, "traffic_policy")
	m.healthz = counter(upstream, "proxy_healthz_total", "Cumulative proxy healthz HTTP status", "code")
	m.livez = counter(upstream, "proxy_livez_total", "Cumulative proxy livez HTTP status", "code")
	m.syncFailures = counter(own, "sync_failures_total", "Failed syncs by IP family and cause (timeout, unavailable, rejected, other)", family, "cause")
	m.quarantined = gauge(own, "sync_quarantined_service_ports", "Service ports left out of the node's rules because the platform rejected them (retried with backoff; everything else is programmed)", family)
	m.unsupported = gauge(own, "unsupported_service_ports", "Parts of Services left out of the node's programming as the last sync found them, by reason (invalid input, what the platform cannot express; each also logged and a Warning Event)", family, "reason")
	buildInfo := gauge(own, "build_info", "A metric with a constant '1' value labeled by the kproxy version, the Go version it was built with and the platform it runs on", "version", "go_version", "platform")
	buildInfo.WithLabelValues(o.Version, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH).Set(1)
	modeInfo := gauge(own, "proxy_mode_info", "A metric with a constant '1' value labeled by the proxy mode kproxy runs in", "mode")
	modeInfo.WithLabelValues(o.Mode).Set(1)

	m.restoreFailures = counter(upstream, "sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", family)
	m.partialRestoreFailures = counter(upstream, "sync_proxy_rules_iptables_partial_restore_failures_total", "Cumulative proxy iptables partial restore failures", family)
	m.iptablesRules = gauge(upstream, "sync_proxy_rules_iptables_total", "Total number of iptables rules owned by kube-proxy", family, "table")
	m.iptablesRulesLast = gauge(upstream, "sync_proxy_rules_iptables_last", "Number of iptables rules written by kube-proxy in last sync", family, "table")
	m.conntrackDeleted = counter(upstream, "conntrack_reconciler_deleted_entries_total", "Cumulative conntrack flows deleted by conntrack reconciler", family)
	m.conntrackDuration = hist(upstream, "conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", syncBuckets, family)
	m.conntrackFailures = counter(own, "conntrack_reconciler_failures_total", "Rounds of stale conntrack cleanup that failed (retried with the next sync; they never fail a sync)", family)

	m.nftSyncFailures = counter(upstream, "sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures", family)
	m.nftCleanupFailures = counter(upstream, "sync_proxy_rules_nftables_cleanup_failures_total", "Cumulative proxy nftables cleanup failures", family)
	m.nftObjects = gauge(own, "nftables_objects", "Objects kproxy owns in its nftables table after the last sync, by kind (chains, rules, elements)", family, "kind")

	m.hnsDuration = hist(own, "hns_call_duration_seconds", "Latency of HNS calls in seconds, successful or not, by operation", hnsBuckets, "operation")
	m.hnsErrors = counter(own, "hns_errors_total", "Failed HNS calls by operation and HNS error code", "operation", "code")

	m.reg.MustRegister(
		m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.lastSync, m.lastQueued,
		m.programming, m.endpointChanges, m.serviceChanges, m.noLocalEndpoints, m.byAlgorithm,
		m.healthz, m.livez, m.syncFailures, m.quarantined, m.unsupported, buildInfo, modeInfo,
	)
	if o.FrontendConflicts != nil {
		conflicts := o.FrontendConflicts
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: own, Name: "frontend_conflicts",
			Help: "External frontends (externalIPs, load balancer IPs) left out because they are a Service's ClusterIP"},
			func() float64 { return float64(conflicts()) }))
	}
	if o.Pending != nil {
		pending := o.Pending
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: upstream, Name: "sync_proxy_rules_service_changes_pending", Help: alpha + "Pending proxy rules Service changes"},
				func() float64 { s, _ := pending(); return float64(s) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: upstream, Name: "sync_proxy_rules_endpoint_changes_pending", Help: alpha + "Pending proxy rules Endpoint changes"},
				func() float64 { _, e := pending(); return float64(e) }),
		)
	}
	every := o.Mode != ModeIPTables && o.Mode != ModeNFTables && o.Mode != ModeKernelspace
	if o.Mode == ModeIPTables || every {
		m.reg.MustRegister(m.restoreFailures, m.partialRestoreFailures, m.iptablesRules, m.iptablesRulesLast)
	}
	if o.Mode == ModeNFTables || every {
		m.reg.MustRegister(m.nftSyncFailures, m.nftCleanupFailures, m.nftObjects)
	}
	if o.Mode != ModeKernelspace {
		m.reg.MustRegister(m.conntrackDeleted, m.conntrackDuration, m.conntrackFailures)
	}
	if o.Mode == ModeKernelspace || every {
		m.reg.MustRegister(m.hnsDuration, m.hnsErrors)
	}
	return m
}

// Gatherer returns what /metrics serves: kproxy's registry and
// component-base's legacy registry (Go runtime, process, rest_client_*,
// kubernetes_build_info), for tests and custom exposition.
func (m *Metrics) Gatherer() prometheus.Gatherer {
	return prometheus.Gatherers{m.reg, legacyregistry.DefaultGatherer}
}

// Handler serves the metrics in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Gatherer(), promhttp.HandlerOpts{Registry: m.reg})
}

// Families creates the per-family series of the counters and gauges with
// value zero, so dashboards and alerts see them before the first event.
func (m *Metrics) Families(fams ...v1.IPFamily) {
	for _, f := range fams {
		fs := string(f)
		m.restoreFailures.WithLabelValues(fs)
		m.partialRestoreFailures.WithLabelValues(fs)
		m.conntrackDeleted.WithLabelValues(fs)
		m.conntrackFailures.WithLabelValues(fs)
		m.quarantined.WithLabelValues(fs)
		m.noLocalEndpoints.WithLabelValues(fs, TrafficPolicyInternal)
		m.noLocalEndpoints.WithLabelValues(fs, TrafficPolicyExternal)
		for _, a := range proxy.Algorithms {
			m.byAlgorithm.WithLabelValues(fs, string(a))
		}
		for _, c := range causes {
			m.syncFailures.WithLabelValues(fs, string(c))
		}
	}
}

// Unsupported sets kproxy_unsupported_service_ports of family: the count
// per reason of what the last sync left out (reasons not listed drop out).
func (m *Metrics) Unsupported(f v1.IPFamily, byReason map[string]int) {
	m.unsupported.DeletePartialMatch(prometheus.Labels{family: string(f)})
	for r, n := range byReason {
		m.unsupported.WithLabelValues(string(f), r).Set(float64(n))
	}
}

// Quarantined records how many service ports of family the last sync left
// out because the platform rejected them.
func (m *Metrics) Quarantined(f v1.IPFamily, n int) {
	m.quarantined.WithLabelValues(string(f)).Set(float64(n))
}

// Queued records that a change for family was queued for programming.
func (m *Metrics) Queued(f v1.IPFamily) {
	m.lastQueued.WithLabelValues(string(f)).Set(seconds(m.clock.Now()))
}

// Synced records one successful sync of family: its duration (in the full
// or partial histogram as well as the overall one) and its time.
func (m *Metrics) Synced(f v1.IPFamily, full bool, took time.Duration) {
	fs := string(f)
	m.syncDuration.WithLabelValues(fs).Observe(took.Seconds())
	if full {
		m.syncFullDuration.WithLabelValues(fs).Observe(took.Seconds())
	} else {
		m.syncPartialDuration.WithLabelValues(fs).Observe(took.Seconds())
	}
	m.lastSync.WithLabelValues(fs).Set(seconds(m.clock.Now()))
}

// SyncFailed counts one failed sync of family.
func (m *Metrics) SyncFailed(f v1.IPFamily, c Cause) {
	m.syncFailures.WithLabelValues(string(f), string(c)).Inc()
}

// Programmed records the network programming latency of changes now
// programmed: the time since each EndpointSlice trigger time. A trigger in
// the future (clock skew between the node and the control plane) counts as 0.
func (m *Metrics) Programmed(f v1.IPFamily, triggers []time.Time) {
	if len(triggers) == 0 {
		return
	}
	h := m.programming.WithLabelValues(string(f))
	now := m.clock.Now()
	for _, t := range triggers {
		h.Observe(max(now.Sub(t), 0).Seconds())
	}
}

// ChangesProgrammed adds the Service and EndpointSlice events a successful
// sync programmed to the *_changes_total counters. Each event is counted
// once: the sync loop calls this only for the changes it acknowledges.
func (m *Metrics) ChangesProgrammed(services, endpoints int) {
	m.serviceChanges.Add(float64(services))
	m.endpointChanges.Add(float64(endpoints))
}

// NoLocalEndpoints sets, for family, the service ports whose Local traffic
// policy finds no endpoint on this node (see CountNoLocalEndpoints).
func (m *Metrics) NoLocalEndpoints(f v1.IPFamily, view *proxy.FamilyView) {
	internal, external := CountNoLocalEndpoints(view)
	m.NoLocalEndpointsCounted(f, internal, external)
}

// NoLocalEndpointsCounted sets the numbers NoLocalEndpoints counts, counted
// by the caller (kept up to date from the changed ports).
func (m *Metrics) NoLocalEndpointsCounted(f v1.IPFamily, internal, external int) {
	m.noLocalEndpoints.WithLabelValues(string(f), TrafficPolicyInternal).Set(float64(internal))
	m.noLocalEndpoints.WithLabelValues(string(f), TrafficPolicyExternal).Set(float64(external))
}

// PortsByAlgorithm sets, for family, how many service ports use each
// load-balancing algorithm (proxy.ServicePort.EffectiveAlgorithm).
func (m *Metrics) PortsByAlgorithm(f v1.IPFamily, view *proxy.FamilyView) {
	counts := make(map[proxy.Algorithm]int, len(proxy.Algorithms))
	for p := range view.All() {
		counts[p.EffectiveAlgorithm()]++
	}
	m.PortsByAlgorithmCounted(f, counts)
}

// PortsByAlgorithmCounted sets the numbers PortsByAlgorithm counts, counted
// by the caller.
func (m *Metrics) PortsByAlgorithmCounted(f v1.IPFamily, counts map[proxy.Algorithm]int) {
	for _, a := range proxy.Algorithms {
		m.byAlgorithm.WithLabelValues(string(f), string(a)).Set(float64(counts[a]))
	}
}

// Served counts one answer of the health server: path "/healthz" or
// "/livez", code the HTTP status.
func (m *Metrics) Served(path string, code int) {
	var c *prometheus.CounterVec
	switch path {
	case "/healthz":
		c = m.healthz
	case "/livez":
		c = m.livez
	default:
		return
	}
	c.WithLabelValues(itoa(code)).Inc()
}

func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
