package iptables

import (
	"fmt"
	"math/rand"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
)

// randomPort builds a service port with random features.
func randomPort(rng *rand.Rand, i int, fam v1.IPFamily) *proxy.ServicePort {
	ip := func(base string, n int) string {
		if fam == v1.IPv6Protocol {
			return fmt.Sprintf("%s%x", base, n)
		}
		return fmt.Sprintf("%s%d.%d", base, n/250, n%250+1)
	}
	cip, eipBase, lbBase, podBase := "10.96.", "198.51.", "203.0.", "10.244."
	if fam == v1.IPv6Protocol {
		cip, eipBase, lbBase, podBase = "fd00:96::", "fd00:198::", "fd00:203::", "fd00:10:1::"
	}
	proto := []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}[rng.Intn(3)]
	var opts []spOpt
	if rng.Intn(3) == 0 {
		opts = append(opts, withNodePort(int32(30000+rng.Intn(2700))))
	}
	if rng.Intn(5) == 0 {
		opts = append(opts, withExternalIPs(ip(eipBase, rng.Intn(50))))
	}
	if rng.Intn(5) == 0 {
		opts = append(opts, withLB(ip(lbBase, rng.Intn(50))))
		if rng.Intn(2) == 0 {
			if fam == v1.IPv6Protocol {
				opts = append(opts, withSourceRanges("fd00:50::/64"))
			} else {
				opts = append(opts, withSourceRanges("192.168.50.0/24"))
			}
		}
	}
	if rng.Intn(6) == 0 {
		opts = append(opts, withAffinity(int32(60+rng.Intn(100))))
	}
	if rng.Intn(6) == 0 {
		opts = append(opts, withITPLocal())
	}
	if rng.Intn(4) == 0 {
		opts = append(opts, withETPLocal())
	}
	if rng.Intn(8) == 0 {
		opts = append(opts, withHealthCheck(int32(32000+rng.Intn(10))))
	}
	var eps []proxy.Endpoint
	for j, n := 0, rng.Intn(5); j < n; j++ {
		eps = append(eps, ep(ip(podBase, rng.Intn(40)), 8080, rng.Intn(3) == 0))
	}
	proxy.SortEndpoints(eps)
	eps = dedupe(eps)
	opts = append(opts, withEndpoints(eps...))
	sp := svc(fmt.Sprintf("ns%d/svc%d", i%7, i), ip(cip, i), int32(80+rng.Intn(3)), proto, opts...)
	return sp
}

func dedupe(eps []proxy.Endpoint) []proxy.Endpoint {
	var out []proxy.Endpoint
	for i, e := range eps {
		if i > 0 && e.AddrPort() == eps[i-1].AddrPort() {
			continue
		}
		out = append(out, e)
	}
	return out
}

func saveAll(rs *iptmodel.Ruleset) string { return rs.Save("nat") + rs.Save("filter") }

// TestPartialEqualsFull drives a planner through random changes with partial
// plans and checks after every step that the in-memory kernel holds exactly
// what a fresh full plan produces. Small shard thresholds make the dispatch
// chains go back and forth between flat and sharded.
func TestPartialEqualsFull(t *testing.T) {
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(fam), func(t *testing.T) {
			rng := rand.New(rand.NewSource(7))
			cfg := testConfig(fam)
			cfg.ShardThreshold = 24
			inc := mustPlanner(t, cfg)
			rs := iptmodel.New()
			ports := map[proxy.ServicePortName]*proxy.ServicePort{}
			next := 0
			node, local := nodeFor(fam)
			for i := 0; i < 20; i++ {
				sp := randomPort(rng, next, fam)
				next++
				ports[sp.Name] = sp
			}
			in := testInput{View: proxy.NewFamilyView(fam, clone(ports)), Node: node, LocalAddrs: local, Changes: proxy.Changes{Full: true}}
			kernel(t, rs, planned(inc, in))
			for step := 0; step < 100; step++ {
				ch := proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{}}
				for k := rng.Intn(4); k >= 0; k-- {
					switch op := rng.Intn(10); {
					case op < 4 || len(ports) < 5: // add
						sp := randomPort(rng, next, fam)
						next++
						ports[sp.Name] = sp
						ch.Ports[sp.Name] = struct{}{}
					case op < 6: // delete
						for n := range ports {
							delete(ports, n)
							ch.Ports[n] = struct{}{}
							break
						}
					default: // replace (new endpoints, new features, same name and IP)
						for n, old := range ports {
							sp := randomPort(rng, 0, fam)
							sp.Name, sp.ClusterIP = n, old.ClusterIP
							ports[n] = sp
							ch.Ports[n] = struct{}{}
							break
						}
					}
				}
				if rng.Intn(20) == 0 {
					// The node gains or loses an address.
					if len(local) == 2 {
						local = append(local, a(map[v1.IPFamily]string{v1.IPv4Protocol: "192.168.50.9", v1.IPv6Protocol: "fd00:50::9"}[fam]))
					} else {
						local = local[:2]
					}
					ch.Node = true
				}
				in := testInput{View: proxy.NewFamilyView(fam, clone(ports)), Node: node, LocalAddrs: local, Changes: ch}
				plan := planned(inc, in)
				kernel(t, rs, plan)

				fresh := mustPlanner(t, cfg)
				want := iptmodel.New()
				in.Changes = proxy.Changes{Full: true}
				kernel(t, want, planned(fresh, in))
				if got, exp := saveAll(rs), saveAll(want); got != exp {
					t.Fatalf("step %d: partial syncs diverged from a full sync:\n%s\nlast plan:\n%s", step, diff(exp, got), plan.Restore)
				}
				if plan.Stats.Chains != countChains(rs) || plan.Stats.Rules != countRules(rs) {
					t.Fatalf("step %d: stats say %d chains %d rules, kernel has %d chains %d rules",
						step, plan.Stats.Chains, plan.Stats.Rules, countChains(rs), countRules(rs))
				}
			}
		})
	}
}

func clone(m map[proxy.ServicePortName]*proxy.ServicePort) map[proxy.ServicePortName]*proxy.ServicePort {
	out := make(map[proxy.ServicePortName]*proxy.ServicePort, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func countChains(rs *iptmodel.Ruleset) int {
	n := 0
	for _, t := range []string{"nat", "filter"} {
		for _, c := range rs.Table(t).ChainNames() {
			if Owned(c) {
				n++
			}
		}
	}
	return n
}

func countRules(rs *iptmodel.Ruleset) int {
	n := 0
	for _, t := range []string{"nat", "filter"} {
		tb := rs.Table(t)
		for _, c := range tb.ChainNames() {
			if Owned(c) {
				n += len(tb.Chain(c).Rules)
			}
		}
	}
	return n
}

// TestPartialWritesOnlyWhatChanged checks the size of partial plans.
func TestPartialWritesOnlyWhatChanged(t *testing.T) {
	cfg := testConfig(v1.IPv4Protocol)
	cfg.ShardThreshold = 50
	p := mustPlanner(t, cfg)
	ports := map[proxy.ServicePortName]*proxy.ServicePort{}
	var names []proxy.ServicePortName
	for i := 0; i < 200; i++ {
		sp := svc(fmt.Sprintf("ns/s%d", i), fmt.Sprintf("10.96.%d.%d", i/200, i%200+1), 80, v1.ProtocolTCP,
			withEndpoints(ep(fmt.Sprintf("10.244.2.%d", i%200+1), 8080, false), ep(fmt.Sprintf("10.244.3.%d", i%200+1), 8080, false)))
		ports[sp.Name] = sp
		names = append(names, sp.Name)
	}
	node, local := nodeFor(v1.IPv4Protocol)
	in := testInput{View: proxy.NewFamilyView(v1.IPv4Protocol, clone(ports)), Node: node, LocalAddrs: local, Changes: proxy.Changes{Full: true}}
	full := planned(p, in)
	if full.Stats.WrittenChains != full.Stats.Chains {
		t.Errorf("full plan wrote %d of %d chains", full.Stats.WrittenChains, full.Stats.Chains)
	}

	newName := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "new"}, Port: "p", Protocol: v1.ProtocolTCP}
	tests := []struct {
		name       string
		mutate     func()
		changes    []proxy.ServicePortName
		wantChains []string // prefixes of the chains written, in order
		wantDelete int
	}{
		{
			name: "nothing changed",
		},
		{
			name:    "an unchanged port reported as changed",
			changes: names[:1],
		},
		{
			name: "one endpoint added",
			mutate: func() {
				old := ports[names[3]]
				sp := *old
				sp.ClusterEndpoints = append(append([]proxy.Endpoint{}, old.ClusterEndpoints...), ep("10.244.9.9", 8080, false))
				ports[names[3]] = &sp
			},
			changes:    names[3:4],
			wantChains: []string{"KPROXY-SVC-"},
		},
		{
			name: "a service added",
			mutate: func() {
				sp := svc("ns/new", "10.96.7.250", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 8080, false)))
				ports[sp.Name] = sp
			},
			changes:    []proxy.ServicePortName{newName},
			wantChains: []string{"KPROXY-SERVICES", "KPROXY-SVC-", "KPROXY-SH-FA"},
		},
		{
			name: "a service removed",
			mutate: func() {
				delete(ports, newName)
			},
			changes:    []proxy.ServicePortName{newName},
			wantChains: []string{"KPROXY-SERVICES"},
			wantDelete: 2, // its chain and its (now empty) shard
		},
		{
			name: "a local endpoint appears (hairpin)",
			mutate: func() {
				old := ports[names[5]]
				sp := *old
				sp.ClusterEndpoints = []proxy.Endpoint{ep("10.244.1.77", 8080, true)}
				ports[names[5]] = &sp
			},
			changes:    names[5:6],
			wantChains: []string{"KPROXY-HAIRPIN", "KPROXY-SVC-"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mutate != nil {
				tc.mutate()
			}
			in := testInput{View: proxy.NewFamilyView(v1.IPv4Protocol, clone(ports)), Node: node, LocalAddrs: local, Changes: changed(tc.changes...)}
			plan := planned(p, in)
			var written []string
			for _, line := range strings.Split(string(plan.Restore), "\n") {
				if strings.HasPrefix(line, ":") {
					written = append(written, strings.Fields(line[1:])[0])
				}
			}
			written = written[:len(written)-plan.Stats.DeletedChains]
			if len(written) != len(tc.wantChains) {
				t.Fatalf("wrote chains %v, want %v\n%s", written, tc.wantChains, plan.Restore)
			}
			for i, w := range tc.wantChains {
				if !strings.HasPrefix(written[i], w) {
					t.Errorf("chain %d written is %s, want %s*", i, written[i], w)
				}
			}
			if plan.Stats.DeletedChains != tc.wantDelete {
				t.Errorf("deleted %d chains, want %d", plan.Stats.DeletedChains, tc.wantDelete)
			}
			if len(tc.wantChains) == 0 && len(plan.Restore) != 0 {
				t.Errorf("restore input for no change:\n%s", plan.Restore)
			}
		})
	}
}

// TestFullDeletesStaleChains checks that a full plan deletes the kproxy
// chains the kernel has and the plan does not need, and nothing else.
func TestFullDeletesStaleChains(t *testing.T) {
	p := mustPlanner(t, testConfig(v1.IPv4Protocol))
	in := fullInput(view(v1.IPv4Protocol, svc("ns/a", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 80, false)))))
	in.Existing = map[string]map[string]uint64{
		"nat":    {"KPROXY-SVC-OLDOLDOLDOLDOLDO": 1, "KUBE-SERVICES": 2, "KPROXY-SERVICES": 3, "PREROUTING": 4},
		"filter": {"KPROXY-OLD": 5, "DOCKER": 6},
	}
	plan := planned(p, in)
	text := string(plan.Restore)
	for _, want := range []string{"-X KPROXY-SVC-OLDOLDOLDOLDOLDO\n", "-X KPROXY-OLD\n", ":KPROXY-OLD - [0:0]\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("restore input lacks %q", want)
		}
	}
	for _, never := range []string{"KUBE-SERVICES", "DOCKER", "-X KPROXY-SERVICES", "-X PREROUTING"} {
		if strings.Contains(text, never) {
			t.Errorf("restore input mentions %q", never)
		}
	}
	if plan.Stats.DeletedChains != 2 {
		t.Errorf("deleted %d chains, want 2", plan.Stats.DeletedChains)
	}
	// The stale chains apply cleanly on a kernel that has them.
	rs := iptmodel.New()
	if err := rs.Restore([]byte("*nat\n:KPROXY-SVC-OLDOLDOLDOLDOLDO - [0:0]\n-A KPROXY-SVC-OLDOLDOLDOLDOLDO -j RETURN\nCOMMIT\n*filter\n:KPROXY-OLD - [0:0]\nCOMMIT\n"), true); err != nil {
		t.Fatal(err)
	}
	kernel(t, rs, plan)
	if rs.Table("nat").Chain("KPROXY-SVC-OLDOLDOLDOLDOLDO") != nil || rs.Table("filter").Chain("KPROXY-OLD") != nil {
		t.Error("stale chains survived")
	}
}

// TestUncommittedPlanLeavesTheRecord checks the failure protocol: a plan
// that is not committed (its restore failed) leaves the planner's record
// as it was, and the next plan starts from there.
func TestUncommittedPlanLeavesTheRecord(t *testing.T) {
	p := mustPlanner(t, testConfig(v1.IPv4Protocol))
	v := view(v1.IPv4Protocol, svc("ns/a", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 80, false))))
	in := fullInput(v)
	p.Commit(p.planIn(in))
	in.Changes = proxy.Changes{}
	if plan := p.planIn(in); plan.Full || len(plan.Restore) != 0 {
		t.Fatalf("no-change plan: full=%v restore=%q", plan.Full, plan.Restore)
	}
	// A change planned but not applied...
	v2 := view(v1.IPv4Protocol, svc("ns/a", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.9", 80, false))))
	changed := proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{v2.Sorted()[0].Name: {}}}
	first := p.planIn(testInput{View: v2, Changes: changed})
	if first.Full || len(first.Restore) == 0 {
		t.Fatalf("change plan: full=%v restore=%q", first.Full, first.Restore)
	}
	// ...is planned again in full by the next plan (the record still
	// holds the old endpoint).
	again := p.planIn(testInput{View: v2, Changes: changed})
	if string(again.Restore) != string(first.Restore) {
		t.Fatalf("the uncommitted plan changed the record:\nfirst:\n%s\nagain:\n%s", first.Restore, again.Restore)
	}
	p.Commit(again)
	if plan := p.planIn(testInput{View: v2, Changes: changed}); len(plan.Restore) != 0 {
		t.Fatalf("after the commit the same change writes:\n%s", plan.Restore)
	}
}

// TestBadInputIsSkipped checks that a broken service port or endpoint is
// skipped with a message naming it, and the others are still rendered.
func TestBadInputIsSkipped(t *testing.T) {
	good := svc("ns/good", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 80, false)))
	wrongFamily := svc("ns/v6", "fd00::1", 80, v1.ProtocolTCP)
	badPort := svc("ns/badport", "10.96.0.2", 0, v1.ProtocolTCP)
	badProto := svc("ns/badproto", "10.96.0.3", 80, v1.Protocol("ICMP"))
	badEP := svc("ns/badep", "10.96.0.4", 80, v1.ProtocolTCP, withNodePort(70000), withExternalIPs("fd00::9"),
		withEndpoints(ep("10.244.2.2", 80, false), ep("fd00::2", 80, false), proxy.Endpoint{IP: a("10.244.2.3"), Port: 0}))
	noIP := svc("ns/noip", "10.96.0.5", 80, v1.ProtocolTCP)
	noIP.ClusterIP = netip.Addr{}
	v := view(v1.IPv4Protocol, good, wrongFamily, badPort, badProto, badEP, noIP)
	plan := planned(mustPlanner(t, testConfig(v1.IPv4Protocol)), fullInput(v))
	want := []string{
		"service port ns/badep:p: clusterEndpoints[1]",
		"service port ns/badep:p: clusterEndpoints[2]",
		"service port ns/badep:p: externalIPs[0]",
		"service port ns/badep:p: nodePort: 70000",
		"service port ns/badport:p: port",
		"service port ns/badproto:p: protocol",
		"service port ns/noip:p: clusterIP",
		"service port ns/v6:p: family",
	}
	var msgs []string
	for _, pr := range problems(plan) {
		msgs = append(msgs, pr.Message)
	}
	if len(msgs) != len(want) {
		t.Fatalf("problems:\n%s\nwant %d", strings.Join(msgs, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(msgs[i], w) {
			t.Errorf("problem %d = %q, want prefix %q", i, msgs[i], w)
		}
	}
	rs := iptmodel.New()
	kernel(t, rs, plan)
	text := saveAll(rs)
	for _, w := range []string{"10.96.0.1/32", "10.96.0.4/32", "--to-destination 10.244.2.2:80"} {
		if !strings.Contains(text, w) {
			t.Errorf("rules lack %q", w)
		}
	}
	for _, never := range []string{"fd00", "10.96.0.2/32", "10.96.0.3/32", "10.244.2.3", "70000"} {
		if strings.Contains(text, never) {
			t.Errorf("rules contain %q", never)
		}
	}
}

// TestTCPBeLiberalKeepsInvalidPackets: with conntrack.tcpBeLiberal, as
// upstream, the forward chain drops no INVALID packets; without it, it does.
func TestTCPBeLiberalKeepsInvalidPackets(t *testing.T) {
	const drop = "-m conntrack --ctstate INVALID -j DROP"
	v := view(v1.IPv4Protocol, svc("ns/a", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 80, false))))
	for _, liberal := range []bool{false, true} {
		cfg := testConfig(v1.IPv4Protocol)
		cfg.TCPBeLiberal = liberal
		got := strings.Contains(string(planned(mustPlanner(t, cfg), fullInput(v)).Restore), drop)
		if got == liberal {
			t.Errorf("tcpBeLiberal=%v: INVALID drop rule present = %v", liberal, got)
		}
	}
}
