package iptables

import (
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/linux/trace"
)

// kernel applies a plan to an in-memory ruleset the way the applier applies
// it to the kernel: the restore input, then the jump rules.
func kernel(t testing.TB, rs *iptmodel.Ruleset, plan *Plan) {
	t.Helper()
	if err := rs.Restore(plan.Restore, true); err != nil {
		t.Fatalf("restore: %v\n%s", err, plan.Restore)
	}
	for i := len(plan.Jumps) - 1; i >= 0; i-- {
		j := plan.Jumps[i]
		ok, err := rs.Exists(j.Table, j.Chain, j.Spec...)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if err := rs.Insert(j.Table, j.Chain, 1, j.Spec...); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Addresses of the traced topology: node1 runs kproxy; pods of node1 are in
// 10.244.1.0/24, of node2 in 10.244.2.0/24; the outside client is on the
// node network.
var (
	podLocal   = "10.244.1.5" // endpoint on node1
	podRemote1 = "10.244.2.5"
	podRemote2 = "10.244.2.6"
	clientPod  = a("10.244.1.9")
	outside    = a("192.168.50.100")
	lbIP       = "203.0.113.10"
	extIP      = "198.51.100.7"
)

type client struct {
	name  string
	src   netip.Addr
	local bool
}

var (
	fromPod     = client{"pod", clientPod, false}
	fromNode    = client{"node", node1IP, true}
	fromOutside = client{"outside", outside, false}
	fromSelf    = client{"hairpin", a(podLocal), false}
)

// expectation: the endpoints that may answer (each with equal probability),
// or a verdict.
type expect struct {
	eps     []string // "ip:port"; empty means no DNAT
	masq    bool
	verdict trace.Verdict
}

func answer(masq bool, eps ...string) expect {
	if len(eps) == 0 {
		return expect{masq: masq, verdict: trace.VerdictAccept}
	}
	return expect{eps: eps, masq: masq, verdict: trace.VerdictDNAT}
}

var (
	rejected = expect{verdict: trace.VerdictReject}
	dropped  = expect{verdict: trace.VerdictDrop}
)

type probe struct {
	from  client
	dst   string // ip:port
	proto string
	want  expect
}

func tracePlan(t *testing.T, cfg facts.Config, v *proxy.FamilyView, forwardDrop bool) (*iptmodel.Ruleset, trace.Host) {
	t.Helper()
	p := mustPlanner(t, cfg)
	in := fullInput(v)
	plan := planned(p, in)
	for _, pr := range problems(plan) {
		if pr.Reason != intent.ReasonFrontendConflict {
			t.Fatalf("problems: %v", problems(plan))
		}
	}
	rs := iptmodel.New()
	if forwardDrop {
		if err := rs.Restore([]byte("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n"), true); err != nil {
			t.Fatal(err)
		}
	}
	kernel(t, rs, plan)
	var local []netip.Addr
	local = append(local, in.LocalAddrs...)
	return rs, trace.Host{LocalAddrs: local}
}

func checkProbe(t *testing.T, rs *iptmodel.Ruleset, h trace.Host, pr probe) {
	t.Helper()
	dst := netip.MustParseAddrPort(pr.dst)
	proto := pr.proto
	if proto == "" {
		proto = "tcp"
	}
	pkt := trace.Packet{Src: pr.from.src, Dst: dst.Addr(), Proto: proto, SrcPort: 40000, DstPort: dst.Port(), Local: pr.from.local}
	outs, err := rs.Trace(h, pkt)
	if err != nil {
		t.Fatalf("%s: %v", pkt, err)
	}
	var total float64
	got := map[string]float64{}
	for _, o := range outs {
		total += o.Probability
		if o.Verdict != pr.want.verdict {
			t.Errorf("%s: outcome %v, want verdict %s (path %s)", pkt, o, pr.want.verdict, strings.Join(o.Path, " "))
			continue
		}
		if o.Verdict != trace.VerdictAccept && o.Verdict != trace.VerdictDNAT {
			continue
		}
		if o.Masquerade != pr.want.masq {
			t.Errorf("%s: outcome %v, want masquerade %v (path %s)", pkt, o, pr.want.masq, strings.Join(o.Path, " "))
		}
		if o.DNAT {
			got[o.Dst.String()] += o.Probability
		} else {
			got["none"] += o.Probability
		}
	}
	if math.Abs(total-1) > 1e-6 {
		t.Errorf("%s: probabilities sum to %v", pkt, total)
	}
	if pr.want.verdict != trace.VerdictAccept && pr.want.verdict != trace.VerdictDNAT {
		return
	}
	want := map[string]float64{}
	for _, e := range pr.want.eps {
		want[e] = 1 / float64(len(pr.want.eps))
	}
	if len(pr.want.eps) == 0 {
		want["none"] = 1
	}
	for k, p := range want {
		if math.Abs(got[k]-p) > 1e-6 {
			t.Errorf("%s: got destinations %v, want %v", pkt, fmtDist(got), fmtDist(want))
			return
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: got destinations %v, want %v", pkt, fmtDist(got), fmtDist(want))
	}
}

func fmtDist(m map[string]float64) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.3f", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// TestTraceSemantics follows packets through the generated rules (in the
// in-memory model) for every Service semantic kproxy implements.
func TestTraceSemantics(t *testing.T) {
	all := []string{podLocal + ":8080", podRemote1 + ":8080", podRemote2 + ":8080"}
	eps := []proxy.Endpoint{ep(podLocal, 8080, true), ep(podRemote1, 8080, false), ep(podRemote2, 8080, false)}
	remoteOnly := []proxy.Endpoint{ep(podRemote1, 8080, false), ep(podRemote2, 8080, false)}
	np := func(port int) string { return fmt.Sprintf("%s:%d", node1IP, port) }

	tests := []struct {
		name        string
		cfg         func(*facts.Config)
		port        *proxy.ServicePort
		forwardDrop bool
		probes      []probe
	}{
		{
			name: "ClusterIP",
			port: svc("ns/web", "10.96.0.10", 80, v1.ProtocolTCP, withEndpoints(eps...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.10:80", want: answer(false, all...)},
				{from: fromNode, dst: "10.96.0.10:80", want: answer(true, all...)},
				{from: fromOutside, dst: "10.96.0.10:80", want: answer(true, all...)},
				{from: fromPod, dst: "10.96.0.10:81", want: answer(false)},
				{from: fromPod, dst: "10.96.0.10:80", proto: "udp", want: answer(false)},
			},
		},
		{
			name:        "ClusterIP with FORWARD policy DROP",
			port:        svc("ns/web", "10.96.0.10", 80, v1.ProtocolTCP, withEndpoints(eps...)),
			forwardDrop: true,
			probes: []probe{
				{from: fromPod, dst: "10.96.0.10:80", want: answer(false, all...)},
				{from: fromOutside, dst: "10.96.0.10:80", want: answer(true, all...)},
				{from: fromPod, dst: "10.244.2.5:8080", want: dropped}, // not service traffic
			},
		},
		{
			name: "UDP ClusterIP",
			port: svc("ns/dns", "10.96.0.53", 53, v1.ProtocolUDP, withEndpoints(ep(podRemote1, 5353, false))),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.53:53", proto: "udp", want: answer(false, podRemote1+":5353")},
				{from: fromPod, dst: "10.96.0.53:53", proto: "tcp", want: answer(false)},
			},
		},
		{
			name: "masqueradeAll",
			cfg:  func(c *facts.Config) { c.MasqueradeAll = true },
			port: svc("ns/web", "10.96.0.10", 80, v1.ProtocolTCP, withEndpoints(eps...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.10:80", want: answer(true, all...)},
			},
		},
		{
			name: "no cluster CIDR: only hairpin and external traffic is masqueraded",
			cfg:  func(c *facts.Config) { c.ClusterCIDRs = nil },
			port: svc("ns/web", "10.96.0.10", 80, v1.ProtocolTCP, withNodePort(30080), withEndpoints(eps...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.10:80", want: answer(false, all...)},
				{from: fromNode, dst: "10.96.0.10:80", want: answer(false, all...)},
				{from: fromOutside, dst: np(30080), want: answer(true, all...)},
			},
		},
		{
			name: "two cluster CIDRs",
			cfg: func(c *facts.Config) {
				c.ClusterCIDRs = append(c.ClusterCIDRs, netip.MustParsePrefix("10.245.0.0/16"), netip.MustParsePrefix("fd00::/64"))
			},
			port: svc("ns/web", "10.96.0.10", 80, v1.ProtocolTCP, withEndpoints(eps...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.10:80", want: answer(false, all...)},
				{from: client{"pod2", a("10.245.0.9"), false}, dst: "10.96.0.10:80", want: answer(false, all...)},
				{from: fromOutside, dst: "10.96.0.10:80", want: answer(true, all...)},
			},
		},
		{
			name: "hairpin",
			port: svc("ns/self", "10.96.0.11", 80, v1.ProtocolTCP, withEndpoints(ep(podLocal, 8080, true))),
			probes: []probe{
				{from: fromSelf, dst: "10.96.0.11:80", want: answer(true, podLocal+":8080")},
				{from: fromPod, dst: "10.96.0.11:80", want: answer(false, podLocal+":8080")},
			},
		},
		{
			name: "NodePort",
			port: svc("ns/np", "10.96.0.12", 80, v1.ProtocolTCP, withNodePort(30080), withEndpoints(eps...)),
			probes: []probe{
				{from: fromOutside, dst: np(30080), want: answer(true, all...)},
				{from: fromPod, dst: np(30080), want: answer(true, all...)},
				{from: fromNode, dst: np(30080), want: answer(true, all...)},
				{from: fromNode, dst: "127.0.0.1:30080", want: answer(true, all...)},
				{from: fromOutside, dst: np(30081), want: answer(false)},
				{from: fromOutside, dst: "192.168.50.2:30080", want: answer(false)}, // not our address
			},
		},
		{
			name: "NodePort without localhost NodePorts",
			cfg:  func(c *facts.Config) { c.LocalhostNodePorts = false },
			port: svc("ns/np", "10.96.0.12", 80, v1.ProtocolTCP, withNodePort(30080), withEndpoints(eps...)),
			probes: []probe{
				{from: fromNode, dst: "127.0.0.1:30080", want: answer(false)},
				{from: fromOutside, dst: np(30080), want: answer(true, all...)},
			},
		},
		{
			name: "NodePort on --nodeport-addresses only",
			cfg: func(c *facts.Config) {
				c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
				c.NodePortPrimary = true
			},
			port: svc("ns/np", "10.96.0.12", 80, v1.ProtocolTCP, withNodePort(30080), withEndpoints(eps...)),
			probes: []probe{
				{from: fromOutside, dst: np(30080), want: answer(true, all...)}, // primary
				{from: fromNode, dst: "127.0.0.1:30080", want: answer(false)},
			},
		},
		{
			name: "externalIP",
			port: svc("ns/ext", "10.96.0.13", 80, v1.ProtocolTCP, withExternalIPs(extIP), withEndpoints(eps...)),
			probes: []probe{
				{from: fromOutside, dst: extIP + ":80", want: answer(true, all...)},
				{from: fromPod, dst: extIP + ":80", want: answer(true, all...)},
				{from: fromOutside, dst: extIP + ":81", want: answer(false)},
			},
		},
		{
			name: "LoadBalancer with source ranges",
			port: svc("ns/lb", "10.96.0.14", 80, v1.ProtocolTCP, withNodePort(30081), withLB(lbIP), withSourceRanges("192.168.50.0/24", "fd00::/8"), withEndpoints(eps...)),
			probes: []probe{
				{from: fromOutside, dst: lbIP + ":80", want: answer(true, all...)},
				{from: fromPod, dst: lbIP + ":80", want: dropped},
				{from: client{"other", a("203.0.113.99"), false}, dst: lbIP + ":80", want: dropped},
				{from: client{"lb-self", a(lbIP), false}, dst: lbIP + ":80", want: answer(true, all...)},
				{from: client{"other", a("203.0.113.99"), false}, dst: np(30081), want: answer(true, all...)},
			},
		},
		{
			name: "externalTrafficPolicy Local",
			port: svc("ns/local", "10.96.0.15", 80, v1.ProtocolTCP, withNodePort(30082), withLB(lbIP), withETPLocal(), withEndpoints(eps...)),
			probes: []probe{
				{from: fromOutside, dst: np(30082), want: answer(false, podLocal+":8080")},
				{from: fromOutside, dst: lbIP + ":80", want: answer(false, podLocal+":8080")},
				{from: fromPod, dst: lbIP + ":80", want: answer(false, all...)},
				{from: fromNode, dst: np(30082), want: answer(true, all...)},
				{from: fromNode, dst: "127.0.0.1:30082", want: answer(true, all...)},
				{from: fromPod, dst: "10.96.0.15:80", want: answer(false, all...)},
			},
		},
		{
			name: "externalTrafficPolicy Local without local endpoints",
			port: svc("ns/local", "10.96.0.15", 80, v1.ProtocolTCP, withNodePort(30082), withLB(lbIP), withETPLocal(), withEndpoints(remoteOnly...)),
			probes: []probe{
				{from: fromOutside, dst: np(30082), want: dropped},
				{from: fromOutside, dst: lbIP + ":80", want: dropped},
				{from: fromPod, dst: lbIP + ":80", want: answer(false, podRemote1+":8080", podRemote2+":8080")},
				{from: fromNode, dst: np(30082), want: answer(true, podRemote1+":8080", podRemote2+":8080")},
			},
		},
		{
			name: "externalTrafficPolicy Local without cluster CIDR",
			cfg:  func(c *facts.Config) { c.ClusterCIDRs = nil },
			port: svc("ns/local", "10.96.0.15", 80, v1.ProtocolTCP, withNodePort(30082), withETPLocal(), withEndpoints(eps...)),
			probes: []probe{
				{from: fromOutside, dst: np(30082), want: answer(false, podLocal+":8080")},
				{from: fromPod, dst: np(30082), want: answer(false, podLocal+":8080")},
				{from: fromNode, dst: np(30082), want: answer(true, all...)},
			},
		},
		{
			name: "internalTrafficPolicy Local",
			port: svc("ns/itp", "10.96.0.16", 80, v1.ProtocolTCP, withITPLocal(), withNodePort(30083), withEndpoints(eps...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.16:80", want: answer(false, podLocal+":8080")},
				{from: fromNode, dst: "10.96.0.16:80", want: answer(true, podLocal+":8080")},
				{from: fromOutside, dst: np(30083), want: answer(true, all...)},
			},
		},
		{
			name: "internalTrafficPolicy Local without local endpoints",
			port: svc("ns/itp", "10.96.0.16", 80, v1.ProtocolTCP, withITPLocal(), withEndpoints(remoteOnly...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.16:80", want: dropped},
			},
		},
		{
			name: "both policies Local",
			port: svc("ns/both", "10.96.0.17", 80, v1.ProtocolTCP, withITPLocal(), withNodePort(30084), withETPLocal(), withEndpoints(eps...)),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.17:80", want: answer(false, podLocal+":8080")},
				{from: fromOutside, dst: np(30084), want: answer(false, podLocal+":8080")},
				// In-cluster clients of the NodePort short-circuit to
				// every endpoint, as with internalTrafficPolicy Cluster.
				{from: fromNode, dst: np(30084), want: answer(true, all...)},
				{from: fromPod, dst: np(30084), want: answer(false, all...)},
			},
		},
		{
			name: "no endpoints",
			port: svc("ns/empty", "10.96.0.18", 80, v1.ProtocolTCP, withNodePort(30085), withExternalIPs(extIP), withLB(lbIP), withSourceRanges("192.168.50.0/24")),
			probes: []probe{
				{from: fromPod, dst: "10.96.0.18:80", want: rejected},
				{from: fromNode, dst: "10.96.0.18:80", want: rejected},
				{from: fromOutside, dst: np(30085), want: rejected},
				{from: fromNode, dst: "127.0.0.1:30085", want: rejected},
				{from: fromOutside, dst: extIP + ":80", want: rejected},
				{from: fromOutside, dst: lbIP + ":80", want: rejected},
				{from: fromPod, dst: "10.96.0.18:80", proto: "udp", want: answer(false)},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(v1.IPv4Protocol)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			rs, h := tracePlan(t, cfg, view(v1.IPv4Protocol, tc.port), tc.forwardDrop)
			for _, pr := range tc.probes {
				t.Run(pr.from.name+"->"+pr.dst, func(t *testing.T) { checkProbe(t, rs, h, pr) })
			}
		})
	}
}

// TestTraceAffinity checks that a client the recent list knows keeps its
// endpoint, and that a new client is recorded in the list of the endpoint it
// was sent to.
func TestTraceAffinity(t *testing.T) {
	eps := []proxy.Endpoint{ep(podLocal, 8080, true), ep(podRemote1, 8080, false), ep(podRemote2, 8080, false)}
	sp := svc("ns/sticky", "10.96.0.20", 80, v1.ProtocolTCP, withNodePort(30090), withETPLocal(), withAffinity(600), withEndpoints(eps...))
	rs, h := tracePlan(t, testConfig(v1.IPv4Protocol), view(v1.IPv4Protocol, sp), false)
	for _, dst := range []string{"10.96.0.20:80", node1IP.String() + ":30090"} {
		d := netip.MustParseAddrPort(dst)
		pkt := trace.Packet{Src: clientPod, Dst: d.Addr(), Proto: "tcp", SrcPort: 40000, DstPort: d.Port()}
		first, err := rs.Trace(h, pkt)
		if err != nil {
			t.Fatal(err)
		}
		if len(first) != 3 {
			t.Fatalf("%s: first connection outcomes %v, want 3", dst, first)
		}
		for _, o := range first {
			if len(o.AffinitySets) != 1 {
				t.Fatalf("%s: outcome %v recorded in %v, want one list", dst, o, o.AffinitySets)
			}
			// The same client again: always the same endpoint.
			h2 := h
			h2.AffinityHit = map[string]bool{o.AffinitySets[0]: true}
			again, err := rs.Trace(h2, pkt)
			if err != nil {
				t.Fatal(err)
			}
			if len(again) != 1 || again[0].Dst != o.Dst {
				t.Errorf("%s: known client went to %v, want only %s", dst, again, o.Dst)
			}
		}
	}
}

// TestTraceIPv6 checks the IPv6 rendering with the same model.
func TestTraceIPv6(t *testing.T) {
	eps := []proxy.Endpoint{ep("fd00:10:1::5", 8080, true), ep("fd00:10:2::5", 8080, false)}
	sp := svc("ns/web6", "fd00:96::10", 80, v1.ProtocolTCP, withNodePort(30080), withEndpoints(eps...))
	empty := svc("ns/empty6", "fd00:96::11", 80, v1.ProtocolTCP)
	rs, h := tracePlan(t, testConfig(v1.IPv6Protocol), view(v1.IPv6Protocol, sp, empty), true)
	all := []string{"[fd00:10:1::5]:8080", "[fd00:10:2::5]:8080"}
	pod6 := client{"pod", a("fd00:10:1::9"), false}
	for _, pr := range []probe{
		{from: pod6, dst: "[fd00:96::10]:80", want: answer(false, all...)},
		{from: client{"node", node1IP6, true}, dst: "[fd00:96::10]:80", want: answer(true, all...)},
		{from: client{"outside", a("fd00:50::100"), false}, dst: "[fd00:50::1]:30080", want: answer(true, all...)},
		{from: client{"node", node1IP6, true}, dst: "[::1]:30080", want: answer(false)},
		{from: pod6, dst: "[fd00:96::11]:80", want: rejected},
	} {
		checkProbe(t, rs, h, pr)
	}
}

// TestClusterIPNeverShadowed: even when an external frontend equal to
// another Service's ClusterIP reaches the intent (the cache leaves such
// frontends out), the ClusterIP keeps going to its own Service, flat and
// sharded alike: the intent gives the frontend to the ClusterIP (reported
// as a FrontendConflict), and the ClusterIP's dispatch entry comes first
// anyway.
func TestClusterIPNeverShadowed(t *testing.T) {
	for _, threshold := range []int{1000, 1} {
		t.Run(fmt.Sprintf("shard-threshold-%d", threshold), func(t *testing.T) {
			term := svc("default/term", "10.96.0.60", 80, v1.ProtocolTCP, withEndpoints(ep(podRemote1, 8080, false)))
			// Sorted before default/term: first in a name-ordered dispatch.
			evil := svc("aaa/evil", "10.96.0.61", 80, v1.ProtocolTCP, withEndpoints(ep(podRemote2, 9999, false)), withExternalIPs("10.96.0.60"))
			cfg := testConfig(v1.IPv4Protocol)
			cfg.ShardThreshold = threshold
			rs, h := tracePlan(t, cfg, view(v1.IPv4Protocol, term, evil), false)
			for _, from := range []client{fromPod, fromNode, fromOutside} {
				checkProbe(t, rs, h, probe{from: from, dst: "10.96.0.60:80", want: answer(from != fromPod, podRemote1+":8080")})
			}
		})
	}
}
