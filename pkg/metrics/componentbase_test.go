package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestComponentBaseMetrics checks the metrics kube-proxy gets from
// component-base: after one API request through client-go, /metrics serves
// rest_client_requests_total and rest_client_request_duration_seconds with
// upstream's labels, kubernetes_build_info with its nine labels, and the Go
// and process collectors once each (no duplicate with kproxy's registry).
func TestComponentBaseMetrics(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(context.Background()).Raw(); err != nil {
		t.Fatal(err)
	}

	m := New(Options{Mode: ModeIPTables, Version: "v0.1.0"})
	fams := families(t, m)
	for name, typ := range map[string]string{
		"rest_client_requests_total":           "COUNTER",
		"rest_client_request_duration_seconds": "HISTOGRAM",
		"kubernetes_build_info":                "GAUGE",
		"go_goroutines":                        "GAUGE",
		"process_cpu_seconds_total":            "COUNTER",
		"kproxy_build_info":                    "GAUGE",
	} {
		if got, ok := fams[name]; !ok || got.String() != typ {
			t.Errorf("%s: %v (present %v), want %s", name, got, ok, typ)
		}
	}
	text := scrape(t, m)
	host := strings.TrimPrefix(api.URL, "http://")
	for _, want := range []string{
		`rest_client_requests_total{code="200",host="` + host + `",method="GET"}`,
		`rest_client_request_duration_seconds_count{host="` + host + `",verb="GET"}`,
		`kubernetes_build_info{build_date=`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, label := range []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"} {
		if !strings.Contains(text[strings.Index(text, "kubernetes_build_info{"):], label+"=") {
			t.Errorf("kubernetes_build_info lacks label %s", label)
		}
	}
}
