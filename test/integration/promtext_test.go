package integration

import (
	"math"
	"strings"
	"testing"
)

const scrape = `# HELP kubeproxy_network_programming_duration_seconds In Cluster Network Programming Latency in seconds
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 1
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 2.5
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv6"} 0.5
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"} 1
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7649e+09
kproxy_build_info{go_version="go1.26.8",platform="linux/amd64",version="we \"quote\" \\ and\nnewline"} 1
process_start_time_seconds 1.764e+09 1764000000000
weird_nan NaN
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(scrape)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		want  []string
		value float64
		ok    bool
	}{
		{"kubeproxy_network_programming_duration_seconds_count", []string{"ip_family", "IPv4"}, 3, true},
		{"kubeproxy_network_programming_duration_seconds_count", nil, 4, true},
		{"kubeproxy_network_programming_duration_seconds_bucket", []string{"le", "+Inf"}, 3, true},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", []string{"ip_family", "IPv4"}, 1.7649e9, true},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", []string{"ip_family", "IPv6"}, 0, false},
		{"kproxy_build_info", []string{"version", "we \"quote\" \\ and\nnewline"}, 1, true},
		{"process_start_time_seconds", nil, 1.764e9, true},
		{"absent", nil, 0, false},
	} {
		v, ok := m.Get(tc.name, tc.want...)
		if ok != tc.ok || v != tc.value {
			t.Errorf("Get(%s, %v) = %v, %v; want %v, %v", tc.name, tc.want, v, ok, tc.value, tc.ok)
		}
	}
	if c, s := m.Histogram("kubeproxy_network_programming_duration_seconds", "ip_family", "IPv6"); c != 1 || s != 0.5 {
		t.Errorf("IPv6 histogram = %v, %v", c, s)
	}
	if v, _ := m.Get("weird_nan"); !math.IsNaN(v) {
		t.Errorf("NaN parsed as %v", v)
	}
}

func TestParseMetricsErrors(t *testing.T) {
	for _, line := range []string{
		`no_value`,
		`m{a="1"`,
		`m{a=1} 2`,
		`m{a="unterminated} 2`,
		`m{a="x"} two`,
		`m{a="x"}`,
	} {
		if _, err := ParseMetrics(line + "\n"); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("ParseMetrics(%q) = %v, want an error naming line 1", line, err)
		}
	}
}
