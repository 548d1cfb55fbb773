package linux

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/linux/trace"
	"github.com/kproxy/kproxy/test/proxytest"
)

// world is a cluster fed to the real cache, and a backend over fakes.
type world struct {
	t     *testing.T
	topo  *proxytest.Topology
	cache *cache.Cache
	ipt   *FakeIptables
	nft   *FakeNFTables
	ct    *FakeConntrack
	host  *FakeHost
	b     *Backend
	svcs  map[string]*v1.Service
	sl    map[string][]*discovery.EndpointSlice
}

func newWorld(t *testing.T, fam v1.IPFamily, mutate func(*Options)) *world {
	t.Helper()
	topo := proxytest.Default()
	quiet := logr.Discard()
	w := &world{
		t: t, topo: topo,
		cache: cache.New(cache.Options{NodeName: proxytest.Node1, Logger: &quiet}),
		ipt:   NewFakeIptables(),
		nft:   &FakeNFTables{},
		ct:    &FakeConntrack{Flows: map[v1.IPFamily][]conntrack.Flow{}},
		svcs:  map[string]*v1.Service{},
		sl:    map[string][]*discovery.EndpointSlice{},
	}
	node1, _ := topo.Node(proxytest.Node1)
	w.host = &FakeHost{Addrs: append(node1.Addrs(v1.IPv4Protocol), append(node1.Addrs(v1.IPv6Protocol), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"))...)}
	cfg := facts.DefaultConfig(fam)
	cfg.ClusterCIDRs = topo.ClusterCIDRs()
	opts := Options{Rules: cfg, Iptables: w.ipt, NFTables: w.nft, Conntrack: w.ct, Host: w.host}
	if mutate != nil {
		mutate(&opts)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	w.b = b
	nodeObj, err := topo.NodeObject(proxytest.Node1)
	if err != nil {
		t.Fatal(err)
	}
	w.cache.OnNode(nil, nodeObj)
	w.cache.OnSynced()
	return w
}

// set adds or replaces a Service and its endpoints.
func (w *world) set(name string, index int, eps []proxytest.EP, opts ...proxytest.ServiceOption) {
	svc := w.topo.Service(name, index, opts...)
	slices, err := w.topo.Slices(svc, eps...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.cache.OnService(w.svcs[name], svc)
	w.svcs[name] = svc
	old := map[string]*discovery.EndpointSlice{}
	for _, s := range w.sl[name] {
		old[s.Name] = s
	}
	for _, s := range slices {
		w.cache.OnEndpointSlice(old[s.Name], s)
	}
	w.sl[name] = slices
}

func (w *world) remove(name string) {
	for _, s := range w.sl[name] {
		w.cache.OnEndpointSlice(s, nil)
	}
	w.cache.OnService(w.svcs[name], nil)
	delete(w.svcs, name)
	delete(w.sl, name)
}

// sync runs one sync the way the runner does and returns the changes used.
func (w *world) sync(full bool) (proxy.Changes, error) {
	w.t.Helper()
	snap, ch := w.cache.Snapshot()
	ch.Full = ch.Full || full
	err := syncSnap(context.Background(), w.b, snap, ch)
	if err == nil {
		w.cache.Ack(snap)
	}
	return ch, err
}

func (w *world) mustSync(full bool) {
	w.t.Helper()
	if _, err := w.sync(full); err != nil {
		w.t.Fatal(err)
	}
}

// want compares the fake kernel with a fresh full plan of the cache's state.
func (w *world) checkMatchesFullPlan() {
	w.t.Helper()
	w.checkMatchesFullPlanWith(nil)
}

// checkMatchesFullPlanWith is checkMatchesFullPlan with least-connection
// counts.
func (w *world) checkMatchesFullPlanWith(conns map[proxy.ServicePortName]map[netip.AddrPort]int) {
	w.t.Helper()
	snap, _ := w.cache.Snapshot()
	p, err := iptables.NewPlanner(w.b.m.opts.Rules)
	if err != nil {
		w.t.Fatal(err)
	}
	plan := p.Plan(iptables.Input{View: fullView(w.b.m.opts.Rules, snap.Family(w.b.family), snap.Node, w.host.Addrs, conns), Full: true})
	want := iptmodel.New()
	if err := want.Restore(plan.Restore, true); err != nil {
		w.t.Fatal(err)
	}
	for i := len(plan.Jumps) - 1; i >= 0; i-- {
		j := plan.Jumps[i]
		if err := want.Insert(j.Table, j.Chain, 1, j.Spec...); err != nil {
			w.t.Fatal(err)
		}
	}
	got := ownedOnly(w.ipt.Dump())
	exp := ownedOnly(want.Save("nat") + want.Save("filter"))
	if got != exp {
		w.t.Fatalf("kernel differs from a full plan:\ngot:\n%s\nwant:\n%s", got, exp)
	}
}

// ownedOnly keeps the lines about kproxy's chains and jumps.
func ownedOnly(save string) string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.Contains(l, iptables.Prefix) || strings.HasPrefix(l, "*") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestSyncFullThenPartial(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1), proxytest.WithNodePort())
	w.set("dns", 2, proxytest.Ready(proxytest.PodB2))
	w.mustSync(false)
	if !w.b.Last().Full {
		t.Error("first sync was not full")
	}
	w.checkMatchesFullPlan()
	if w.host.Sysctls["net/ipv4/conf/all/route_localnet"] != "1" {
		t.Errorf("route_localnet not set: %v", w.host.Sysctls)
	}

	saves := w.ipt.Calls["Save"]
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1, proxytest.PodB2), proxytest.WithNodePort())
	w.mustSync(false)
	last := w.b.Last()
	if last.Full {
		t.Error("endpoint change made a full sync")
	}
	if last.Stats.WrittenChains != 2 { // the TCP and UDP ports' service chains
		t.Errorf("endpoint change rewrote %d chains, want 2", last.Stats.WrittenChains)
	}
	if w.ipt.Calls["Save"] != saves {
		t.Error("a partial sync read the whole table")
	}
	w.checkMatchesFullPlan()

	w.remove("dns")
	w.set("new", 3, nil, proxytest.WithLoadBalancer())
	w.mustSync(false)
	w.checkMatchesFullPlan()

	// Nothing changed: no restore at all, a look at the canary chains.
	restores, lists := w.ipt.Calls["Restore"], w.ipt.Calls["List"]
	w.mustSync(false)
	if w.ipt.Calls["Restore"] != restores {
		t.Errorf("a sync without changes ran iptables-restore:\n%s", w.ipt.Restores[len(w.ipt.Restores)-1])
	}
	if want := 2 + len(iptables.Jumps()); w.ipt.Calls["List"] != lists+want || w.b.Last().Full {
		t.Errorf("a sync without changes listed %d chains (want the 2 canaries and %d built-in chains), full=%v", w.ipt.Calls["List"]-lists, want-2, w.b.Last().Full)
	}
}

func TestSyncDetectsFlush(t *testing.T) {
	tests := []struct {
		name    string
		tamper  string // restore input applied behind kproxy's back
		wantAll bool   // the next sync must be full
	}{
		{name: "nat table flushed", tamper: "*nat\n-F\nCOMMIT\n", wantAll: true},
		{name: "nat canary deleted", tamper: "*nat\n:KPROXY-CANARY - [0:0]\n-X KPROXY-CANARY\nCOMMIT\n", wantAll: true},
		// Another agent rewriting built-in chains: kproxy's chains are all
		// there, only the jumps into them are gone.
		{name: "nat PREROUTING and OUTPUT flushed", tamper: "*nat\n-F PREROUTING\n-F OUTPUT\nCOMMIT\n", wantAll: true},
		{name: "filter FORWARD flushed", tamper: "*filter\n-F FORWARD\nCOMMIT\n", wantAll: true},
		{name: "untouched", tamper: "", wantAll: false},
	}
	for _, tc := range tests {
		for _, change := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/change=%v", tc.name, change), func(t *testing.T) {
				w := newWorld(t, v1.IPv4Protocol, nil)
				w.set("web", 1, proxytest.Ready(proxytest.PodA1))
				w.set("other", 2, proxytest.Ready(proxytest.PodA1))
				w.mustSync(false)
				if tc.tamper != "" {
					if err := w.ipt.Rules.Restore([]byte(tc.tamper), true); err != nil {
						t.Fatal(err)
					}
				}
				if change {
					// A change notices through the checks in its restore.
					w.set("other", 2, proxytest.Ready(proxytest.PodA1, proxytest.PodB1))
				} // else a sync with nothing to write looks (iptables -S).
				w.mustSync(false)
				if w.b.Last().Full != tc.wantAll {
					t.Errorf("sync after tampering: full=%v, want %v", w.b.Last().Full, tc.wantAll)
				}
				w.checkMatchesFullPlan()
				for _, j := range iptables.Jumps() {
					if ok, err := w.ipt.Rules.Exists(j.Table, j.Chain, j.Spec...); err != nil || !ok {
						t.Errorf("jump %s/%s %s not repaired (%v)", j.Table, j.Chain, j.Rule(), err)
					}
				}
			})
		}
	}
}

// TestFullSyncRepairsDrift checks that the periodic full sync rewrites what
// was changed behind kproxy's back, and only that.
func TestFullSyncRepairsDrift(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1))
	w.set("other", 2, proxytest.Ready(proxytest.PodA1))
	w.mustSync(false)
	svc, _, _, _ := iptables.ServiceChains(proxy.ServicePortName{NamespacedName: nsName(proxytest.Namespace, "web"), Port: proxytest.PortTCP, Protocol: v1.ProtocolTCP})
	if err := w.ipt.Rules.Restore([]byte("*nat\n:"+svc+" - [0:0]\n-A "+svc+" -p tcp -j DNAT --to-destination 10.9.9.9:80\nCOMMIT\n*filter\n:KPROXY-OLD - [0:0]\nCOMMIT\n"), true); err != nil {
		t.Fatal(err)
	}
	w.mustSync(true)
	if st := w.b.Last().Stats; st.WrittenChains != 1 || st.DeletedChains != 1 {
		t.Errorf("repair wrote %d chains and deleted %d, want 1 and 1", st.WrittenChains, st.DeletedChains)
	}
	w.checkMatchesFullPlan()
	if strings.Contains(w.ipt.Dump(), "KPROXY-OLD") {
		t.Error("stale chain survived")
	}
}

func TestSyncFailures(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	w.set("web", 1, proxytest.Ready(proxytest.PodA1))
	w.mustSync(false)

	// A failed partial restore is followed at once by a full sync.
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1))
	w.ipt.FailNext["Restore"] = errors.New("xtables lock busy")
	w.mustSync(false)
	if !w.b.Last().Full {
		t.Error("a failed partial sync was not followed by a full one")
	}
	w.checkMatchesFullPlan()

	// When the full sync fails too, Sync reports it and the next is full.
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB2))
	w.ipt.FailNext["Restore"] = errors.New("xtables lock busy")
	w.ipt.FailNext["Save"] = errors.New("iptables-save: killed")
	if _, err := w.sync(false); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("sync error = %v", err)
	}
	saves := w.ipt.Calls["Save"]
	w.mustSync(false)
	if !w.b.Last().Full || w.ipt.Calls["Save"] == saves {
		t.Error("the sync after a failure was not full")
	}
	w.checkMatchesFullPlan()
}

// TestSyncInterrupted: a restore killed because kproxy is stopping (the
// sync's context is done) is neither retried as a full sync nor counted as
// a restore failure.
func TestSyncInterrupted(t *testing.T) {
	m := &recordingMetrics{restoreFailed: map[bool]int{}, rules: map[string][2]int{}}
	w := newWorld(t, v1.IPv4Protocol, func(o *Options) { o.Metrics = m })
	w.set("web", 1, proxytest.Ready(proxytest.PodA1))
	w.mustSync(false)

	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1))
	snap, ch := w.cache.Snapshot()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.ipt.FailNext["Restore"] = errors.New("iptables-restore: signal: killed")
	restores := w.ipt.Calls["Restore"]
	err := syncSnap(ctx, w.b, snap, ch)
	if err == nil || !strings.Contains(err.Error(), "interrupted") || !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync = %v, want an interruption wrapping context.Canceled", err)
	}
	if got := w.ipt.Calls["Restore"] - restores; got != 1 {
		t.Errorf("%d restores, want 1 (no full-sync retry while stopping)", got)
	}
	if m.restoreFailed[true]+m.restoreFailed[false] != 0 {
		t.Errorf("restore failures counted: %v", m.restoreFailed)
	}
	w.mustSync(false)
	if !w.b.Last().Full {
		t.Error("the sync after an interrupted one was not full")
	}
	w.checkMatchesFullPlan()
}

func TestSyncRemovesStaleChainsOfAnEarlierRun(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	// An earlier run left a service chain and a jump to it.
	if err := w.ipt.Rules.Restore([]byte("*nat\n:KPROXY-SERVICES - [0:0]\n:KPROXY-SVC-STALESTALESTALE - [0:0]\n"+
		"-A KPROXY-SERVICES -d 10.96.9.9/32 -p tcp -m tcp --dport 80 -j KPROXY-SVC-STALESTALESTALE\n"+
		"-A KPROXY-SVC-STALESTALESTALE -p tcp -j DNAT --to-destination 10.244.2.99:80\nCOMMIT\n"), true); err != nil {
		t.Fatal(err)
	}
	w.set("web", 1, proxytest.Ready(proxytest.PodA1))
	w.mustSync(false)
	if strings.Contains(w.ipt.Dump(), "STALE") {
		t.Errorf("stale chain survived:\n%s", w.ipt.Dump())
	}
	w.checkMatchesFullPlan()
}

// upstreamRules is what kube-proxy (iptables mode) leaves behind, pointing
// ClusterIP 10.96.0.1:80 at a wrong backend, plus rules of other tools.
const upstreamRules = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/web:tcp cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-BBBBBBBBBBBBBBBB -s 10.244.2.99/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 10.244.2.99:8080
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A DOCKER -p tcp -m tcp --dport 8888 -j DNAT --to-destination 172.17.0.2:80
COMMIT
*filter
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*mangle
:KUBE-PROXY-CANARY - [0:0]
COMMIT
`

func TestTakeOver(t *testing.T) {
	tests := []struct {
		name string
		keep bool
	}{
		{name: "take over"},
		{name: "keep upstream", keep: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, v1.IPv4Protocol, func(o *Options) { o.KeepUpstream = tc.keep })
			if err := w.ipt.Rules.Restore([]byte(upstreamRules), true); err != nil {
				t.Fatal(err)
			}
			w.nft.Tables = []string{"ip kube-proxy", "ip6 kube-proxy", "inet filter"}
			w.set("web", 1, proxytest.Ready(proxytest.PodA1)) // ClusterIP 10.96.0.1
			w.mustSync(false)

			rs := w.ipt.Rules
			h := trace.Host{LocalAddrs: w.host.Addrs}
			outs, err := rs.Trace(h, trace.Packet{Src: netip.MustParseAddr("10.244.1.100"), Dst: netip.MustParseAddr("10.96.0.1"), Proto: "tcp", SrcPort: 4000, DstPort: 80})
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) != 1 || outs[0].Dst.String() != "10.244.1.10:8080" {
				t.Errorf("ClusterIP goes to %v, want pod-a1 10.244.1.10:8080", outs)
			}
			dump := w.ipt.Dump() + rs.Save("mangle")
			var left []string
			for _, l := range strings.Split(dump, "\n") {
				if strings.Contains(l, "KUBE-") {
					left = append(left, l)
				}
			}
			if tc.keep {
				if len(left) < 20 || len(w.nft.Tables) != 3 {
					t.Errorf("KeepUpstream removed upstream rules: %d KUBE lines left, nft %v", len(left), w.nft.Tables)
				}
				return
			}
			// Only kubelet's chains stay.
			for _, l := range left {
				if !strings.Contains(l, "KUBE-FIREWALL") && !strings.Contains(l, "KUBE-KUBELET-CANARY") {
					t.Errorf("left behind: %s", l)
				}
			}
			if !strings.Contains(dump, "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER") || !strings.Contains(dump, "-A DOCKER ") {
				t.Error("take-over touched another tool's rules")
			}
			if strings.Join(w.nft.Tables, ",") != "ip6 kube-proxy,inet filter" {
				t.Errorf("nftables tables after take-over: %v", w.nft.Tables)
			}
			// Later full syncs neither take over again nor rewrite chains
			// the kernel already holds.
			restores := w.ipt.Calls["Restore"]
			w.mustSync(true)
			if w.ipt.Calls["Restore"] != restores {
				t.Errorf("a later full sync ran %d restores, want none", w.ipt.Calls["Restore"]-restores)
			}
		})
	}
}

func TestCleanupRestoresPreviousState(t *testing.T) {
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(fam), func(t *testing.T) {
			w := newWorld(t, fam, func(o *Options) { o.KeepUpstream = true })
			if err := w.ipt.Rules.Restore([]byte("*nat\n:DOCKER - [0:0]\n-A PREROUTING -j DOCKER\n-A DOCKER -p tcp -m tcp --dport 8888 -j DNAT --to-destination 172.17.0.2:80\nCOMMIT\n*filter\n:FORWARD DROP [0:0]\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n"), true); err != nil {
				t.Fatal(err)
			}
			before := w.ipt.Dump()
			w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1), proxytest.WithLoadBalancer(), proxytest.WithAffinity(60))
			w.mustSync(false)
			// A jump inserted twice (by hand) is removed too.
			j := iptables.Jumps()[0]
			if err := w.ipt.Rules.Insert(j.Table, j.Chain, 2, j.Spec...); err != nil {
				t.Fatal(err)
			}
			if w.ipt.Dump() == before {
				t.Fatal("sync changed nothing")
			}
			if err := w.b.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
			if after := w.ipt.Dump(); after != before {
				t.Errorf("after cleanup:\n%s\nwant:\n%s", after, before)
			}
			// Cleanup twice is fine.
			if err := w.b.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestConntrackCleanup(t *testing.T) {
	ap := netip.MustParseAddrPort
	udp := func(dst, reply string) conntrack.Flow {
		return conntrack.Flow{Protocol: v1.ProtocolUDP, OrigDst: ap(dst), ReplySrc: ap(reply)}
	}
	w := newWorld(t, v1.IPv4Protocol, nil)
	// A UDP Service without endpoints: a client's flow to the ClusterIP was
	// recorded without NAT (the reply comes from the ClusterIP itself).
	w.set("dns", 1, nil, proxytest.WithNodePort())
	w.mustSync(false)
	w.ct.Flows[v1.IPv4Protocol] = []conntrack.Flow{
		udp("10.96.0.1:80", "10.96.0.1:80"),             // stale: no NAT
		udp("192.168.50.1:30001", "192.168.50.1:30001"), // stale NodePort flow
		udp("10.96.0.2:80", "10.96.0.2:80"),             // another Service: untouched
		{Protocol: v1.ProtocolTCP, OrigDst: ap("10.96.0.1:80"), ReplySrc: ap("10.96.0.1:80")},
	}
	// It gets its first endpoints.
	w.set("dns", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1), proxytest.WithNodePort())
	w.mustSync(false)
	if got := len(w.ct.Flows[v1.IPv4Protocol]); got != 2 || w.b.Last().ConntrackDeleted != 2 {
		t.Fatalf("after the first endpoints: %d flows left (%v), deleted %d", got, w.ct.Flows[v1.IPv4Protocol], w.b.Last().ConntrackDeleted)
	}
	// Flows to both endpoints; then pod-b1 goes away.
	w.ct.Flows[v1.IPv4Protocol] = []conntrack.Flow{
		udp("10.96.0.1:80", "10.244.1.10:8080"),
		udp("10.96.0.1:80", "10.244.2.10:8080"),
		udp("192.168.50.1:30001", "10.244.2.10:8080"),
	}
	w.set("dns", 1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	w.mustSync(false)
	if got := w.ct.Flows[v1.IPv4Protocol]; len(got) != 1 || got[0].ReplySrc != ap("10.244.1.10:8080") {
		t.Fatalf("after removing pod-b1: flows %v, want only the one to pod-a1", got)
	}
	// A failing cleanup (netlink's dump interrupted on a busy node) does not
	// fail the sync: the rules are in place, the cleanup waits for the next
	// sync.
	w.ct.Flows[v1.IPv4Protocol] = append(w.ct.Flows[v1.IPv4Protocol], udp("10.96.0.1:80", "10.244.2.10:8080"))
	w.ct.Err = errors.New("netlink: dump interrupted")
	w.set("dns", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodA2), proxytest.WithNodePort())
	w.mustSync(false)
	if got := w.ct.Flows[v1.IPv4Protocol]; len(got) != 2 {
		t.Fatalf("with conntrack failing: flows %v", got)
	}
	w.ct.Err = nil
	w.mustSync(false) // nothing changed: the queued cleanup runs
	if got := w.ct.Flows[v1.IPv4Protocol]; len(got) != 1 {
		t.Fatalf("after the retry: flows %v", got)
	}
	// A periodic full sync of unchanged Services does not scan the table.
	calls := w.ct.Calls
	w.mustSync(true)
	if w.ct.Calls != calls {
		t.Errorf("a full sync without changes scanned conntrack %d times", w.ct.Calls-calls)
	}
	// The Service goes away: its flows go too.
	w.remove("dns")
	w.mustSync(false)
	if got := w.ct.Flows[v1.IPv4Protocol]; len(got) != 0 {
		t.Fatalf("after removing the Service: flows %v", got)
	}
}

func TestDryRunHasNoSideEffects(t *testing.T) {
	w := newWorld(t, v1.IPv6Protocol, nil)
	w.set("web", 1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	snap, _ := w.cache.Snapshot()
	var out strings.Builder
	if err := dryRunSnap(w.b, &out, snap); err != nil {
		t.Fatal(err)
	}
	for k, n := range w.ipt.Calls {
		if n > 0 {
			t.Errorf("dry run called %s %d times", k, n)
		}
	}
	text := out.String()
	for _, want := range []string{"# kproxy IPv6 rules", "*nat\n", "-A KPROXY-SERVICES -d fd00:10:96::1/128 -p tcp", "*filter\n", "COMMIT\n", "# ensured first in nat/PREROUTING"} {
		if !strings.Contains(text, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, text)
		}
	}
	// The output is valid restore input.
	if err := iptmodel.New().Restore([]byte(text), true); err != nil {
		t.Errorf("dry run output does not restore: %v", err)
	}
}

func TestLocalAddressFailureKeepsLastKnown(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, func(o *Options) {
		o.Rules.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.50.0/24")}
	})
	w.set("web", 1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	w.mustSync(false)
	w.host.AddrErr = errors.New("netlink dump interrupted")
	w.mustSync(true)
	if !strings.Contains(w.ipt.Dump(), "-A KPROXY-SERVICES -d 192.168.50.1/32 -j KPROXY-NODEPORTS") {
		t.Errorf("NodePort jump for the node IP lost:\n%s", w.ipt.Dump())
	}
}

func TestChooseFlavour(t *testing.T) {
	rulesOf := func(n int) []byte {
		return []byte("# Generated\n*nat\n" + strings.Repeat("-A PREROUTING -j ACCEPT\n", n) + "COMMIT\n")
	}
	tests := []struct {
		name string
		p    FlavourProbe
		want Flavour
		err  bool
	}{
		{name: "no tools", err: true},
		{name: "only legacy", p: FlavourProbe{LegacyOK: true}, want: FlavourLegacy},
		{name: "only nft", p: FlavourProbe{NFTOK: true}, want: FlavourNFT},
		{name: "legacy has rules", p: FlavourProbe{LegacyOK: true, NFTOK: true, LegacySave: rulesOf(3), NFTSave: rulesOf(1), SystemDefault: FlavourNFT}, want: FlavourLegacy},
		{name: "nft has rules", p: FlavourProbe{LegacyOK: true, NFTOK: true, LegacySave: rulesOf(0), NFTSave: rulesOf(2), SystemDefault: FlavourLegacy}, want: FlavourNFT},
		{name: "tie: system default", p: FlavourProbe{LegacyOK: true, NFTOK: true, SystemDefault: FlavourLegacy}, want: FlavourLegacy},
		{name: "tie, no default: nft", p: FlavourProbe{LegacyOK: true, NFTOK: true}, want: FlavourNFT},
		{name: "kubelet hint in legacy", p: FlavourProbe{LegacyOK: true, NFTOK: true, LegacyHint: true, NFTSave: rulesOf(9)}, want: FlavourLegacy},
		{name: "kubelet hint in nft", p: FlavourProbe{LegacyOK: true, NFTOK: true, NFTHint: true, LegacySave: rulesOf(9)}, want: FlavourNFT},
		{name: "hints in both: rules decide", p: FlavourProbe{LegacyOK: true, NFTOK: true, LegacyHint: true, NFTHint: true, LegacySave: rulesOf(2)}, want: FlavourLegacy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseFlavour(tc.p)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ChooseFlavour = %q, %v; want %q (error %v)", got, err, tc.want, tc.err)
			}
		})
	}
}

func buildSnapshot(node *v1.Node, svcs []*v1.Service, slices []*discovery.EndpointSlice) *proxy.Snapshot {
	return cache.Build(proxytest.Node1, node, svcs, slices)
}

func nsName(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// TestTakeOverFailureNeverBlocksSync checks that a take-over the kernel
// refuses leaves kproxy's rules programmed, and is retried later.
func TestTakeOverFailureNeverBlocksSync(t *testing.T) {
	w := newWorld(t, v1.IPv4Protocol, nil)
	if err := w.ipt.Rules.Restore([]byte(upstreamRules), true); err != nil {
		t.Fatal(err)
	}
	w.set("web", 1, proxytest.Ready(proxytest.PodA1))
	w.ipt.FailNext["Restore"] = errors.New("rule in use")
	w.mustSync(false)
	w.checkMatchesFullPlan()
	if !strings.Contains(w.ipt.Dump(), "KUBE-SERVICES") {
		t.Fatal("the failed take-over removed kube-proxy's rules anyway")
	}
	w.mustSync(true)
	if strings.Contains(w.ipt.Dump(), "KUBE-SERVICES") {
		t.Error("the next full sync did not take over")
	}
	w.checkMatchesFullPlan()
}

// recordingMetrics records what the backend reports.
type recordingMetrics struct {
	restoreFailed map[bool]int
	rules         map[string][2]int
	conntrack     int
	// conntrackFailed counts failed cleanup rounds.
	conntrackFailed int
}

func (m *recordingMetrics) RestoreFailed(partial bool) { m.restoreFailed[partial]++ }
func (m *recordingMetrics) Rules(table string, total, written int) {
	m.rules[table] = [2]int{total, written}
}
func (m *recordingMetrics) Conntrack(n int, _ time.Duration, failed bool) {
	m.conntrack += n
	if failed {
		m.conntrackFailed++
	}
}

func TestSyncReportsMetrics(t *testing.T) {
	m := &recordingMetrics{restoreFailed: map[bool]int{}, rules: map[string][2]int{}}
	w := newWorld(t, v1.IPv4Protocol, func(o *Options) { o.Metrics = m })
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1), proxytest.WithNodePort())
	w.mustSync(false)
	st := w.b.Last().Stats
	nat, filter := m.rules["nat"], m.rules["filter"]
	if nat[0]+filter[0] != st.Rules || filter[0] == 0 || nat[0] == 0 {
		t.Errorf("rules nat %v filter %v, stats %+v", nat, filter, st)
	}
	if nat[1] != nat[0] || filter[1] != filter[0] {
		t.Errorf("the first sync wrote nat %v filter %v, want everything", nat, filter)
	}
	// Count the kernel's own view: iptables-save lines of kproxy's chains.
	save := w.ipt.Dump()
	if got := strings.Count(save, "\n-A KPROXY-"); got != st.Rules {
		t.Errorf("kernel holds %d kproxy rules, metrics say %d", got, st.Rules)
	}

	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1, proxytest.PodB2), proxytest.WithNodePort())
	w.ipt.FailNext["Restore"] = errors.New("xtables lock busy")
	w.mustSync(false)
	if m.restoreFailed[true] != 1 || m.restoreFailed[false] != 0 {
		t.Errorf("restore failures %v, want one partial", m.restoreFailed)
	}
	w.set("web", 1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	w.ipt.FailNext["Restore"] = errors.New("xtables lock busy")
	w.b.needFull = true
	if _, err := w.sync(false); err == nil {
		t.Fatal("full sync with a failing restore succeeded")
	}
	if m.restoreFailed[false] != 1 {
		t.Errorf("restore failures %v, want one full", m.restoreFailed)
	}
}
