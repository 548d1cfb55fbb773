package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/pkg/metrics"
)

// targetLabels are the labels Prometheus adds to every series it scrapes
// (job, instance) and the node label the chart's ServiceMonitor and
// PodMonitor relabel in; a query may use them on any kproxy metric.
var targetLabels = map[string]bool{"job": true, "instance": true, "node": true}

// foreign are the series rules may use that kproxy does not export: the
// scrape's own up, and kube-state-metrics' DaemonSet gauges (by name, with
// the labels kube-state-metrics gives them).
var foreign = map[string][]string{
	"up": nil,
	"kube_daemonset_status_desired_number_scheduled": {"namespace", "daemonset"},
	"kube_daemonset_status_number_available":         {"namespace", "daemonset"},
}

// exported maps every series name kproxy's /metrics serves (a histogram's
// _bucket, _sum and _count included) to its label names. It runs kproxy's
// metrics registry (pkg/metrics, as kproxy's /metrics server serves it) in
// each mode, records a value with every recording method, makes one API
// request through client-go so that rest_client_* series exist, and
// scrapes the handler over HTTP.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	// One client-go request (to a server that answers 500), for the
	// rest_client_* families of the legacy registry kproxy serves.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	defer api.Close()
	cs := kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = cs.CoreV1().Nodes().Get(ctx, "x", metav1.GetOptions{})

	out := map[string]map[string]bool{}
	for _, mode := range []string{metrics.ModeIPTables, metrics.ModeNFTables, metrics.ModeKernelspace} {
		m := metrics.New(metrics.Options{Mode: mode, Version: "test", Pending: func() (int, int) { return 0, 0 }, FrontendConflicts: func() int { return 0 }})
		exercise(m)
		srv := httptest.NewServer(m.Handler())
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		_ = resp.Body.Close()
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range fams {
			for _, s := range f.GetMetric() {
				names := []string{name}
				switch f.GetType().String() {
				case "HISTOGRAM":
					names = []string{name + "_bucket", name + "_sum", name + "_count"}
				case "SUMMARY":
					names = append(names, name+"_sum", name+"_count")
				}
				for i, n := range names {
					if out[n] == nil {
						out[n] = map[string]bool{}
					}
					for _, l := range s.GetLabel() {
						out[n][l.GetName()] = true
					}
					if i == 0 && f.GetType().String() == "HISTOGRAM" {
						out[n]["le"] = true
					}
					if f.GetType().String() == "SUMMARY" && n == name {
						out[n]["quantile"] = true
					}
				}
			}
		}
	}
	for _, must := range []string{"kproxy_build_info", "kproxy_proxy_mode_info", "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
		"kproxy_hns_errors_total", "kproxy_nftables_objects", "rest_client_requests_total", "process_start_time_seconds"} {
		if out[must] == nil {
			t.Fatalf("kproxy's /metrics lacks %s: the exercise is broken", must)
		}
	}
	return out
}

// exercise records one value with every recording method of m, so that
// every labelled family has a series.
func exercise(m *metrics.Metrics) {
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

// grafanaVars replaces Grafana's interval variables, which are no PromQL,
// by a duration (the $job and $instance variables sit in label values,
// which parse as they are).
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// checkQuery parses a PromQL expression and returns an error for every
// metric name or label it uses that kproxy does not export.
func checkQuery(expr string, have map[string]map[string]bool) []error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return []error{fmt.Errorf("does not parse: %w", err)}
	}
	var errs []error
	// The label names a query can use: those of the series it selects, and
	// those joins add (group_left's labels come from the other side).
	var allowed = map[string]bool{}
	for l := range targetLabels {
		allowed[l] = true
	}
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		labels, known := have[vs.Name]
		if !known {
			if fl, ok := foreign[vs.Name]; ok {
				labels = map[string]bool{}
				for _, l := range fl {
					labels[l] = true
				}
			} else {
				errs = append(errs, fmt.Errorf("metric %s: kproxy does not export it", vs.Name))
				return nil
			}
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				continue
			}
			if !labels[m.Name] && !targetLabels[m.Name] {
				errs = append(errs, fmt.Errorf("metric %s has no label %q", vs.Name, m.Name))
			}
		}
		for l := range labels {
			allowed[l] = true
		}
		return nil
	})
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		var used []string
		switch n := node.(type) {
		case *parser.AggregateExpr:
			used = n.Grouping
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				used = append(append(used, n.VectorMatching.MatchingLabels...), n.VectorMatching.Include...)
			}
		}
		for _, l := range used {
			if !allowed[l] {
				errs = append(errs, fmt.Errorf("label %q: no series of the query has it", l))
			}
		}
		return nil
	})
	return errs
}

// TestCheckQueryCatches: a renamed metric, a label it lacks, a grouping
// by an unknown label and bad syntax are each caught.
func TestCheckQueryCatches(t *testing.T) {
	have := map[string]map[string]bool{"a_total": {"ip_family": true}, "b": {"mode": true}}
	for expr, want := range map[string]string{
		`rate(a_totl[5m])`:                                      "a_totl",
		`a_total{cause="x"}`:                                    `no label "cause"`,
		`sum by (cause) (a_total)`:                              `label "cause"`,
		`sum by (instance (a_total)`:                            "does not parse",
		`a_total * on (instance) group_left (node2) b{job="x"}`: `label "node2"`,
	} {
		errs := checkQuery(expr, have)
		if len(errs) == 0 || !strings.Contains(fmt.Sprint(errs), want) {
			t.Errorf("%s: %v, want an error naming %s", expr, errs, want)
		}
	}
	if errs := checkQuery(`sum by (ip_family, mode) (rate(a_total{job=~"$job"}[$__rate_interval]) * on (job, instance) group_left (mode) b)`, have); len(errs) > 0 {
		t.Errorf("a good query: %v", errs)
	}
}

// dashboard is the part of Grafana's dashboard JSON the test reads.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
}

// TestDashboard: the dashboard JSON loads (a schema version Grafana 10 and
// later reads, unique panel IDs, a grid position each), every panel but
// the rows has at least one query, and every query (the template
// variables' too) parses and uses only metrics and labels kproxy's
// /metrics serves.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repo(t), "deploy", "monitoring", "kproxy-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if d.SchemaVersion < 36 || d.UID == "" || d.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q: want a schema version of Grafana 9+ (36), a uid and a title", d.SchemaVersion, d.UID, d.Title)
	}
	have := exported(t)
	ids := map[int]bool{}
	var queries int
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("panel %q has no grid position", p.Title)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				if strings.TrimSpace(q.Expr) == "" {
					t.Errorf("panel %q query %s is empty", p.Title, q.RefID)
				}
				queries++
				for _, err := range checkQuery(q.Expr, have) {
					t.Errorf("panel %q query %s: %v\n  %s", p.Title, q.RefID, err, q.Expr)
				}
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		// label_values(METRIC{...}, LABEL): the metric part is PromQL.
		inner := strings.TrimSuffix(strings.TrimPrefix(s, "label_values("), ")")
		i := strings.LastIndex(inner, ",")
		if i < 0 {
			t.Errorf("variable %s: query %q is not label_values(METRIC, LABEL)", v.Name, s)
			continue
		}
		for _, err := range checkQuery(inner[:i], have) {
			t.Errorf("variable %s: %v", v.Name, err)
		}
	}
	t.Logf("%d panels, %d queries checked against %d series names", len(ids), queries, len(have))
	if queries < 20 {
		t.Errorf("only %d queries", queries)
	}
}

// rulesFile is a Prometheus rules file.
type rulesFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) rulesFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo(t), "deploy", "monitoring", "kproxy-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var r rulesFile
	if err := sigsyaml.UnmarshalStrict(data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRulesMetrics: every alert's expression parses and uses only what
// kproxy exports (and up and kube-state-metrics' DaemonSet gauges).
func TestRulesMetrics(t *testing.T) {
	have := exported(t)
	var alerts []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, err := range checkQuery(r.Expr, have) {
				t.Errorf("%s: %v", r.Alert, err)
			}
		}
	}
	sort.Strings(alerts)
	want := []string{"KproxyChangeLatencyHigh", "KproxyDown", "KproxyHNSErrors", "KproxyMissingOnNodes", "KproxyNotSyncing", "KproxyQuarantinedServicePorts", "KproxySyncsFailing"}
	if !reflect.DeepEqual(alerts, want) {
		t.Errorf("alerts %v, want %v", alerts, want)
	}
}

// TestPromtoolRules: promtool check rules on the rules file, then promtool
// test rules on kproxy-rules.test.yaml, which makes every alert fire and
// resolve on synthetic series.
func TestPromtoolRules(t *testing.T) {
	promtool, err := Ensure(context.Background(), "promtool", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(repo(t), "deploy", "monitoring")
	for _, args := range [][]string{
		{"check", "rules", "kproxy-rules.yaml"},
		{"test", "rules", "kproxy-rules.test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestRulesTestCoversEveryAlert: the promtool test expects every alert
// firing at some time and no alert at a later one.
func TestRulesTestCoversEveryAlert(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repo(t), "deploy", "monitoring", "kproxy-rules.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tests []struct {
			AlertRuleTests []struct {
				EvalTime  string `json:"eval_time"`
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := sigsyaml.Unmarshal(data, &tf); err != nil {
		t.Fatal(err)
	}
	fires, resolves := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		firedAt := map[string]time.Duration{}
		for _, a := range tc.AlertRuleTests {
			d, err := model.ParseDuration(a.EvalTime)
			if err != nil {
				t.Fatal(err)
			}
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
				firedAt[a.Alertname] = time.Duration(d)
			}
		}
		for _, a := range tc.AlertRuleTests {
			d, _ := model.ParseDuration(a.EvalTime)
			if at, ok := firedAt[a.Alertname]; ok && len(a.ExpAlerts) == 0 && time.Duration(d) > at {
				resolves[a.Alertname] = true
			}
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] || !resolves[r.Alert] {
				t.Errorf("%s: the promtool test makes it fire %v, then resolve %v; want both", r.Alert, fires[r.Alert], resolves[r.Alert])
			}
		}
	}
}
