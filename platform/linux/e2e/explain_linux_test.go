package e2e

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/proxytest"
	"github.com/kproxy/kproxy/platform/linux/netns/echo"
)

// explainLive runs `kproxy explain --live -o json` inside node1 with the
// run's own flags.
func (e *env) explainLive(to netip.AddrPort, from netip.Addr) *explain.Result {
	e.t.Helper()
	args := append([]string{kproxyBin, "explain", "--live", "-o", "json", "--to", to.String(), "--from", from.String()}, e.p.Argv()...)
	out, err := e.c.Exec(e.ctx(time.Minute), proxytest.Node1, args...)
	if err != nil {
		e.t.Fatalf("kproxy explain: %v\n%s", err, LastLines(string(out), 30))
	}
	// The JSON document is the last thing printed (logs go to stderr,
	// which Exec merges): take it from the first line that opens it.
	s := string(out)
	i := strings.Index(s, "\n{")
	if strings.HasPrefix(s, "{") {
		i = -1
	}
	var res explain.Result
	if err := json.Unmarshal([]byte(s[i+1:]), &res); err != nil {
		e.t.Fatalf("kproxy explain output: %v\n%s", err, LastLines(s, 40))
	}
	return &res
}

// TestExplainLiveAgreesWithTraffic: `kproxy explain --live` inside node1
// names the endpoints traffic really reaches; after someone flushes nat
// PREROUTING it names the missing jump (and says a pod's connection is not
// handled); after `kproxy --cleanup` it says nothing handles the address.
func TestExplainLiveAgreesWithTraffic(t *testing.T) {
	iptablesOnly(t, "kproxy explain --live reads iptables-save")
	top := proxytest.Default()
	svc := top.Service("explained", 120)
	backends := []string{proxytest.PodA1, proxytest.PodB1}
	sl, err := top.Slices(svc, proxytest.Ready(backends...)...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{svc, sl[0], sl[1]},
		extra: []string{"--iptables-sync-period", "1h"}}) // no repair during the test
	ctx := e.ctx(3 * time.Minute)
	client, _ := top.Host(proxytest.Client1)
	for _, fam := range families() {
		to := clusterIP(svc, fam)
		res := e.explainLive(to, client.Addr(fam))
		if res.Verdict != explain.DNAT || len(res.Drift) != 0 {
			t.Fatalf("%s: verdict %s drift %q, want DNAT and no drift", fam, res.Verdict, res.Drift)
		}
		var planned []string
		for _, tg := range res.Targets {
			planned = append(planned, tg.Endpoint)
		}
		// What traffic reaches, as addresses.
		seen := map[string]bool{}
		for range 40 {
			r := e.probe(ctx, "tcp", to, echo.ProbeOptions{})
			if r.Outcome != echo.Answer {
				t.Fatalf("%s: %v", fam, r)
			}
			h, _ := top.Host(r.Reply.Name)
			seen[netip.AddrPortFrom(h.Addr(fam), proxytest.EchoPort).String()] = true
		}
		for ep := range seen {
			if !slices.Contains(planned, ep) {
				t.Errorf("%s: traffic reached %s, explain says only %v", fam, ep, planned)
			}
		}
		if len(seen) != len(planned) {
			t.Errorf("%s: traffic reached %v, explain says %v", fam, seen, planned)
		}
	}

	// Someone flushes nat PREROUTING.
	for _, fam := range families() {
		e.iptables(fam, "-t", "nat", "-F", "PREROUTING")
	}
	for _, fam := range families() {
		res := e.explainLive(clusterIP(svc, fam), client.Addr(fam))
		if res.Verdict != explain.NotHandled || !strings.Contains(strings.Join(res.Drift, "\n"), "missing jump in nat/PREROUTING") {
			t.Errorf("%s after the flush: verdict %s drift %q, want not handled and the missing jump", fam, res.Verdict, res.Drift)
		}
		if r := e.probe(ctx, "tcp", clusterIP(svc, fam), echo.ProbeOptions{Timeout: 500 * time.Millisecond}); r.Outcome == echo.Answer {
			t.Errorf("%s: traffic still answered after the flush (%v): the test proves nothing", fam, r)
		}
	}

	// kproxy stops and cleans up.
	if err := e.p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := e.p.Cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	for _, fam := range families() {
		res := e.explainLive(clusterIP(svc, fam), client.Addr(fam))
		if res.Verdict != explain.NotHandled {
			t.Errorf("%s after --cleanup: verdict %s, want not handled", fam, res.Verdict)
		}
		if d := strings.Join(res.Drift, "\n"); !strings.Contains(d, "no KPROXY chain") {
			t.Errorf("%s after --cleanup: drift %q, want tables without kproxy's chains", fam, d)
		}
	}
}
