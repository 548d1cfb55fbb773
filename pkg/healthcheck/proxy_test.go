package healthcheck

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// client never reuses connections, so a closed server is seen at once.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

type answer struct {
	code   int
	header http.Header
	body   map[string]any
}

func get(t *testing.T, url string) answer {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{code: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(data, &a.body); err != nil {
		t.Fatalf("GET %s: body %q is not JSON: %v", url, data, err)
	}
	return a
}

// TestProxyHealth walks the health state through start-up, queued and
// programmed changes, node deletion and recovery, checking /healthz and
// /livez over HTTP after each step against upstream kube-proxy v1.37's
// contract: codes, JSON fields, families judged only after their first sync,
// nodeEligible false while the node is unknown.
func TestProxyHealth(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	h := NewProxyHealth(time.Minute, clk)
	served := map[string]int{}
	srv := httptest.NewServer(h.Handler(func(path string, code int) { served[path+" "+http.StatusText(code)]++ }))
	defer srv.Close()

	type fam = v1.IPFamily
	v4, v6 := fam(v1.IPv4Protocol), fam(v1.IPv6Protocol)
	var last time.Time // the latest Updated call
	updated := func(f fam) { h.Updated(f); last = clk.Now() }
	steps := []struct {
		name          string
		do            func()
		healthz, livz int
		eligible      bool
		// families' health in the body; absent families must be absent.
		status map[fam]bool
	}{
		{"starting, node not seen yet: only healthz fails", func() {}, 503, 200, false, map[fam]bool{}},
		{"node seen", func() { h.SetNode(true, false) }, 200, 200, true, map[fam]bool{}},
		{"first sync queued", func() { h.QueuedUpdate(v4); h.QueuedUpdate(v6); clk.Step(59 * time.Second) }, 200, 200, true, map[fam]bool{}},
		// Upstream judges a family only after its first successful sync.
		{"first sync late: still starting up", func() { clk.Step(2 * time.Second) }, 200, 200, true, map[fam]bool{}},
		{"IPv4 programmed", func() { updated(v4) }, 200, 200, true, map[fam]bool{v4: true}},
		{"IPv4 queued late, IPv6 never synced", func() { h.QueuedUpdate(v4); clk.Step(time.Minute) }, 503, 503, true, map[fam]bool{v4: false}},
		{"IPv4 programmed again", func() { updated(v4) }, 200, 200, true, map[fam]bool{v4: true}},
		{"both programmed", func() { updated(v6) }, 200, 200, true, map[fam]bool{v4: true, v6: true}},
		{"queued again, oldest counts", func() {
			h.QueuedUpdate(v6)
			clk.Step(40 * time.Second)
			h.QueuedUpdate(v6)
			clk.Step(30 * time.Second)
		}, 503, 503, true, map[fam]bool{v4: true, v6: false}},
		{"programmed", func() { updated(v6) }, 200, 200, true, map[fam]bool{v4: true, v6: true}},
		{"queued, not late yet", func() { h.QueuedUpdate(v4); clk.Step(59 * time.Second) }, 200, 200, true, map[fam]bool{v4: true, v6: true}},
		{"programmed in time", func() { updated(v4) }, 200, 200, true, map[fam]bool{v4: true, v6: true}},
		{"node being deleted: only healthz fails", func() { h.SetNode(true, true) }, 503, 200, false, map[fam]bool{v4: true, v6: true}},
		{"node back", func() { h.SetNode(true, false) }, 200, 200, true, map[fam]bool{v4: true, v6: true}},
		{"node gone from the cache", func() { h.SetNode(false, false) }, 503, 200, false, map[fam]bool{v4: true, v6: true}},
	}
	for _, st := range steps {
		st.do()
		hz, lz := get(t, srv.URL+"/healthz"), get(t, srv.URL+"/livez")
		if hz.code != st.healthz || lz.code != st.livz {
			t.Errorf("%s: /healthz %d /livez %d, want %d %d", st.name, hz.code, lz.code, st.healthz, st.livz)
		}
		for _, a := range []answer{hz, lz} {
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s: Content-Type %q", st.name, ct)
			}
			if a.body["currentTime"] != clk.Now().Format(time.RFC3339Nano) {
				t.Errorf("%s: currentTime %v, want %v", st.name, a.body["currentTime"], clk.Now())
			}
			if a.body["healthy"] != (lz.code == 200) {
				t.Errorf("%s: healthy %v", st.name, a.body["healthy"])
			}
			status, _ := a.body["status"].(map[string]any)
			if len(status) != len(st.status) {
				t.Errorf("%s: status %v, want %v", st.name, status, st.status)
			}
			for f, want := range st.status {
				got, _ := status[string(f)].(map[string]any)
				if got["healthy"] != want {
					t.Errorf("%s: %s healthy %v, want %v", st.name, f, got["healthy"], want)
				}
			}
		}
		if hz.body["nodeEligible"] != st.eligible {
			t.Errorf("%s: nodeEligible %v, want %v", st.name, hz.body["nodeEligible"], st.eligible)
		}
		if _, ok := lz.body["nodeEligible"]; ok {
			t.Errorf("%s: /livez reports nodeEligible", st.name)
		}
		// A healthy answer reports the current time as lastUpdated (upstream
		// compatibility); an unhealthy one the last successful sync.
		if lz.code == 200 && lz.body["lastUpdated"] != lz.body["currentTime"] {
			t.Errorf("%s: healthy lastUpdated %v != currentTime %v", st.name, lz.body["lastUpdated"], lz.body["currentTime"])
		}
		if lz.code == 503 && lz.body["lastUpdated"] != last.Format(time.RFC3339Nano) {
			t.Errorf("%s: unhealthy lastUpdated %v, want the last sync %v", st.name, lz.body["lastUpdated"], last)
		}
	}
	want := map[string]int{"/healthz OK": 10, "/healthz Service Unavailable": 5, "/livez OK": 13, "/livez Service Unavailable": 2}
	for k, n := range want {
		if served[k] != n {
			t.Errorf("served %q %d times, want %d (all: %v)", k, served[k], n, served)
		}
	}
	if !h.Healthy() || h.NodeEligible() {
		t.Errorf("final state: healthy %v eligible %v, want true false", h.Healthy(), h.NodeEligible())
	}
}
