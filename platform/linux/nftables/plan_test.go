package nftables_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"

	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/nftables"
)

// runSplit runs a full plan on f in the three parts of Tx.Split, the
// netlink batch as the same operations in nft -f text.
func runSplit(t testing.TB, f *nftmodel.Fake, plan *nftables.Plan) {
	t.Helper()
	pre, bulk, post, ok := plan.Tx.Split()
	if !ok {
		t.Fatal("a full transaction does not split")
	}
	if len(bulk) == 0 || !bulk[0].Flush {
		t.Fatalf("the netlink part does not start with a flush: %d operations", len(bulk))
	}
	for i, tx := range []*nftables.Tx{pre, nftables.ElementTx(knftables.IPv4Family, bulk), post} {
		if tx.NumOperations() == 0 {
			continue
		}
		if err := f.Run(context.Background(), tx); err != nil {
			t.Fatalf("part %d of 3 refused: %v\n%s", i+1, err, tx)
		}
	}
}

// TestPartialSyncsEqualFullSync applies random changes one partial render
// at a time and checks, after each, that the table equals what a full
// render of the same ports makes in an empty table, and that a full render
// over the live table (a restart, a periodic full sync) gives the same
// again. The Fake refuses what the kernel refuses (an element key with two
// values, a chain deleted while referenced), so every transaction is also
// one nft accepts.
func TestPartialSyncsEqualFullSync(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	rd := nfttest.Renderer(t, nfttest.Config())
	live := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	views := nfttest.NewViews()
	ports := views.Ports
	var applied *nftables.Applied
	intents := func() map[proxy.ServicePortName]*intent.Port {
		return nfttest.NewViews().With(ports).Build(true, nil)
	}
	// shadow follows live, but takes the full renders as System sends
	// them over netlink (Tx.Split).
	shadow := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	plan, applied := rd.Render(nftables.Input{Full: true, Ports: views.Build(true, nil), Node: nfttest.Node}, nil)
	nfttest.Run(t, live, plan)
	runSplit(t, shadow, plan)
	for step := range 300 {
		names := map[proxy.ServicePortName]struct{}{}
		for range 1 + rnd.IntN(4) {
			i := rnd.IntN(40)
			sp := nfttest.GenPort(rnd, i)
			names[sp.Name] = struct{}{}
			if rnd.IntN(4) == 0 {
				if _, ok := ports[sp.Name]; ok {
					delete(ports, sp.Name)
					continue
				}
			}
			ports[sp.Name] = sp
		}
		changed := views.Build(false, names)
		plan, next := rd.Render(nftables.Input{Ports: changed, Node: nfttest.Node}, applied)
		if plan.Full {
			t.Fatalf("step %d: partial render went full", step)
		}
		nfttest.Run(t, live, plan)
		nfttest.Run(t, shadow, plan)
		applied = next

		fresh := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
		fp, _ := rd.Render(nftables.Input{Full: true, Ports: intents(), Node: nfttest.Node}, nil)
		nfttest.Run(t, fresh, fp)
		if got, want := nfttest.Normalized(live), nfttest.Normalized(fresh); got != want {
			t.Fatalf("step %d: partial syncs differ from a full sync:\n%s", step, diffLines(got, want))
		}
		if step%50 == 49 {
			// A full sync over the live table (kproxy restarted): the
			// same table, nothing left over.
			ex := existingOf(live)
			fp, next := rd.Render(nftables.Input{Full: true, Ports: intents(), Node: nfttest.Node, Existing: ex}, nil)
			nfttest.Run(t, live, fp)
			applied = next
			if got, want := nfttest.Normalized(live), nfttest.Normalized(fresh); got != want {
				t.Fatalf("step %d: full sync over the live table differs:\n%s", step, diffLines(got, want))
			}
			sp, _ := rd.Render(nftables.Input{Full: true, Ports: intents(), Node: nfttest.Node, Existing: existingOf(shadow)}, nil)
			runSplit(t, shadow, sp)
			if got, want := nfttest.Normalized(shadow), nfttest.Normalized(fresh); got != want {
				t.Fatalf("step %d: full sync over the live table in three parts differs:\n%s", step, diffLines(got, want))
			}
		}
	}
}

func existingOf(f *nftmodel.Fake) *nftables.Existing {
	all, err := f.ListAll(context.Background())
	if err != nil {
		return nil
	}
	return &nftables.Existing{Chains: all["chain"], Sets: all["set"]}
}

func diffLines(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	gs, ws := map[string]bool{}, map[string]bool{}
	for _, l := range g {
		gs[l] = true
	}
	for _, l := range w {
		ws[l] = true
	}
	var b strings.Builder
	for _, l := range g {
		if !ws[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	for _, l := range w {
		if !gs[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	return b.String()
}

// TestEndpointChangeWritesOnlyElements: an endpoint replaced, added or
// removed writes elements only (and the frontends' verdict elements when
// the count changes); no rule, no chain, when some Service already has
// the new count.
func TestEndpointChangeWritesOnlyElements(t *testing.T) {
	rd := nfttest.Renderer(t, nfttest.Config())
	mk := func(eps ...string) *proxy.ServicePort {
		sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP},
			Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, NodePort: 30080, HasAnyEndpoints: len(eps) > 0}
		for _, e := range eps {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, proxy.Endpoint{IP: netip.MustParseAddr(e), Port: 8080, Ready: true, Serving: true})
		}
		return sp
	}
	// Other Services with 3 and 4 endpoints: the shared DNAT chains for 3
	// and 4 endpoints exist whatever web has.
	other := mk("10.244.2.1", "10.244.2.2", "10.244.2.4")
	other.Name.Name, other.ClusterIP, other.NodePort = "other", netip.MustParseAddr("10.96.0.11"), 30081
	four := mk("10.244.3.1", "10.244.3.2", "10.244.3.4", "10.244.3.5")
	four.Name.Name, four.ClusterIP, four.NodePort = "four", netip.MustParseAddr("10.96.0.12"), 30082
	f := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	sp := mk("10.244.1.1", "10.244.1.2", "10.244.1.3")
	plan, a := rd.Render(nftables.Input{Full: true, Node: nfttest.Node, Ports: map[proxy.ServicePortName]*intent.Port{
		sp.Name: nfttest.Build(t, sp), other.Name: nfttest.Build(t, other), four.Name: nfttest.Build(t, four)}}, nil)
	nfttest.Run(t, f, plan)
	for _, tc := range []struct {
		name              string
		eps               []string
		added, deleted    int
		wantVerdictChange bool
	}{
		{"replaced", []string{"10.244.1.1", "10.244.1.2", "10.244.1.9"}, 2, 2, false},
		{"added", []string{"10.244.1.1", "10.244.1.2", "10.244.1.8", "10.244.1.9"}, 6, 4, true},
		{"removed", []string{"10.244.1.1", "10.244.1.2", "10.244.1.8"}, 2, 4, true},
	} {
		sp := mk(tc.eps...)
		plan, next := rd.Render(nftables.Input{Node: nfttest.Node, Ports: map[proxy.ServicePortName]*intent.Port{sp.Name: nfttest.Build(t, sp)}}, a)
		text := plan.Tx.String()
		if strings.Contains(text, "rule") || strings.Contains(text, " chain ") {
			t.Errorf("%s: writes rules or chains:\n%s", tc.name, text)
		}
		if plan.Stats.AddedElements != tc.added || plan.Stats.DeletedElements != tc.deleted {
			t.Errorf("%s: %d elements added, %d deleted; want %d, %d:\n%s", tc.name, plan.Stats.AddedElements, plan.Stats.DeletedElements, tc.added, tc.deleted, text)
		}
		if got := strings.Contains(strings.ReplaceAll(text, "frontends { 0.0.0.0 . tcp . 0", ""), "frontends"); got != tc.wantVerdictChange {
			t.Errorf("%s: verdict element changed = %v, want %v:\n%s", tc.name, got, tc.wantVerdictChange, text)
		}
		nfttest.Run(t, f, plan)
		a = next
	}
}

// TestFrontendHandover: two Services list one externalIP; the intent
// builder gives it to the first by name and reports the other; when the
// owner goes, the other's port is among the changed ones and the renderer
// hands the element over in the same transaction.
func TestFrontendHandover(t *testing.T) {
	rd := nfttest.Renderer(t, nfttest.Config())
	mk := func(name, cip string, ep string) *proxy.ServicePort {
		return &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "http", Protocol: v1.ProtocolTCP},
			Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr(cip), Port: 80,
			ExternalIPs:      []netip.Addr{netip.MustParseAddr("192.168.1.1")},
			ClusterEndpoints: []proxy.Endpoint{{IP: netip.MustParseAddr(ep), Port: 8080, Ready: true, Serving: true}}, HasAnyEndpoints: true}
	}
	a, b := mk("a", "10.96.0.1", "10.244.1.1"), mk("b", "10.96.0.2", "10.244.1.2")
	cfg := intent.Config{PodSources: true, NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.10")}}
	bld := intent.NewBuilder(v1.IPv4Protocol)
	view := bld.Build(intent.Input{Config: cfg, Changes: proxy.Changes{Full: true},
		Ports: proxy.NewFamilyView(v1.IPv4Protocol, map[proxy.ServicePortName]*proxy.ServicePort{a.Name: a, b.Name: b})})
	if pr := view.Problems(); len(pr) != 1 || pr[0].Service.Name != "b" || pr[0].Reason != "FrontendConflict" {
		t.Errorf("problems %v, want one FrontendConflict for b", pr)
	}
	ports := map[proxy.ServicePortName]*intent.Port{}
	for _, p := range view.Sorted() {
		ports[p.Name] = p
	}
	f := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	plan, applied := rd.Render(nftables.Input{Full: true, Node: nfttest.Node, Ports: ports}, nil)
	nfttest.Run(t, f, plan)
	if !strings.Contains(f.Dump(), "192.168.1.1 . 80 . 0 : 10.244.1.1 . 8080") {
		t.Errorf("a does not own the externalIP:\n%s", f.Dump())
	}
	view = bld.Build(intent.Input{Config: cfg, Changes: proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{a.Name: {}}},
		Ports: proxy.NewFamilyView(v1.IPv4Protocol, map[proxy.ServicePortName]*proxy.ServicePort{b.Name: b})})
	changed := map[proxy.ServicePortName]*intent.Port{}
	view.ChangedPorts(func(n proxy.ServicePortName, p *intent.Port) { changed[n] = p })
	if _, ok := changed[b.Name]; !ok || len(changed) != 2 {
		t.Fatalf("changed ports %v, want a (gone) and b (takes the externalIP over)", changed)
	}
	plan, _ = rd.Render(nftables.Input{Node: nfttest.Node, Ports: changed}, applied)
	nfttest.Run(t, f, plan)
	if !strings.Contains(f.Dump(), "192.168.1.1 . 80 . 0 : 10.244.1.2 . 8080") {
		t.Errorf("b did not take the externalIP over:\n%s\n%s", plan.Tx, f.Dump())
	}
}
