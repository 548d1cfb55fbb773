package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// get fetches a URL from inside node1 (kproxy's health and metrics servers).
func (e *env) get(ctx context.Context, url string) (int, string, error) {
	ns, err := e.c.MustNS(proxytest.Node1)
	if err != nil {
		return 0, "", err
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: controlplane.NetnsDialer(ns.Name), DisableKeepAlives: true, Proxy: nil}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

// requireAnswers makes n connections from a client to addr and fails unless
// every one is answered by one of want.
func (e *env) requireAnswers(ctx context.Context, client string, addr netip.AddrPort, n int, want ...string) {
	e.t.Helper()
	got := map[string]int{}
	for range n {
		r := e.c.Probe(ctx, client, "tcp", addr, echo.ProbeOptions{Timeout: time.Second})
		name := "<" + string(r.Outcome) + ">"
		if r.Outcome == echo.Answer {
			name = r.Reply.Name
		}
		got[name]++
	}
	for name := range got {
		found := false
		for _, w := range want {
			found = found || name == w
		}
		if !found {
			e.t.Errorf("%s → %s: answers %v, want only %v", client, addr, got, want)
			return
		}
	}
}

// TestClusterIPCannotBeHijacked: a Service in any namespace listing another
// Service's ClusterIP as an externalIP does not take it over; pods and the
// outside client reach only the ClusterIP's own endpoints. (evil sorts
// before term: a name-ordered first-match dispatch sent everything to evil.)
func TestClusterIPCannotBeHijacked(t *testing.T) {
	top := proxytest.Default()
	term := top.Service("term", 110)
	evil := top.Service("evil", 111)
	evil.Spec.ExternalIPs = append([]string(nil), term.Spec.ClusterIPs...)
	termSlices, err := top.Slices(term, proxytest.Ready(proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	evilSlices, err := top.Slices(evil, proxytest.Ready(proxytest.PodB2)...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{term, termSlices[0], termSlices[1], evil, evilSlices[0], evilSlices[1]}})
	ctx := e.ctx(2 * time.Minute)
	for _, fam := range families() {
		for _, client := range []string{proxytest.Client1, proxytest.Outside} {
			e.requireAnswers(ctx, client, clusterIP(term, fam), 10, proxytest.PodB1)
		}
		// evil keeps its own ClusterIP.
		e.requireAnswers(ctx, proxytest.Client1, clusterIP(evil, fam), 5, proxytest.PodB2)
	}
}

// shimRestore returns a kproxy "binary" (a script) that runs kproxy with
// iptables-restore of both flavours and families replaced by a shim that
// rejects any input containing reject, as a kernel without a match module
// rejects that Service's rules, and runs the real tool otherwise.
func shimRestore(t *testing.T, reject string) string {
	t.Helper()
	dir := t.TempDir()
	for _, fam := range families() {
		for _, flav := range []string{"nft", "legacy"} {
			name := toolOf(fam, flav, "-restore")
			real, err := exec.LookPath(name)
			if err != nil {
				continue
			}
			script := fmt.Sprintf(`#!/bin/sh
in=$(mktemp) || exit 2
trap 'rm -f "$in"' EXIT
cat >"$in"
if grep -qF -- %q "$in"; then
	echo "%s: line 3 failed: No chain/target/match by that name" >&2
	exit 1
fi
%s "$@" <"$in"
`, reject, name, real)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	wrapper := filepath.Join(dir, "kproxy")
	if err := os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\nPATH=%s:$PATH exec %s \"$@\"\n", dir, kproxyBin)), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

// TestRejectedServiceIsolated: one Service whose rules iptables-restore
// rejects (a shim stands for the kernel refusing a match) is left out;
// every other Service is programmed, later changes too, /livez stays 200
// over several sync periods, and the port is counted in
// kproxy_sync_quarantined_service_ports.
func TestRejectedServiceIsolated(t *testing.T) {
	iptablesOnly(t, "it replaces iptables-restore with a shim that rejects one Service")
	top := proxytest.Default()
	bad := top.Service("bad", 112)
	good := top.Service("good", 113)
	objects := func(goodPods ...string) []any {
		bs, err := top.Slices(bad, proxytest.Ready(proxytest.PodB1)...)
		if err != nil {
			t.Fatal(err)
		}
		gs, err := top.Slices(good, proxytest.Ready(goodPods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{bad, bs[0], bs[1], good, gs[0], gs[1]}
	}
	const syncPeriod = 2 * time.Second
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objects(proxytest.PodA1), noStart: true,
		extra: []string{"--iptables-sync-period", syncPeriod.String()}})
	e.p.Binary = shimRestore(t, `"default/bad:`)
	e.start()
	ctx := e.ctx(2 * time.Minute)
	for _, fam := range families() {
		e.requireAnswers(ctx, proxytest.Client1, clusterIP(good, fam), 5, proxytest.PodA1)
	}
	// A later change of another Service is programmed.
	e.write("objects.yaml", objects(proxytest.PodB2)...)
	for _, fam := range families() {
		if _, ok := e.until(ctx, []netip.AddrPort{clusterIP(good, fam)}, 10*time.Second, func(r echo.Result) bool { return r.Reply.Name == proxytest.PodB2 }); !ok {
			t.Fatalf("%s: good's change not programmed while bad is quarantined", fam)
		}
	}
	// Health stays good over several sync periods (two are /livez's limit).
	deadline := time.Now().Add(3 * syncPeriod)
	for time.Now().Before(deadline) {
		code, body, err := e.get(ctx, "http://127.0.0.1:10256/livez")
		if err != nil || code != http.StatusOK {
			t.Fatalf("/livez %d %q %v with a quarantined Service", code, body, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	_, metrics, err := e.get(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families() {
		want := fmt.Sprintf(`kproxy_sync_quarantined_service_ports{ip_family="%s"} 2`, fam) // bad's TCP and UDP ports
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "quarantined"))
		}
	}
	for _, fam := range families() {
		if save := e.save(fam, "nat"); strings.Contains(save, `"default/bad:`) || strings.Contains(save, "KPROXY-PROBE") {
			t.Errorf("%s: bad's rules or probe chains in the kernel", fam)
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestForeignReferenceToKproxyChain: another agent's rule jumps into a
// kproxy chain; when kproxy no longer needs that chain, iptables cannot
// delete it. Every other change is still programmed and health stays good.
func TestForeignReferenceToKproxyChain(t *testing.T) {
	iptablesOnly(t, "a foreign iptables rule jumping into a KPROXY chain")
	top := proxytest.Default()
	gone := top.Service("gone", 114)
	web := top.Service("web", 115)
	slicesOf := func(svc *v1.Service, pods ...string) []any {
		s, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{s[0], s[1]}
	}
	objs := append([]any{gone}, slicesOf(gone, proxytest.PodA1)...)
	objs = append(append(objs, web), slicesOf(web, proxytest.PodA1)...)
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objs})
	ctx := e.ctx(2 * time.Minute)
	svcChain, _, _, _ := iptables.ServiceChains(proxy.ServicePortName{NamespacedName: nsName(gone), Port: proxytest.PortTCP, Protocol: v1.ProtocolTCP})
	for _, fam := range families() {
		e.restore(fam, "*nat\n:FOREIGN - [0:0]\n-A FOREIGN -j "+svcChain+"\nCOMMIT\n")
	}
	objs = append([]any{web}, slicesOf(web, proxytest.PodB2)...)
	e.write("objects.yaml", objs...)
	for _, fam := range families() {
		if _, ok := e.until(ctx, []netip.AddrPort{clusterIP(web, fam)}, 10*time.Second, func(r echo.Result) bool { return r.Reply.Name == proxytest.PodB2 }); !ok {
			t.Fatalf("%s: web's change not programmed (the foreign reference blocked the sync?)\n%s", fam, LastLines(e.p.Process().Output(), 30))
		}
	}
	if code, body, err := e.get(ctx, "http://127.0.0.1:10256/livez"); err != nil || code != http.StatusOK {
		t.Errorf("/livez %d %q %v", code, body, err)
	}
	for _, fam := range families() {
		save := e.save(fam, "nat")
		if !strings.Contains(save, "-A FOREIGN -j "+svcChain) {
			t.Errorf("%s: the foreign rule was touched", fam)
		}
		if strings.Contains(save, "-A "+svcChain+" ") {
			t.Errorf("%s: the unneeded chain %s still has rules", fam, svcChain)
		}
	}
}

func nsName(svc *v1.Service) types.NamespacedName {
	return types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
}
