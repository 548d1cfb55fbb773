package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/pkg/metrics"
)

// scrape is what kproxy's /metrics serves in mode after syncs: the real
// registry of pkg/metrics, recorded through its methods and served by its
// handler.
func scrape(t *testing.T, mode string, lastSync time.Time, quarantined map[v1.IPFamily]int) []byte {
	t.Helper()
	m := metrics.New(metrics.Options{Mode: mode, Version: "v0.4.2", Pending: func() (int, int) { return 0, 0 }})
	for f, n := range quarantined {
		m.Families(f)
		m.Queued(f)
		m.Synced(f, true, time.Millisecond)
		m.Quarantined(f, n)
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	// Synced stamps the wall clock; put the sync at lastSync.
	var out bytes.Buffer
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{") {
			i := strings.LastIndex(line, " ")
			line = line[:i+1] + strings.TrimSuffix(strings.TrimSuffix(json.Number(formatSeconds(lastSync)).String(), "\n"), " ")
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes()
}

func formatSeconds(t time.Time) string {
	b, _ := json.Marshal(float64(t.UnixNano()) / 1e9)
	return string(b)
}

// TestParseMetrics reads a scrape of kproxy's real registry: mode, version,
// the latest sync of the families, quarantined ports summed.
func TestParseMetrics(t *testing.T) {
	last := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	m, err := ParseMetrics(scrape(t, "nftables", last, map[v1.IPFamily]int{v1.IPv4Protocol: 2, v1.IPv6Protocol: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if m.Mode != "nftables" || m.Version != "v0.4.2" || m.Quarantined == nil || *m.Quarantined != 3 || m.LastSync == nil || !m.LastSync.Equal(last) {
		t.Errorf("got mode %q version %q quarantined %v last sync %v; want nftables v0.4.2 3 %v", m.Mode, m.Version, m.Quarantined, m.LastSync, last)
	}
	if _, err := ParseMetrics([]byte("not { metrics\n")); err == nil {
		t.Error("garbage parsed")
	}
}

func TestParseHealth(t *testing.T) {
	no := false
	body := func(eligible *bool) []byte {
		b, _ := json.Marshal(healthBody{LastUpdated: time.Unix(100, 0), CurrentTime: time.Unix(130, 0), NodeEligible: eligible})
		return b
	}
	for _, tc := range []struct {
		code int
		body []byte
		err  error
		want string
	}{
		{200, body(nil), nil, "healthy"},
		{503, body(nil), nil, "unhealthy"},
		{503, body(&no), nil, "not eligible"},
		{0, nil, io.EOF, "unreachable"},
		{404, []byte("nope"), nil, "HTTP 404"},
	} {
		got, last := parseHealth(tc.code, tc.body, tc.err)
		if got != tc.want {
			t.Errorf("%d %s %v: %q, want %q", tc.code, tc.body, tc.err, got, tc.want)
		}
		if tc.body != nil && tc.code != 404 && (last == nil || last.Unix() != 100) {
			t.Errorf("%d: last sync %v, want 100 s", tc.code, last)
		}
	}
}

// fakeAPI is an HTTP server that answers the requests Status makes as the
// API server does: the Node and Pod lists, a ConfigMap, and the pod proxy
// (pods/NAME:PORT/proxy/PATH) from recorded answers.
type fakeAPI struct {
	mu       sync.Mutex
	nodes    []v1.Node
	pods     []v1.Pod
	cms      map[string]*v1.ConfigMap
	proxy    map[string]func(w http.ResponseWriter) // "POD:PORT/PATH"
	requests []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
	f.mu.Unlock()
	write := func(o any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(o)
	}
	p := r.URL.Path
	switch {
	case p == "/api/v1/nodes":
		write(v1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}, Items: f.nodes})
	case p == "/api/v1/namespaces/kube-system/pods":
		if r.URL.Query().Get("labelSelector") != "k8s-app in (kproxy,kproxy-windows)" {
			http.Error(w, "bad selector "+r.URL.Query().Get("labelSelector"), http.StatusBadRequest)
			return
		}
		write(v1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: f.pods})
	case strings.HasPrefix(p, "/api/v1/namespaces/kube-system/configmaps/"):
		cm := f.cms[strings.TrimPrefix(p, "/api/v1/namespaces/kube-system/configmaps/")]
		if cm == nil {
			w.WriteHeader(http.StatusNotFound)
			write(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonNotFound, Code: 404})
			return
		}
		write(cm)
	case strings.HasPrefix(p, "/api/v1/namespaces/kube-system/pods/"):
		rest := strings.TrimPrefix(p, "/api/v1/namespaces/kube-system/pods/")
		key := strings.Replace(rest, "/proxy/", "/", 1)
		if h := f.proxy[key]; h != nil {
			h(w)
			return
		}
		// What the API server answers when it cannot reach the pod.
		w.WriteHeader(http.StatusServiceUnavailable)
		write(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Message: "error trying to reach service: dial tcp: connect: connection refused", Reason: metav1.StatusReasonServiceUnavailable, Code: 503})
	default:
		http.NotFound(w, r)
	}
}

func node(name, os string) v1.Node {
	return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelOSStable: os}}}
}

func kproxyPod(name, nodeName, app, cm string) v1.Pod {
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{appLabel: app}, CreationTimestamp: metav1.Now()},
		Spec: v1.PodSpec{NodeName: nodeName,
			Containers: []v1.Container{{Name: "kproxy", Image: "ghcr.io/kproxy/kproxy:v0.4.1",
				Ports: []v1.ContainerPort{{Name: "healthz", ContainerPort: 10256}, {Name: "metrics", ContainerPort: 10249}}}},
			Volumes: []v1.Volume{{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
				LocalObjectReference: v1.LocalObjectReference{Name: cm}, Items: []v1.KeyToPath{{Key: "linux.yaml", Path: "config.conf"}}}}}},
		},
	}
}

// TestStatus: through an API server that answers like the real one, one
// node with a reachable kproxy (metrics and health), one whose metrics
// port is loopback-only (mode from the ConfigMap, version from the image,
// last sync from /healthz), one whose kproxy is unhealthy, and one without a
// kproxy pod; each gets its row, and the exit code says not all are healthy.
func TestStatus(t *testing.T) {
	last := time.Now().Add(-12 * time.Second).Truncate(time.Millisecond).UTC()
	healthOK, _ := json.Marshal(healthBody{LastUpdated: last, CurrentTime: time.Now()})
	health503, _ := json.Marshal(healthBody{LastUpdated: last.Add(-time.Hour), CurrentTime: time.Now()})
	metricsText := scrape(t, "nftables", last, map[v1.IPFamily]int{v1.IPv4Protocol: 1})
	api := &fakeAPI{
		nodes: []v1.Node{node("n1", "linux"), node("n2", "linux"), node("n3", "linux"), node("w1", "windows")},
		pods: []v1.Pod{kproxyPod("kproxy-a", "n1", linuxApp, "kproxy-abc"), kproxyPod("kproxy-b", "n2", linuxApp, "kproxy-abc"),
			kproxyPod("kproxy-c", "n3", linuxApp, "kproxy-abc")},
		cms: map[string]*v1.ConfigMap{"kproxy-abc": {TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "kproxy-abc", Namespace: "kube-system"},
			Data:       map[string]string{"linux.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n"}}},
		proxy: map[string]func(w http.ResponseWriter){
			"kproxy-a:10256/healthz": func(w http.ResponseWriter) { _, _ = w.Write(healthOK) },
			"kproxy-a:10249/metrics": func(w http.ResponseWriter) { _, _ = w.Write(metricsText) },
			"kproxy-b:10256/healthz": func(w http.ResponseWriter) { _, _ = w.Write(healthOK) },
			"kproxy-c:10256/healthz": func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write(health503)
			},
		},
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"status", "-o", "json"}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("without a cluster: exit %d, want 1", code)
	}
	stdout.Reset()
	conn := &connection{config: &rest.Config{Host: srv.URL}, namespace: "kube-system"}
	code = runStatus(context.Background(), []string{"-o", "json"}, conn, &stdout, &stderr)
	if code != 2 {
		t.Errorf("exit %d, want 2 (not every node healthy); stderr %s", code, stderr.String())
	}
	var rows []NodeStatus
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	byNode := map[string]NodeStatus{}
	for _, r := range rows {
		byNode[r.Node] = r
	}
	q := func(r NodeStatus) int {
		if r.Quarantined == nil {
			return -1
		}
		return *r.Quarantined
	}
	for _, c := range []struct {
		node, pod, mode, from, version, health string
		quarantined                            int
		lastSync                               bool
	}{
		{"n1", "kproxy-a", "nftables", "metrics", "v0.4.2", "healthy", 1, true},
		{"n2", "kproxy-b", "iptables", "configmap", "v0.4.1 (image)", "healthy", -1, true},
		{"n3", "kproxy-c", "iptables", "configmap", "v0.4.1 (image)", "unhealthy", -1, true},
		{"w1", "", "", "", "", "no pod", -1, false},
	} {
		r := byNode[c.node]
		if r.Pod != c.pod || r.Mode != c.mode || r.ModeFrom != c.from || r.Version != c.version || r.Health != c.health || q(r) != c.quarantined || (r.LastSync != nil) != c.lastSync {
			t.Errorf("%s: %+v\nwant pod %s mode %s (%s) version %s health %s quarantined %d last sync %v", c.node, r, c.pod, c.mode, c.from, c.version, c.health, c.quarantined, c.lastSync)
		}
	}
	if r := byNode["n1"]; r.LastSync == nil || !r.LastSync.Equal(last) {
		t.Errorf("n1 last sync %v, want %v", r.LastSync, last)
	}
	if !strings.Contains(strings.Join(byNode["n2"].Notes, " "), "metricsBindAddress") {
		t.Errorf("n2 notes %v: want the hint about metricsBindAddress", byNode["n2"].Notes)
	}

	stdout.Reset()
	runStatus(context.Background(), nil, conn, &stdout, &stderr)
	table := stdout.String()
	for _, want := range []string{"NODE", "LAST SYNC", "n1", "nftables", "v0.4.2", "s ago", "healthy", "w1", "no pod"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("\n%s", table)
}

// TestStatusPrefersNewerPod: during a rollout a node has two pods; the
// newer one is shown, and a terminating one never.
func TestStatusPrefersNewerPod(t *testing.T) {
	older := kproxyPod("kproxy-old", "n1", linuxApp, "cm")
	older.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
	newer := kproxyPod("kproxy-new", "n1", linuxApp, "cm")
	gone := kproxyPod("kproxy-gone", "n1", linuxApp, "cm")
	gone.CreationTimestamp = metav1.NewTime(time.Now().Add(time.Hour))
	now := metav1.Now()
	gone.DeletionTimestamp = &now
	api := &fakeAPI{nodes: []v1.Node{node("n1", "linux")}, pods: []v1.Pod{older, newer, gone}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	conn := &connection{config: &rest.Config{Host: srv.URL}, namespace: "kube-system"}
	cs, err := conn.client()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Status(context.Background(), cs, "kube-system", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Pod != "kproxy-new" || rows[0].Health != "unreachable" {
		t.Errorf("rows %+v, want kproxy-new unreachable", rows)
	}
}
