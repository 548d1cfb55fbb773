package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
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
// names the endpoints traffic really reaches; after someone breaks kproxy's
// programming it names what is missing and says a pod's connection is not
// handled (iptables: an external flush of nat PREROUTING, the missing jump;
// nftables: a flush of the frontends map, its missing elements, then the
// table deleted, the missing table); after `kproxy --cleanup` it says
// nothing handles the address.
func TestExplainLiveAgreesWithTraffic(t *testing.T) {
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

	// breaks runs a breakage of kproxy's programming in node1, then checks
	// that --live says a pod's connection is not handled and names what is
	// missing, and that traffic is indeed no longer answered.
	breaks := func(what string, do func(fam v1.IPFamily), missing func(fam v1.IPFamily) []string) {
		for _, fam := range families() {
			do(fam)
		}
		for _, fam := range families() {
			res := e.explainLive(clusterIP(svc, fam), client.Addr(fam))
			drift := strings.Join(res.Drift, "\n")
			for _, want := range missing(fam) {
				if res.Verdict != explain.NotHandled || !strings.Contains(drift, want) {
					t.Errorf("%s after %s: verdict %s drift %q, want not handled and %q", fam, what, res.Verdict, res.Drift, want)
				}
			}
			if r := e.probe(ctx, "tcp", clusterIP(svc, fam), echo.ProbeOptions{Timeout: 500 * time.Millisecond}); r.Outcome == echo.Answer {
				t.Errorf("%s: traffic still answered after %s (%v): the test proves nothing", fam, what, r)
			}
		}
	}
	if nftMode() {
		// Someone flushes kproxy's dispatch map, then deletes its table.
		breaks("nft flush map frontends", func(fam v1.IPFamily) { e.nft("flush", "map", nftFamily(fam), "kproxy", "frontends") },
			func(fam v1.IPFamily) []string {
				return []string{"map frontends (Service frontends): ", "element(s) missing (in the plan, not in the kernel)",
					fmt.Sprintf("%s . tcp . %d : goto ", clusterIP(svc, fam).Addr(), proxytest.ServicePort)}
			})
		breaks("nft delete table", func(fam v1.IPFamily) { e.nft("delete", "table", nftFamily(fam), "kproxy") },
			func(fam v1.IPFamily) []string { return []string{"table " + nftFamily(fam) + " kproxy does not exist"} })
	} else {
		// Someone flushes nat PREROUTING.
		breaks("iptables -t nat -F PREROUTING", func(fam v1.IPFamily) { e.iptables(fam, "-t", "nat", "-F", "PREROUTING") },
			func(v1.IPFamily) []string { return []string{"missing jump in nat/PREROUTING"} })
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
		want := "no KPROXY chain"
		if nftMode() {
			want = "table " + nftFamily(fam) + " kproxy does not exist"
		}
		if d := strings.Join(res.Drift, "\n"); !strings.Contains(d, want) {
			t.Errorf("%s after --cleanup: drift %q, want %q", fam, d, want)
		}
	}
}
