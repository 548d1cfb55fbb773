package linux

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"github.com/kproxy/kproxy/test/proxytest"
)

// nftExplainWorld is node1 of the shared topology with one Service of two
// endpoints (a pod of node1 and one of node2) and one without endpoints,
// in the nftables mode (IPv4).
type nftExplainWorld struct {
	top      *proxytest.Topology
	snap     *proxy.Snapshot
	cfg      facts.Config
	local    []netip.Addr
	web, dry netip.AddrPort
	client   netip.Addr
}

func newNFTExplainWorld(t *testing.T) *nftExplainWorld {
	t.Helper()
	top := proxytest.Default()
	web := top.Service("web", 120)
	dry := top.Service("dry", 121)
	sl, err := top.Slices(web, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	node, err := top.NodeObject(proxytest.Node1)
	if err != nil {
		t.Fatal(err)
	}
	n1, _ := top.Node(proxytest.Node1)
	w := &nftExplainWorld{top: top, snap: buildSnapshot(node, []*v1.Service{web, dry}, sl),
		cfg: facts.DefaultConfig(v1.IPv4Protocol), local: []netip.Addr{n1.IPv4, netip.MustParseAddr("127.0.0.1")},
		web: netip.AddrPortFrom(netip.MustParseAddr(web.Spec.ClusterIP), proxytest.ServicePort),
		dry: netip.AddrPortFrom(netip.MustParseAddr(dry.Spec.ClusterIP), proxytest.ServicePort)}
	w.cfg.ClusterCIDRs = top.ClusterCIDRs()
	pod, _ := top.Host(proxytest.PodA2)
	w.client = pod.Addr(v1.IPv4Protocol)
	return w
}

func (w *nftExplainWorld) query(to netip.AddrPort) explain.Query {
	return explain.Query{To: to, Protocol: v1.ProtocolTCP, From: w.client, Origin: explain.FromPod, NodeAddrs: w.local}
}

func (w *nftExplainWorld) explain(t *testing.T, tr explain.Tracer, live bool, to netip.AddrPort) *explain.Result {
	t.Helper()
	res, err := explain.Explain("nftables", live, w.view(), w.query(to), tr)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func text(res *explain.Result) string {
	var b strings.Builder
	_ = explain.WriteText(&b, res)
	return b.String()
}

// nftScenarios are the breakages the captured testdata holds: each is run
// with nft on the table as planned, then listed with nft -j list table.
var nftScenarios = []struct{ name, cmd string }{
	{"planned", ""},
	{"frontends-flushed", "flush map ip kproxy frontends"},
	{"prerouting-flushed", "flush chain ip kproxy nat-prerouting"},
	{"slot-deleted", "delete element ip kproxy cluster-ip-tcp { WEB . 80 . 1 }"},
	{"foreign-rule", "insert rule ip kproxy services ip daddr WEB tcp dport 80 counter accept"},
}

// captureNFTExplain writes testdata/nft-explain: each scenario's table,
// and the base chains of every table with another table's NAT chain
// (nft -j list chains), from a throwaway network namespace.
func captureNFTExplain(t *testing.T, w *nftExplainWorld, plan string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("capturing needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("kpx-explain-%d", os.Getpid())
	run := func(stdin string, args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, stdin, stderr.String())
		}
		return out
	}
	run("", "ip", "netns", "add", ns)
	defer run("", "ip", "netns", "del", ns)
	nftIn := func(args ...string) []string { return append([]string{"ip", "netns", "exec", ns, "nft"}, args...) }
	dir := filepath.Join("testdata", "nft-explain")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, sc := range nftScenarios {
		run(plan, nftIn("-f", "-")...)
		if sc.cmd != "" {
			run(strings.ReplaceAll(sc.cmd, "WEB", w.web.Addr().String())+"\n", nftIn("-f", "-")...)
		}
		out := run("", nftIn("-j", "list", "table", "ip", nftables.TableName)...)
		if err := os.WriteFile(filepath.Join(dir, sc.name+".json"), out, 0o644); err != nil {
			t.Fatal(err)
		}
		run("", nftIn("delete", "table", "ip", nftables.TableName)...)
	}
	run(plan, nftIn("-f", "-")...)
	run("add table inet fw\nadd chain inet fw pre { type nat hook prerouting priority -150 ; }\nadd chain inet fw mid { type nat hook output priority -100 ; }\nadd chain inet fw late { type nat hook prerouting priority 10 ; }\nadd table ip6 fw6\nadd chain ip6 fw6 pre { type nat hook prerouting priority -160 ; }\n", nftIn("-f", "-")...)
	out := run("", nftIn("-j", "list", "chains")...)
	if err := os.WriteFile(filepath.Join(dir, "chains.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readNFTExplain(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "nft-explain", name+".json"))
	if err != nil {
		t.Fatalf("%v (capture it: as root, KPROXY_NFT_CAPTURE=1 go test -run TestExplainNFTLiveCaptured ./platform/linux/)", err)
	}
	return b
}

// TestExplainNFTLiveCaptured: --live over what nft -j list table printed
// (captured from a real kernel, nft 1.0.6, testdata/nft-explain) finds no
// drift when the kernel holds the plan, and names each breakage: a flushed
// frontends map (the connection is then not handled), a flushed entry
// chain, a deleted endpoint slot (half the connections are then not
// DNATed), a rule kproxy does not write in front of the dispatch (its
// counter is not read: the trace stops there, not simulated); and it notes
// the other tables' NAT chains that see connections no later than kproxy's.
func TestExplainNFTLiveCaptured(t *testing.T) {
	w := newNFTExplainWorld(t)
	plan, err := plannedNFTPlan(w.cfg, w.view())
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("KPROXY_NFT_CAPTURE") == "1" {
		captureNFTExplain(t, w, plan.Tx.String())
	}
	live := func(t *testing.T, scenario string, chains []byte) *NFTExplainer {
		t.Helper()
		e, err := LiveNFT(w.cfg, w.view(), NFTLive{Table: readNFTExplain(t, scenario), Chains: chains})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	drift := func(res *explain.Result) string { return strings.Join(res.Drift, "\n") }

	t.Run("as planned", func(t *testing.T) {
		e := live(t, "planned", readNFTExplain(t, "chains"))
		res := w.explain(t, e, true, w.web)
		if len(res.Drift) != 0 || res.Verdict != explain.DNAT || len(res.Targets) != 2 {
			t.Fatalf("want DNAT to 2 endpoints and no drift:\n%s", text(res))
		}
		planned, err := PlannedNFT(w.cfg, w.view())
		if err != nil {
			t.Fatal(err)
		}
		want := w.explain(t, planned, false, w.web)
		if fmt.Sprint(want.Targets, want.Path) != fmt.Sprint(res.Targets, res.Path) {
			t.Errorf("live:\n%s\nplanned:\n%s", text(res), text(want))
		}
		if res := w.explain(t, e, true, w.dry); res.Verdict != explain.Reject {
			t.Errorf("no endpoints: want REJECT:\n%s", text(res))
		}
		notes := strings.Join(res.Notes, "\n")
		for _, want := range []string{
			"table inet fw chain pre (type nat hook prerouting priority -150) runs before kproxy's",
			"table inet fw chain mid (type nat hook output priority -100) runs at kproxy's priority",
		} {
			if !strings.Contains(notes, want) {
				t.Errorf("notes %q, want %q", res.Notes, want)
			}
		}
		if strings.Contains(notes, "chain late") || strings.Contains(notes, "fw6") || strings.Contains(notes, "table ip kproxy") {
			t.Errorf("notes %q: a chain after kproxy's, of the other family, or kproxy's own", res.Notes)
		}
	})
	t.Run("frontends flushed", func(t *testing.T) {
		res := w.explain(t, live(t, "frontends-flushed", nil), true, w.web)
		if res.Verdict != explain.NotHandled {
			t.Errorf("verdict %s, want not handled:\n%s", res.Verdict, text(res))
		}
		want := "map frontends (Service frontends): 5 element(s) missing (in the plan, not in the kernel): "
		if len(res.Drift) != 1 || !strings.Contains(drift(res), want) || !strings.Contains(drift(res), w.dry.Addr().String()+" . tcp . 80 : goto reject-chain") ||
			!strings.Contains(drift(res), w.web.Addr().String()+" . tcp . 80 : goto masq-nonpod-dnat-cluster-ip-tcp-r2") {
			t.Errorf("drift %q, want only the map's missing elements (%s...)", res.Drift, want)
		}
	})
	t.Run("prerouting flushed", func(t *testing.T) {
		res := w.explain(t, live(t, "prerouting-flushed", nil), true, w.web)
		if res.Verdict != explain.NotHandled {
			t.Errorf("verdict %s, want not handled:\n%s", res.Verdict, text(res))
		}
		if len(res.Drift) != 1 || !strings.Contains(drift(res), "chain nat-prerouting differs from the plan (0 rules live, 1 planned): rule 1 is missing: jump services") {
			t.Errorf("drift %q, want the missing jump to services", res.Drift)
		}
		if !strings.Contains(strings.Join(res.Notes, "\n"), "no rule of kproxy's services chain sees this packet") {
			t.Errorf("notes %q", res.Notes)
		}
	})
	t.Run("slot deleted", func(t *testing.T) {
		res := w.explain(t, live(t, "slot-deleted", nil), true, w.web)
		if res.Verdict != explain.Mixed || len(res.Targets) != 2 {
			t.Fatalf("want half DNAT, half not handled:\n%s", text(res))
		}
		for _, tg := range res.Targets {
			if tg.Probability != 0.5 || (tg.Verdict != explain.DNAT && tg.Verdict != explain.NotHandled) {
				t.Errorf("target %+v", tg)
			}
		}
		want := fmt.Sprintf("map cluster-ip-tcp (endpoint slots): 1 element(s) missing (in the plan, not in the kernel): %s . 80 . 1 : ", w.web.Addr())
		if len(res.Drift) != 1 || !strings.Contains(drift(res), want) {
			t.Errorf("drift %q, want %q", res.Drift, want)
		}
	})
	t.Run("foreign rule", func(t *testing.T) {
		res := w.explain(t, live(t, "foreign-rule", nil), true, w.web)
		if res.Verdict != explain.Unknown {
			t.Errorf("verdict %s, want not simulated:\n%s", res.Verdict, text(res))
		}
		d := drift(res)
		if !strings.Contains(d, `chain services rule 1 is not a rule kproxy writes (statement "counter" is not one kproxy writes)`) ||
			!strings.Contains(d, "chain services differs from the plan (3 rules live, 2 planned)") {
			t.Errorf("drift %q, want the unreadable rule and the chain that differs", res.Drift)
		}
		// The other Service's connection meets the same rule first.
		if res := w.explain(t, live(t, "foreign-rule", nil), true, w.dry); res.Verdict != explain.Unknown {
			t.Errorf("%s: verdict %s, want not simulated", w.dry, res.Verdict)
		}
	})
}

// TestExplainNFTDriftFake: over the Fake, starting from the plan applied,
// --live names an endpoint slot deleted behind kproxy's back, a flushed
// chain, a base chain put on another priority, a stale chain, and a deleted
// table (then nothing handles the address).
func TestExplainNFTDriftFake(t *testing.T) {
	w := newNFTExplainWorld(t)
	plan, err := plannedNFTPlan(w.cfg, w.view())
	if err != nil {
		t.Fatal(err)
	}
	fam := nftables.Family(w.cfg.Family)
	run := func(t *testing.T, ops ...func(tx *knftables.Transaction)) *explain.Result {
		t.Helper()
		f := nftmodel.NewFake(fam, nftables.TableName)
		if err := f.Run(context.Background(), plan.Tx); err != nil {
			t.Fatal(err)
		}
		tx := knftables.NewFake(fam, nftables.TableName).NewTransaction()
		for _, op := range ops {
			op(tx)
		}
		if err := f.Run(context.Background(), nftables.TextTx(fam, tx.String())); err != nil {
			t.Fatal(err)
		}
		e, err := liveNFT(w.cfg, w.view(), nftmodel.Listing{Model: f.Model()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return w.explain(t, e, true, w.web)
	}
	t.Run("as planned", func(t *testing.T) {
		if res := run(t); len(res.Drift) != 0 || res.Verdict != explain.DNAT {
			t.Errorf("want DNAT, no drift:\n%s", text(res))
		}
	})
	t.Run("missing element", func(t *testing.T) {
		res := run(t, func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Map: "cluster-ip-tcp", Key: []string{w.web.Addr().String(), "80", "0"}})
		})
		if res.Verdict != explain.Mixed || len(res.Drift) != 1 ||
			!strings.Contains(res.Drift[0], fmt.Sprintf("map cluster-ip-tcp (endpoint slots): 1 element(s) missing (in the plan, not in the kernel): %s . 80 . 0 : ", w.web.Addr())) {
			t.Errorf("want half the connections not DNATed and the missing slot:\n%s", text(res))
		}
	})
	t.Run("flushed chain", func(t *testing.T) {
		res := run(t, func(tx *knftables.Transaction) { tx.Flush(&knftables.Chain{Name: nftables.ChainServices}) })
		if res.Verdict != explain.NotHandled || len(res.Drift) != 1 ||
			!strings.Contains(res.Drift[0], "chain services differs from the plan (0 rules live, 2 planned): rule 1 is missing: ip daddr . meta l4proto . th dport vmap @frontends") {
			t.Errorf("want not handled and the flushed services chain:\n%s", text(res))
		}
	})
	t.Run("changed element, stale chain", func(t *testing.T) {
		res := run(t,
			func(tx *knftables.Transaction) {
				tx.Add(&knftables.Chain{Name: "stale-old"})
				tx.Add(&knftables.Rule{Chain: "stale-old", Rule: "drop"})
				tx.Delete(&knftables.Element{Map: nftables.MapFrontends, Key: []string{w.web.Addr().String(), "tcp", "80"}})
				tx.Add(&knftables.Element{Map: nftables.MapFrontends, Key: []string{w.web.Addr().String(), "tcp", "80"}, Value: []string{"goto stale-old"}})
			})
		d := strings.Join(res.Drift, "\n")
		if res.Verdict != explain.Drop || !strings.Contains(d, "stale chain stale-old") ||
			!strings.Contains(d, fmt.Sprintf("map frontends (Service frontends): 1 element(s) with another value: %s . tcp . 80 : goto stale-old (planned goto masq-nonpod-dnat-cluster-ip-tcp-r2)", w.web.Addr())) {
			t.Errorf("want DROP, the stale chain and the element changed:\n%s", text(res))
		}
	})
	t.Run("base chain moved", func(t *testing.T) {
		res := run(t,
			func(tx *knftables.Transaction) { tx.Delete(&knftables.Chain{Name: nftables.ChainNATPrerouting}) },
			func(tx *knftables.Transaction) {
				tx.Add(&knftables.Chain{Name: nftables.ChainNATPrerouting, Type: knftables.PtrTo(knftables.NATType),
					Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.BaseChainPriority("50"))})
				tx.Add(&knftables.Rule{Chain: nftables.ChainNATPrerouting, Rule: "jump " + nftables.ChainServices})
			})
		if !strings.Contains(strings.Join(res.Drift, "\n"), `base chain nat-prerouting is "type nat hook prerouting priority 50", planned "type nat hook prerouting priority -100"`) {
			t.Errorf("want the base chain's priority named:\n%s", text(res))
		}
	})
	t.Run("deleted table", func(t *testing.T) {
		res := run(t, func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
		if res.Verdict != explain.NotHandled || res.Frontend == nil || len(res.Drift) != 1 ||
			!strings.Contains(res.Drift[0], "table ip kproxy does not exist") {
			t.Errorf("want not handled for the Service's ClusterIP and the missing table:\n%s", text(res))
		}
	})
}

// TestNFTDriftPortChainGenerations: a port's own chain carries a
// generation in its name, fresh on every rendering that changed it; a node
// that synced partially has the same chain under another generation than
// a plan made from scratch. That is no drift; other content is.
func TestNFTDriftPortChainGenerations(t *testing.T) {
	tcp, _ := nft.Proto("tcp")
	dnat := func(a string) nft.Rule {
		return nft.Rule{&nft.Match{Left: []nft.Expr{&nft.Meta{Key: "l4proto"}}, Right: []nft.Key{{tcp}}},
			&nft.DNAT{Family: "ip", Addr: netip.MustParseAddr(a), Port: 80}}
	}
	model := func(gen string, rule nft.Rule) *nftmodel.Model {
		name := "port-abcdefgh-ns/s/tcp/p-eps-cluster-" + gen
		key := nft.Key{nft.Addr(netip.MustParseAddr("10.96.0.1")), tcp, nft.Num(80)}
		return &nftmodel.Model{
			Chains: map[string]*nftmodel.Chain{name: {Name: name, Rules: []nft.Rule{rule}}},
			Sets: map[string]*nftmodel.Set{nftables.MapFrontends: {Name: nftables.MapFrontends, IsMap: true,
				Spec:     nftmodel.SetSpec{Key: []string{"ipv4_addr", "inet_proto", "inet_service"}, Data: []string{"verdict"}},
				Elements: map[string]nft.Elem{nftmodel.ElemID(key): {Key: key, Verdict: nft.Goto(name)}}}},
		}
	}
	if d := NFTDrift(knftables.IPv4Family, model("1", dnat("10.244.1.1")), model("17", dnat("10.244.1.1")), nil); len(d) != 0 {
		t.Errorf("same content under another generation: drift %q", d)
	}
	d := NFTDrift(knftables.IPv4Family, model("1", dnat("10.244.1.1")), model("17", dnat("10.244.1.2")), nil)
	if len(d) != 1 || !strings.Contains(d[0], "chain port-abcdefgh-ns/s/tcp/p-eps-cluster differs from the plan") {
		t.Errorf("other content: drift %q, want the chain that differs", d)
	}
	other := model("17", dnat("10.244.1.1"))
	for id, e := range other.Sets[nftables.MapFrontends].Elements {
		e.Verdict = nft.Goto("port-abcdefgh-ns/s/tcp/p-eps-local-17")
		other.Sets[nftables.MapFrontends].Elements[id] = e
	}
	other.Chains["port-abcdefgh-ns/s/tcp/p-eps-local-17"] = &nftmodel.Chain{Name: "port-abcdefgh-ns/s/tcp/p-eps-local-17", Rules: []nft.Rule{dnat("10.244.1.1")}}
	d = NFTDrift(knftables.IPv4Family, model("1", dnat("10.244.1.1")), other, nil)
	if want := "map frontends (Service frontends): 1 element(s) with another value: 10.96.0.1 . tcp . 80 : goto port-abcdefgh-ns/s/tcp/p-eps-local (planned goto port-abcdefgh-ns/s/tcp/p-eps-cluster)"; !slices.Contains(d, want) {
		t.Errorf("a frontend sent to another chain: drift %q, want %q", d, want)
	}
}

// TestNFTDriftAnonymousSets: rules are compared as values: the members of
// an anonymous set in another order (nft lists sets sorted, addresses
// merged) are no drift; another member, port or operator is.
func TestNFTDriftAnonymousSets(t *testing.T) {
	tcp, _ := nft.Proto("tcp")
	udp, _ := nft.Proto("udp")
	dport := &nft.Payload{Base: "th", Field: "dport"}
	saddr := &nft.Payload{Base: "ip", Field: "saddr"}
	anon := func(e nft.Expr, op nft.Op, vs ...nft.Value) *nft.Match {
		m := &nft.Match{Left: []nft.Expr{e}, Op: op, Anon: true}
		for _, v := range vs {
			m.Right = append(m.Right, nft.Key{v})
		}
		return m
	}
	pfx := func(s string) nft.Value { return nft.Prefix(netip.MustParsePrefix(s)) }
	addr := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
	l4 := &nft.Meta{Key: "l4proto"}
	drop := &nft.Verdict{Kind: "drop"}
	planned := nft.Rule{anon(l4, nft.OpImplicit, tcp, udp), anon(dport, nft.OpImplicit, nft.Num(80), nft.Num(443)),
		anon(saddr, nft.OpNe, pfx("192.168.50.0/24"), addr("192.168.70.12"), pfx("10.0.0.0/25"), pfx("10.0.0.128/25")), drop}
	model := func(r nft.Rule) *nftmodel.Model {
		return &nftmodel.Model{Chains: map[string]*nftmodel.Chain{"firewall": {Name: "firewall", Rules: []nft.Rule{r}}}, Sets: map[string]*nftmodel.Set{}}
	}
	for _, tc := range []struct {
		name  string
		live  nft.Rule
		drift bool
	}{
		{"the same", planned, false},
		{"members in another order, addresses merged", nft.Rule{anon(l4, nft.OpImplicit, nft.Num(17), tcp), anon(dport, nft.OpImplicit, nft.Num(443), nft.Num(80)),
			anon(saddr, nft.OpNe, pfx("10.0.0.0/24"), pfx("192.168.50.0/24"), addr("192.168.70.12")), drop}, false},
		{"another port", nft.Rule{anon(l4, nft.OpImplicit, tcp, udp), anon(dport, nft.OpImplicit, nft.Num(80), nft.Num(8443)),
			anon(saddr, nft.OpNe, pfx("192.168.50.0/24"), addr("192.168.70.12"), pfx("10.0.0.0/24")), drop}, true},
		{"a port less", nft.Rule{anon(l4, nft.OpImplicit, tcp, udp), anon(dport, nft.OpImplicit, nft.Num(80)),
			anon(saddr, nft.OpNe, pfx("192.168.50.0/24"), addr("192.168.70.12"), pfx("10.0.0.0/24")), drop}, true},
		{"a narrower prefix", nft.Rule{anon(l4, nft.OpImplicit, tcp, udp), anon(dport, nft.OpImplicit, nft.Num(80), nft.Num(443)),
			anon(saddr, nft.OpNe, pfx("192.168.50.0/24"), addr("192.168.70.12"), pfx("10.0.0.0/25")), drop}, true},
		{"another operator", nft.Rule{anon(l4, nft.OpImplicit, tcp, udp), anon(dport, nft.OpImplicit, nft.Num(80), nft.Num(443)),
			anon(saddr, nft.OpImplicit, pfx("192.168.50.0/24"), addr("192.168.70.12"), pfx("10.0.0.0/24")), drop}, true},
	} {
		d := NFTDrift(knftables.IPv4Family, model(planned), model(tc.live), nil)
		if got := len(d) > 0; got != tc.drift {
			t.Errorf("%s (%s, planned %s): drift %q, want drift %v", tc.name, tc.live, planned, d, tc.drift)
		}
		if tc.drift && (len(d) != 1 || !strings.Contains(d[0], "chain firewall differs from the plan (1 rules live, 1 planned): rule 1 is")) {
			t.Errorf("%s: drift %q, want the rule that differs", tc.name, d)
		}
	}
}

// view is the world's full View, as kproxy explain builds it.
func (w *nftExplainWorld) view() *intent.View {
	return fullView(w.cfg, w.snap.Family(w.cfg.Family), w.snap.Node, w.local, nil)
}
