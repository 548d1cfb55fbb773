package conformance

import (
	"strings"
	"testing"
)

// kubectl's PodColumns output, as captured from a kproxy cluster.
const podsOut = `APP      POD            NODE    IMAGE                                RESTARTS   STARTED
kproxy   kproxy-4xkzq   node2   ghcr.io/kproxy/kproxy:fb414c3        0          2026-12-07T02:40:11Z
kproxy   kproxy-b9rvd   node1   ghcr.io/kproxy/kproxy:fb414c3        0          2026-12-07T02:40:11Z
`

const metricsOut = `# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7650728e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 0
`

func TestParseEvidence(t *testing.T) {
	pods, err := ParsePods(podsOut)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 || pods[1] != (ProxyPod{App: "kproxy", Name: "kproxy-b9rvd", Node: "node1", Image: "ghcr.io/kproxy/kproxy:fb414c3", Started: "2026-12-07T02:40:11Z"}) {
		t.Errorf("pods %+v", pods)
	}
	if p, err := ParsePods("APP POD NODE IMAGE RESTARTS STARTED\nkproxy x node1 img <none> <none>\n"); err != nil || p[0].Restarts != -1 {
		t.Errorf("a pod without container status: %+v, %v", p, err)
	}
	if p, err := ParsePods(""); err != nil || len(p) != 0 {
		t.Errorf("no pods: %+v, %v", p, err)
	}
	for _, bad := range []string{"POD NODE\nx y\n", "APP POD NODE IMAGE RESTARTS STARTED\nkproxy x node1 img many t\n", "APP POD\nkproxy x\n"} {
		if _, err := ParsePods(bad); err == nil {
			t.Errorf("%q read without error", bad)
		}
	}
	if s := ParseSyncs(metricsOut); len(s) != 2 || s[0] != (Sync{`{ip_family="IPv4"}`, 1.7650728e+09}) || s[1] != (Sync{`{ip_family="IPv6"}`, 0}) {
		t.Errorf("syncs %v", s)
	}
}

func TestCheckEvidence(t *testing.T) {
	pods, _ := ParsePods(podsOut)
	nodes := []string{"node1", "node2"}
	before := Evidence{Pods: pods, Syncs: map[string][]Sync{"node1": {{`{ip_family="IPv4"}`, 100}, {`{ip_family="IPv6"}`, 0}}, "node2": {{Seconds: 100}}}}
	after := Evidence{Pods: pods, Syncs: map[string][]Sync{"node1": {{`{ip_family="IPv4"}`, 160}, {`{ip_family="IPv6"}`, 0}}, "node2": {{Seconds: 150}}}}
	if err := CheckEvidence("kproxy", nodes, before, after); err != nil {
		t.Fatalf("a good run: %v", err)
	}
	with := func(e Evidence, edit func(*Evidence)) Evidence {
		c := Evidence{Pods: append([]ProxyPod(nil), e.Pods...), Syncs: map[string][]Sync{}, Problems: e.Problems}
		for n, s := range e.Syncs {
			c.Syncs[n] = append([]Sync(nil), s...)
		}
		edit(&c)
		return c
	}
	for name, tc := range map[string]struct {
		proxy         string
		before, after Evidence
		want          string
	}{
		"the other proxy was asked for": {"kube-proxy", before, after, "kproxy pod kproxy-4xkzq runs on node2, want only kube-proxy"},
		"kube-proxy runs beside": {"kproxy", before, with(after, func(e *Evidence) {
			e.Pods = append(e.Pods, ProxyPod{App: "kube-proxy", Name: "kube-proxy-x", Node: "node1"})
		}), "kube-proxy pod kube-proxy-x runs on node1"},
		"a node without proxy":       {"kproxy", with(before, func(e *Evidence) { e.Pods = e.Pods[:1] }), after, "node1: 0 kproxy pods before the suite and 1 after"},
		"restarted during the suite": {"kproxy", before, with(after, func(e *Evidence) { e.Pods[0].Restarts = 1 }), "node2: kproxy pod kproxy-4xkzq (restarts 0) before the suite"},
		"replaced during the suite":  {"kproxy", before, with(after, func(e *Evidence) { e.Pods[1].Name = "kproxy-new" }), "node1: kproxy pod kproxy-b9rvd"},
		"no sync during the suite":   {"kproxy", before, with(after, func(e *Evidence) { e.Syncs["node2"] = []Sync{{Seconds: 100}} }), "node2: the proxy's last sync did not move"},
		"never synced":               {"kproxy", with(before, func(e *Evidence) { e.Syncs["node1"] = nil }), with(after, func(e *Evidence) { e.Syncs["node1"] = []Sync{{Seconds: 0}} }), "node1: the proxy's last sync did not move during the suite (never before, never after)"},
		"metrics unreadable":         {"kproxy", before, with(after, func(e *Evidence) { e.Problems = []string{"node1: metrics: exit status 7"} }), "after the suite: node1: metrics: exit status 7"},
	} {
		err := CheckEvidence(tc.proxy, nodes, tc.before, tc.after)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	if s := after.String(); !strings.Contains(s, "kproxy-b9rvd") || !strings.Contains(s, "node1: last sync{ip_family=\"IPv4\"} 160.000 (1970-01-01T00:02:40Z)") {
		t.Errorf("evidence text:\n%s", s)
	}
}
