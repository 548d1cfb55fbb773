package linux

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	"github.com/kproxy/kproxy/test/proxytest"
)

// errNoMatch is what iptables-restore says when the kernel lacks a match
// module (SCTP without xt_sctp).
var errNoMatch = errors.New("line 12 failed: No chain/target/match by that name")

// TestRejectedServiceIsQuarantined: one Service whose rules the kernel
// rejects is found, left out and reported; every other Service is
// programmed and later changes too; the sync succeeds; once the kernel
// accepts it, it is programmed.
func TestRejectedServiceIsQuarantined(t *testing.T) {
	m := &recordingMetrics{restoreFailed: map[bool]int{}, rules: map[string][2]int{}}
	w := newWorld(t, v1.IPv4Protocol, func(o *Options) { o.Metrics = m })
	for i, name := range []string{"a", "bad", "c", "d", "e"} {
		w.set(name, i+1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	}
	w.ipt.Reject[`"default/bad:`] = errNoMatch
	w.mustSync(false)
	q := w.b.Quarantined()
	if len(q) != 2 {
		t.Fatalf("quarantined %+v, want both ports of default/bad", q)
	}
	for _, p := range q {
		if p.Name.Name != "bad" || !strings.Contains(p.Reason, "No chain/target/match") {
			t.Fatalf("quarantined %+v, want default/bad with the kernel's error", p)
		}
	}
	due := func() {
		for _, p := range q {
			w.b.m.quarantine[p.Name].retry = time.Now().Add(-time.Second)
		}
	}
	dump := w.ipt.Dump()
	for _, name := range []string{"a", "c", "d", "e"} {
		if !strings.Contains(dump, `"default/`+name+`:`) {
			t.Errorf("Service %s not programmed while bad is quarantined", name)
		}
	}
	if strings.Contains(dump, `"default/bad:`) || strings.Contains(dump, "KPROXY-PROBE") {
		t.Errorf("bad or probe chains in the kernel:\n%s", dump)
	}

	// Later changes of other Services are programmed, partially.
	w.set("c", 3, proxytest.Ready(proxytest.PodA1, proxytest.PodB1), proxytest.WithNodePort())
	w.mustSync(false)
	if w.b.Last().Full {
		t.Error("a change of another Service needed a full sync")
	}
	if !strings.Contains(w.ipt.Dump(), "10.244.2.10") {
		t.Error("c's new endpoint not programmed")
	}

	// Not due yet: no probe, still out.
	restores := w.ipt.Calls["Restore"]
	w.mustSync(false)
	if w.ipt.Calls["Restore"] != restores || len(w.b.Quarantined()) != 2 {
		t.Errorf("a sync before the retry time probed (%d restores) or released the port", w.ipt.Calls["Restore"]-restores)
	}
	// Due, still rejected: the backoff doubles.
	due()
	w.mustSync(false)
	if got := w.b.m.quarantine[q[0].Name].backoff; got != 2*quarantineMinBackoff {
		t.Errorf("backoff %v after a second rejection, want %v", got, 2*quarantineMinBackoff)
	}
	// The kernel accepts it now (module loaded): programmed at the retry.
	delete(w.ipt.Reject, `"default/bad:`)
	due()
	w.mustSync(false)
	if len(w.b.Quarantined()) != 0 || !strings.Contains(w.ipt.Dump(), `"default/bad:`) {
		t.Errorf("after the kernel accepts it: quarantined %v", w.b.Quarantined())
	}
	w.checkMatchesFullPlan()
}

// TestTransientRestoreFailureQuarantinesNothing: when every restore fails
// (xtables lock held), no port is blamed and the sync fails.
func TestTransientRestoreFailureQuarantinesNothing(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("a", 1, proxytest.Ready(proxytest.PodA1))
	w.ipt.Reject["*nat"] = errors.New("Another app is currently holding the xtables lock")
	if _, err := w.sync(false); err == nil {
		t.Fatal("sync succeeded with every restore failing")
	}
	if q := w.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined %v on a transient failure", q)
	}
}

// TestRuleBudget: a Service needing more rules than the budget is left out
// and reported, without any kernel call to find it.
func TestRuleBudget(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, func(o *Options) { o.RuleBudget = 20 })
	w.set("small", 1, proxytest.Ready(proxytest.PodA1))
	w.set("huge", 2, proxytest.Ready(proxytest.PodA1, proxytest.PodA2, proxytest.PodB1, proxytest.PodB2), proxytest.WithExternalIPs(), proxytest.WithNodePort(), proxytest.WithAffinity(60))
	w.mustSync(false)
	q := w.b.Quarantined()
	if len(q) == 0 || q[0].Name.Name != "huge" || !strings.Contains(q[0].Reason, "budget of 20") {
		t.Fatalf("quarantined %+v, want huge over the budget", q)
	}
	if strings.Contains(w.ipt.Dump(), `"default/huge:`) || !strings.Contains(w.ipt.Dump(), `"default/small:`) {
		t.Error("huge programmed or small not")
	}
	if w.ipt.Calls["Restore"] != 1 {
		t.Errorf("%d restores, want 1 (the budget needs no probe)", w.ipt.Calls["Restore"])
	}
}

// TestForeignReferenceDoesNotBlockDeletion: a foreign rule jumping into a
// chain kproxy no longer needs makes its deletion fail; the chain is
// emptied and kept instead, and every other change is programmed.
func TestForeignReferenceDoesNotBlockDeletion(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("web", 1, proxytest.Ready(proxytest.PodA1))
	w.set("gone", 2, proxytest.Ready(proxytest.PodA1))
	w.mustSync(false)
	svc, _, _, _ := iptables.ServiceChains(proxy.ServicePortName{NamespacedName: nsName(proxytest.Namespace, "gone"), Port: proxytest.PortTCP, Protocol: v1.ProtocolTCP})
	if err := w.ipt.Rules.Restore([]byte("*nat\n:FOREIGN - [0:0]\n-A FOREIGN -j "+svc+"\nCOMMIT\n"), true); err != nil {
		t.Fatal(err)
	}
	w.remove("gone")
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1))
	w.mustSync(false)
	dump := w.ipt.Dump()
	if !strings.Contains(dump, "10.244.2.10") {
		t.Error("web's change not programmed")
	}
	if strings.Contains(dump, "-A "+svc+" ") {
		t.Errorf("the referenced chain %s still has rules", svc)
	}
	// Later syncs keep working.
	w.set("web", 1, proxytest.Ready(proxytest.PodB1))
	w.mustSync(false)
	w.mustSync(true)
}
