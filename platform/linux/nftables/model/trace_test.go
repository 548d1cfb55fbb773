package model_test

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/trace"

	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// famAddrs are the addresses of the rich test ports of one family.
type famAddrs struct {
	fam                                   v1.IPFamily
	node, pod, outside, inRange, loopback netip.Addr
	podCIDR                               netip.Prefix
	ranges                                []netip.Prefix
	addr                                  func(kind, n int) netip.Addr
}

func addrsOf(fam v1.IPFamily) famAddrs {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	if fam == v1.IPv6Protocol {
		return famAddrs{fam: fam, node: a("fd00:50::10"), pod: a("fd00:10:244:1::77"), outside: a("2001:db8::9"), inRange: a("fd00:50::77"),
			loopback: a("::1"), podCIDR: p("fd00:10:244::/48"), ranges: []netip.Prefix{p("fd00:50::/64"), p("2001:db8:99::/64")},
			addr: func(kind, n int) netip.Addr {
				prefix := map[int]string{0: "fd00:10:96::", 1: "fd00:10:244:1::", 2: "fd00:10:244:2::", 3: "fd00:60::", 4: "fd00:70::"}[kind]
				return a(fmt.Sprintf("%s%x", prefix, n+1))
			}}
	}
	return famAddrs{fam: fam, node: a("192.168.50.10"), pod: a("10.244.1.77"), outside: a("203.0.113.9"), inRange: a("192.168.50.77"),
		loopback: a("127.0.0.1"), podCIDR: p("10.244.0.0/16"), ranges: []netip.Prefix{p("192.168.50.0/24"), p("198.51.100.0/24")},
		addr: func(kind, n int) netip.Addr {
			hi, lo := byte(n/250), byte(n%250+1)
			switch kind {
			case 0:
				return netip.AddrFrom4([4]byte{10, 96, hi, lo})
			case 1:
				return netip.AddrFrom4([4]byte{10, 244, 1 + 2*hi, lo})
			case 2:
				return netip.AddrFrom4([4]byte{10, 244, 2 + 2*hi, lo})
			case 3:
				return netip.AddrFrom4([4]byte{192, 168, 60 + hi, lo})
			}
			return netip.AddrFrom4([4]byte{192, 168, 70 + hi, lo})
		}}
}

// richPorts makes service ports of every kind the renderer distinguishes:
// each algorithm with and without affinity, each traffic policy, 0, 1 and
// 3 endpoints (local and remote), every protocol, a NodePort, an
// externalIP and a load balancer IP, with source ranges on every other
// port (one of them containing the node).
func richPorts(t testing.TB, fa famAddrs, tc traceConfig) map[proxy.ServicePortName]*intent.Port {
	t.Helper()
	icfg := intent.Config{Family: fa.fam, PodSources: tc.node.PodSources, MasqueradeAll: tc.cfg.MasqueradeAll, NodeIPs: []netip.Addr{fa.node}}
	out := map[proxy.ServicePortName]*intent.Port{}
	i := 0
	for _, alg := range []proxy.Algorithm{"", proxy.AlgorithmRoundRobin, proxy.AlgorithmSourceHash, proxy.AlgorithmLeastConnection} {
		for _, aff := range []int32{0, 30} {
			for _, etp := range []bool{false, true} {
				for _, itp := range []bool{false, true} {
					for _, n := range []int{0, 1, 3} {
						proto := []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}[(i+i/3)%3]
						name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}, Port: "p", Protocol: proto}
						sp := &proxy.ServicePort{Name: name, Family: fa.fam, Protocol: proto, ClusterIP: fa.addr(0, i), Port: 80,
							NodePort: int32(30000 + i), ExternalIPs: []netip.Addr{fa.addr(3, i)}, LoadBalancerIPs: []netip.Addr{fa.addr(4, i)},
							ExternalPolicyLocal: etp, InternalPolicyLocal: itp, AffinityTimeoutSeconds: aff, Algorithm: alg}
						if i%2 == 1 {
							sp.LoadBalancerSourceRanges = fa.ranges[:1+i%4/2]
						}
						for e := range n {
							// The first endpoint of three is local, the one
							// endpoint of every other port too.
							local := (n == 3 && e == 0) || (n == 1 && (i/2)%2 == 0)
							kind := 2
							if local {
								kind = 1
							}
							ep := proxy.Endpoint{IP: fa.addr(kind, 10*i+e), Port: 8080, Ready: true, Serving: true, Local: local}
							sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
						}
						proxy.SortEndpoints(sp.ClusterEndpoints)
						for _, ep := range sp.ClusterEndpoints {
							if ep.Local {
								sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
							}
						}
						sp.HasAnyEndpoints = n > 0
						var conns map[netip.AddrPort]int
						if alg == proxy.AlgorithmLeastConnection && n > 0 {
							conns = map[netip.AddrPort]int{sp.ClusterEndpoints[0].AddrPort(): 3}
						}
						p, problems := intent.Build(icfg, sp, conns)
						if p == nil {
							t.Fatalf("%s: %v", sp.Name, problems)
						}
						out[name] = p
						i++
					}
				}
			}
		}
	}
	// A port whose intent masquerades outside clients only (no intent
	// Build makes today): the renderer's mixed masquerade routes ("fib
	// saddr type != local jump mark-masq").
	sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "mixed"}, Port: "p", Protocol: v1.ProtocolTCP},
		Family: fa.fam, Protocol: v1.ProtocolTCP, ClusterIP: fa.addr(0, 900), Port: 80, HasAnyEndpoints: true,
		ClusterEndpoints: []proxy.Endpoint{{IP: fa.addr(2, 900), Port: 8080, Ready: true, Serving: true}}}
	p, problems := intent.Build(icfg, sp, nil)
	if p == nil {
		t.Fatalf("%s: %v", sp.Name, problems)
	}
	dnat := intent.Route{Verdict: intent.DNAT, Set: intent.Cluster}
	p.Frontends[0].Routes = [3]intent.Route{dnat, dnat, {Verdict: intent.DNAT, Set: intent.Cluster, Masquerade: true}}
	out[sp.Name] = p
	return out
}

// traceConfig is one renderer configuration of the parse-level test.
type traceConfig struct {
	name string
	cfg  facts.Config
	node nftables.Node
	// iface is the interface pods arrive on.
	iface string
}

func traceConfigs(fa famAddrs) []traceConfig {
	base := func() facts.Config {
		c := facts.DefaultConfig(fa.fam)
		c.ClusterCIDRs = []netip.Prefix{fa.podCIDR}
		return c
	}
	var out []traceConfig
	c := base()
	out = append(out, traceConfig{name: "cluster-cidr", cfg: c, iface: "eth1",
		node: nftables.Node{PodSources: true, PodCIDRs: []netip.Prefix{fa.podCIDR}, NodePortsAll: true, Localhost: fa.fam == v1.IPv4Protocol}})
	c = base()
	c.LocalhostNodePorts, c.RandomFully, c.TCPBeLiberal, c.MasqueradeAll = false, false, true, true
	out = append(out, traceConfig{name: "masquerade-all,no-localhost", cfg: c, iface: "eth1",
		node: nftables.Node{PodSources: true, PodCIDRs: []netip.Prefix{fa.podCIDR}, NodePortsAll: true}})
	c = base()
	c.ClusterCIDRs = nil
	out = append(out, traceConfig{name: "no-pod-sources,nodeport-ips", cfg: c, iface: "eth1",
		node: nftables.Node{NodePortIPs: []netip.Addr{fa.node}}})
	c = base()
	c.LocalDetect, c.LocalInterface = facts.LocalBridgeInterface, "cni0"
	out = append(out, traceConfig{name: "bridge", cfg: c, iface: "cni0", node: nftables.Node{PodSources: true, NodePortsAll: true}})
	c = base()
	c.LocalDetect, c.LocalInterface = facts.LocalInterfaceNamePrefix, "veth"
	out = append(out, traceConfig{name: "interface-prefix", cfg: c, iface: "veth1234", node: nftables.Node{PodSources: true, NodePortsAll: true}})
	return out
}

// renderedForms are the rule forms the renderer writes, each of which the
// parse-level test must meet at least once (so that it shows the tracer
// reads all of them).
var renderedForms = []string{
	`^ip6? daddr \. meta l4proto \. th dport vmap @frontends$`,
	`^fib daddr type local meta l4proto \. th dport vmap @nodeports$`,
	`^fib daddr type local ip6? daddr != (127\.0\.0\.0/8|::1) meta l4proto \. th dport vmap @nodeports$`,
	`^ip6? daddr @nodeport-ips meta l4proto \. th dport vmap @nodeports$`,
	`^jump mark-masq$`,
	`^ip6? saddr != @pod-cidrs jump mark-masq$`,
	`^ip6? saddr @pod-cidrs (goto \S+|drop)$`,
	`^iifname != "cni0" jump mark-masq$`,
	`^iifname "cni0" (goto \S+|drop)$`,
	`^iifname != "veth\*" jump mark-masq$`,
	`^iifname "veth\*" (goto \S+|drop)$`,
	`^fib saddr type local (goto \S+|drop)$`,
	`^fib saddr type local jump mark-masq$`,
	`fib saddr type != local jump mark-masq$`,
	`^ip6? saddr != \{ \S+(, \S+)* \} drop$`,
	`^numgen inc mod \d+ 0 meta l4proto \w+ dnat ip6? to \S+$`,
	`^numgen random mod 2147483648 < \d+ meta l4proto \w+ dnat ip6? to \S+$`,
	`^meta l4proto \w+ dnat ip6? to \S+$`,
	`^ip6? saddr @aff-\w+ update @aff-\w+ \{ ip6? saddr \} meta l4proto \w+ dnat ip6? to \S+$`,
	`^numgen random mod \d+ 0 update @aff-\w+ \{ ip6? saddr \} meta l4proto \w+ dnat ip6? to \S+$`,
	`^update @aff-\w+ \{ ip6? saddr \} meta l4proto \w+ dnat ip6? to \S+$`,
	`^dnat ip6? to ip6? daddr \. \w+ dport \. numgen random mod \d+ map @cluster-ip-\w+$`,
	`^dnat ip6? to ip6? daddr \. \w+ dport \. numgen random mod \d+ map @local-ip-\w+$`,
	`^dnat ip6? to \w+ dport \. numgen random mod \d+ map @cluster-np-\w+$`,
	`^dnat ip6? to \w+ dport \. numgen random mod \d+ map @local-np-\w+$`,
	`^dnat ip6? to ip6? daddr \. \w+ dport \. jhash ip6? saddr mod 32 seed 0x6b707278 map @cluster-ip-\w+$`,
	`^dnat ip6? to \w+ dport \. jhash ip6? saddr mod 32 seed 0x6b707278 map @(cluster|local)-np-\w+$`,
	`^goto \S+$`,
	`^goto reject-chain$`,
	`^drop$`,
	`^ct status dnat ip6? saddr \. ip6? daddr @hairpin masquerade fully-random$`,
	`^ct status dnat ip6? saddr \. ip6? daddr @hairpin masquerade$`,
	`^meta mark & 0x\w+ == 0 return$`,
	`^meta mark set meta mark \| 0x\w+$`,
	`^meta mark set meta mark \^ 0x\w+ masquerade( fully-random)?$`,
	`^meta l4proto tcp reject with tcp reset$`,
	`^reject$`,
	`^ct state invalid drop$`,
	`^ip daddr 127\.0\.0\.0/8 ip saddr != 127\.0\.0\.0/8 ct state != \{ established, related \} ct status & dnat == 0 drop$`,
	`^jump services$`,
	`^jump masquerading$`,
	// verdict map elements
	`^element: goto \S+$`,
	`^element: goto reject-chain$`,
	`^element: drop$`,
}

// TestTracerReadsEveryRenderedForm renders rich ports (every algorithm,
// affinity, traffic policies, source ranges, no endpoints, NodePorts,
// externalIPs, load balancer IPs) under every detect-local mode and
// NodePort setting, in both families, and checks that the tracer parses
// every rule and element (NewTracer fails on a form it does not model),
// that every form the renderer writes was met, and that tracing packets of
// every source class to every frontend evaluates every rule of the table
// without error: no rule is left that a trace would have to skip.
func TestTracerReadsEveryRenderedForm(t *testing.T) {
	met := map[string]bool{}
	forms := make([]*regexp.Regexp, len(renderedForms))
	for i, f := range renderedForms {
		forms[i] = regexp.MustCompile(f)
	}
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		fa := addrsOf(fam)
		for _, tc := range traceConfigs(fa) {
			t.Run(string(fam)+"/"+tc.name, func(t *testing.T) {
				ports := richPorts(t, fa, tc)
				f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
				plan, _ := nfttest.Renderer(t, tc.cfg).Render(nftables.Input{Full: true, Ports: ports, Node: tc.node}, nil)
				nfttest.Run(t, f, plan)
				m := f.Model()
				tr, err := nftmodel.NewTracer(nftables.Family(fam), m)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range m.Chains {
					for _, r := range c.Rules {
						for i, form := range forms {
							if form.MatchString(r.String()) {
								met[renderedForms[i]] = true
							}
						}
					}
				}
				for _, e := range m.Sets[nftables.MapFrontends].Elements {
					for i, form := range forms {
						if form.MatchString("element: " + e.Verdict.String()) {
							met[renderedForms[i]] = true
						}
					}
				}
				visited := map[string]bool{}
				tr.SetVisit(func(chain string, rule int) { visited[nftmodel.CounterKey(chain, rule, 1)] = true })
				traceEverything(t, tr, fa, tc, ports, m)
				for _, c := range m.Chains {
					for i := range c.Rules {
						if !visited[nftmodel.CounterKey(c.Name, i+1, 1)] {
							t.Errorf("rule never evaluated: %s #%d: %s", c.Name, i+1, c.Rules[i])
						}
					}
				}
			})
		}
	}
	for _, form := range renderedForms {
		if !met[form] {
			t.Errorf("no rendered rule of the form %s", form)
		}
	}
}

// traceEverything traces, to every frontend of every port, a packet of
// each source class (a pod, a pod reaching itself, the node, clients
// inside and outside the source ranges), with and without the client in
// the affinity sets and the round robin counters, plus packets nothing
// handles.
func traceEverything(t *testing.T, tr *nftmodel.Tracer, fa famAddrs, tc traceConfig, ports map[proxy.ServicePortName]*intent.Port, m *nftmodel.Model) {
	t.Helper()
	local := []netip.Addr{fa.node, fa.loopback}
	var affSets []string
	for n := range m.Sets {
		if strings.HasPrefix(n, "aff-") {
			affSets = append(affSets, n)
		}
	}
	hosts := []trace.Host{
		{LocalAddrs: local},
		{LocalAddrs: local, AffinityHit: map[string]bool{}},
		{LocalAddrs: local, Counters: map[string]uint32{}},
	}
	for _, s := range affSets {
		hosts[1].AffinityHit[s] = true
	}
	proto := func(p *intent.Port) string { return nftables.ProtoName(p.Protocol) }
	for _, p := range ports {
		for _, fe := range p.Frontends {
			dsts := []netip.Addr{fe.Addr}
			if fe.Kind == intent.NodePort {
				dsts = []netip.Addr{fa.node, fa.loopback}
			}
			for _, dst := range dsts {
				pkts := []trace.Packet{
					{Src: fa.pod, InIface: tc.iface},
					{Src: fa.outside, InIface: "eth0"},
					{Src: fa.node, Local: true},
				}
				if len(fe.SourceRanges) > 0 {
					pkts = append(pkts, trace.Packet{Src: fa.inRange, InIface: "eth0"})
				}
				for _, ep := range p.Local {
					pkts = append(pkts, trace.Packet{Src: ep.IP, InIface: tc.iface})
				}
				for _, pkt := range pkts {
					pkt.Dst, pkt.DstPort, pkt.Proto, pkt.SrcPort = dst, uint16(fe.Port), proto(p), 40000
					if pkt.Local && dst.IsLoopback() {
						pkt.Src = dst
					}
					if dst.IsLoopback() && !pkt.Local {
						continue
					}
					for hi, h := range hosts {
						if (hi == 1 && p.AffinitySeconds == 0) || (hi == 2 && p.Algorithm != proxy.AlgorithmRoundRobin) {
							continue
						}
						outs, err := tr.Trace(h, pkt)
						if err != nil {
							t.Fatalf("%s: %v", pkt, err)
						}
						checkProbabilities(t, pkt, outs)
					}
				}
			}
		}
	}
	// Nothing handles these: a port nothing listens on, delivered locally
	// (the filter input chain) and routed away.
	for _, pkt := range []trace.Packet{
		{Src: fa.outside, Dst: fa.node, Proto: "tcp", SrcPort: 1, DstPort: 22, InIface: "eth0"},
		{Src: fa.outside, Dst: fa.addr(0, 999), Proto: "udp", SrcPort: 1, DstPort: 53, InIface: "eth0"},
		{Src: fa.node, Dst: fa.node, Proto: "tcp", SrcPort: 1, DstPort: 22, Local: true},
	} {
		outs, err := tr.Trace(hosts[0], pkt)
		if err != nil {
			t.Fatalf("%s: %v", pkt, err)
		}
		if len(outs) != 1 || outs[0].Verdict != trace.VerdictAccept {
			t.Errorf("%s: %v, want one ACCEPT (not handled)", pkt, outs)
		}
	}
}

func checkProbabilities(t *testing.T, p trace.Packet, outs []trace.Outcome) {
	t.Helper()
	sum := 0.0
	for _, o := range outs {
		sum += o.Probability
	}
	if len(outs) == 0 || math.Abs(sum-1) > 1e-9 {
		t.Errorf("%s: %d outcomes, probabilities summing to %v", p, len(outs), sum)
	}
}

// traceTable renders ports into a Fake and returns the tracer over it.
func traceTable(t *testing.T, fam v1.IPFamily, cfg facts.Config, node nftables.Node, sps ...*proxy.ServicePort) (*nftmodel.Tracer, *nftmodel.Model) {
	t.Helper()
	ports := map[proxy.ServicePortName]*intent.Port{}
	for _, sp := range sps {
		p, problems := intent.Build(intent.Config{Family: fam, PodSources: node.PodSources}, sp, nil)
		if p == nil {
			t.Fatalf("%s: %v", sp.Name, problems)
		}
		ports[sp.Name] = p
	}
	f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
	plan, _ := nfttest.Renderer(t, cfg).Render(nftables.Input{Full: true, Ports: ports, Node: node}, nil)
	nfttest.Run(t, f, plan)
	tr, err := nftmodel.NewTracer(nftables.Family(fam), f.Model())
	if err != nil {
		t.Fatal(err)
	}
	return tr, f.Model()
}

func simplePort(name string, cip string, alg proxy.Algorithm, eps ...string) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p", Protocol: v1.ProtocolTCP},
		Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr(cip), Port: 80, NodePort: 30080, Algorithm: alg, HasAnyEndpoints: len(eps) > 0}
	sp.Family = v1.IPv4Protocol
	if sp.ClusterIP.Is6() {
		sp.Family = v1.IPv6Protocol
	}
	for _, e := range eps {
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, proxy.Endpoint{IP: netip.MustParseAddr(e), Port: 8080, Ready: true, Serving: true})
	}
	return sp
}

// TestTraceRoundRobin: with counters, consecutive connections rotate over
// the endpoints in order, each once per round, as the kernel's numgen inc
// counters (created at N-1, so the first connection takes the first rule);
// without, each endpoint is one outcome with probability 1/N.
func TestTraceRoundRobin(t *testing.T) {
	eps := []string{"10.244.1.1", "10.244.1.2", "10.244.2.3"}
	tr, _ := traceTable(t, v1.IPv4Protocol, nfttest.Config(), nfttest.Node, simplePort("rr", "10.96.0.10", proxy.AlgorithmRoundRobin, eps...))
	h := trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("192.168.50.10")}}
	pkt := trace.Packet{Src: netip.MustParseAddr("10.244.1.50"), Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", SrcPort: 1000, DstPort: 80, InIface: "eth1"}
	seq, err := tr.TraceSequence(h, pkt, 7)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, outs := range seq {
		if len(outs) != 1 || outs[0].Verdict != trace.VerdictDNAT || outs[0].Probability != 1 {
			t.Fatalf("%v, want one DNAT", outs)
		}
		got = append(got, outs[0].Dst.Addr().String())
	}
	want := append(append(slices.Clone(eps), eps...), eps[0])
	if !slices.Equal(got, want) {
		t.Errorf("rotation %v, want %v", got, want)
	}
	outs, err := tr.Trace(h, pkt)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3 {
		t.Fatalf("without counters: %v, want 3 outcomes", outs)
	}
	for _, o := range outs {
		if math.Abs(o.Probability-1.0/3) > 1e-12 || o.Counters != nil {
			t.Errorf("without counters: %v (counters %v), want p 1/3 and no counters", o, o.Counters)
		}
		if !strings.Contains(strings.Join(o.Path, "\n"), "round robin") {
			t.Errorf("the path does not tell the rotation:\n%s", strings.Join(o.Path, "\n"))
		}
	}
}

// kernelJhash is lib's jhash() over bytes, as nft_jhash calls it on the
// source register (4 or 16 bytes): written here from the kernel's
// definition, independently of ruleset's word-oriented jhash_1word/jhash2.
func kernelJhash(k []byte, initval uint32) uint32 {
	rol := bits.RotateLeft32
	mix := func(a, b, c uint32) (uint32, uint32, uint32) {
		a -= c
		a ^= rol(c, 4)
		c += b
		b -= a
		b ^= rol(a, 6)
		a += c
		c -= b
		c ^= rol(b, 8)
		b += a
		a -= c
		a ^= rol(c, 16)
		c += b
		b -= a
		b ^= rol(a, 19)
		a += c
		c -= b
		c ^= rol(b, 4)
		b += a
		return a, b, c
	}
	final := func(a, b, c uint32) uint32 {
		c ^= b
		c -= rol(b, 14)
		a ^= c
		a -= rol(c, 11)
		b ^= a
		b -= rol(a, 25)
		c ^= b
		c -= rol(b, 16)
		a ^= c
		a -= rol(c, 4)
		b ^= a
		b -= rol(a, 14)
		c ^= b
		c -= rol(b, 24)
		return c
	}
	a := 0xdeadbeef + uint32(len(k)) + initval
	b, c := a, a
	for len(k) > 12 {
		// get_unaligned_cpu32: little-endian on the nodes kproxy runs on.
		a += binary.LittleEndian.Uint32(k[0:])
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	var tail [12]byte
	copy(tail[:], k)
	if len(k) == 0 {
		return c
	}
	a += binary.LittleEndian.Uint32(tail[0:])
	b += binary.LittleEndian.Uint32(tail[4:])
	c += binary.LittleEndian.Uint32(tail[8:])
	return final(a, b, c)
}

// TestTraceSourceHash: every client reaches exactly the endpoint of its
// slot in the consistent table, the slot being nft's "jhash ip saddr mod
// 32 seed S" (jhash() over the address bytes, reciprocal_scale to 32),
// which trace.ClusterSlot computes too; in both families, for the
// ClusterIP and the NodePort.
func TestTraceSourceHash(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		fa := addrsOf(fam)
		var eps []string
		for i := range 5 {
			eps = append(eps, fa.addr(2, i).String())
		}
		cfg := facts.DefaultConfig(fam)
		cfg.ClusterCIDRs = []netip.Prefix{fa.podCIDR}
		node := nftables.Node{PodSources: true, PodCIDRs: cfg.ClusterCIDRs, NodePortsAll: true}
		sp := simplePort("sh", fa.addr(0, 7).String(), proxy.AlgorithmSourceHash, eps...)
		tr, _ := traceTable(t, fam, cfg, node, sp)
		table := proxy.SourceHashTable(sp.ClusterEndpoints)
		h := trace.Host{LocalAddrs: []netip.Addr{fa.node}}
		for range 200 {
			b := fa.outside.AsSlice()
			for i := len(b) / 2; i < len(b); i++ {
				b[i] = byte(rnd.IntN(256))
			}
			src, _ := netip.AddrFromSlice(b)
			h32 := kernelJhash(b, proxy.SourceHashSeed)
			slot := uint32((uint64(h32) * proxy.SourceHashSlots) >> 32)
			if got := trace.ClusterSlot(src, proxy.SourceHashSeed, proxy.SourceHashSlots); got != slot {
				t.Fatalf("%s: ClusterSlot %d, nft's jhash gives slot %d", src, got, slot)
			}
			want := sp.ClusterEndpoints[table[slot]].AddrPort()
			for _, dst := range []netip.AddrPort{netip.AddrPortFrom(sp.ClusterIP, 80), netip.AddrPortFrom(fa.node, 30080)} {
				outs, err := tr.Trace(h, trace.Packet{Src: src, Dst: dst.Addr(), Proto: "tcp", SrcPort: 1, DstPort: dst.Port(), InIface: "eth0"})
				if err != nil {
					t.Fatal(err)
				}
				if len(outs) != 1 || outs[0].Verdict != trace.VerdictDNAT || outs[0].Dst != want {
					t.Errorf("%s -> %s: %v, want DNAT to %s (slot %d)", src, dst, outs, want, slot)
				}
			}
		}
	}
}

// TestTraceMissingSlotFallsThrough: a DNAT map lookup that finds no
// element does not match (the kernel's lookup breaks the rule): that share
// of the connections is not handled, and the path says why.
func TestTraceMissingSlotFallsThrough(t *testing.T) {
	_, m := traceTable(t, v1.IPv4Protocol, nfttest.Config(), nfttest.Node, simplePort("web", "10.96.0.10", "", "10.244.1.1", "10.244.2.2"))
	delete(m.Sets["cluster-ip-tcp"].Elements, "10.96.0.10 . 80 . 1")
	tr, err := nftmodel.NewTracer(knftables.IPv4Family, m)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := tr.Trace(trace.Host{}, trace.Packet{Src: netip.MustParseAddr("10.244.1.9"), Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", SrcPort: 1, DstPort: 80, InIface: "eth1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 2 || outs[0].Verdict != trace.VerdictAccept && outs[1].Verdict != trace.VerdictAccept {
		t.Fatalf("%v, want a DNAT and a not handled outcome", outs)
	}
	for _, o := range outs {
		if o.Probability != 0.5 {
			t.Errorf("%v: want p 0.5", o)
		}
		if o.Verdict == trace.VerdictAccept && !strings.Contains(strings.Join(o.Path, "\n"), "10.96.0.10 . 80 . 1 not in @cluster-ip-tcp") {
			t.Errorf("path does not tell the missing slot:\n%s", strings.Join(o.Path, "\n"))
		}
	}
}

// TestTraceLocalDelivery: a connection DNATed to a local address (a
// hostNetwork endpoint) is delivered to the node: it meets no postrouting,
// so it is not masqueraded whatever the mark.
func TestTraceLocalDelivery(t *testing.T) {
	node := netip.MustParseAddr("192.168.50.10")
	tr, _ := traceTable(t, v1.IPv4Protocol, nfttest.Config(), nfttest.Node, simplePort("host", "10.96.0.10", "", node.String()))
	outs, err := tr.Trace(trace.Host{LocalAddrs: []netip.Addr{node}}, trace.Packet{Src: netip.MustParseAddr("203.0.113.1"), Dst: node, Proto: "tcp", SrcPort: 1, DstPort: 30080, InIface: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Verdict != trace.VerdictDNAT || outs[0].Delivered != "local" || outs[0].Masquerade || outs[0].Mark == 0 {
		t.Errorf("%v (mark %#x), want DNAT delivered locally, marked but not masqueraded", outs, outs[0].Mark)
	}
}

// TestTracerRefusesUnknownSyntax: a rule or element the tracer does not
// model fails NewTracer, naming the chain and rule; a packet of the other
// family fails Trace.
func TestTracerRefusesUnknownSyntax(t *testing.T) {
	_, m := traceTable(t, v1.IPv4Protocol, nfttest.Config(), nfttest.Node, simplePort("web", "10.96.0.10", "", "10.244.1.1"))
	// Text the Fake's reader refuses, or reads into a rule NewTracer
	// refuses.
	for _, bad := range []string{
		"ip saddr 10.0.0.0/8 counter accept",
		"tcp flags syn drop",
		"ct mark 0x1 drop",
		"log prefix kproxy",
		"meta l4proto tcp dnat ip to 10.0.0.1-10.0.0.5",
		"ip daddr vmap { 10.0.0.1 : drop }",
		"ip6 saddr ::1 drop",
		"dnat ip to 10.0.0.1:80 accept",
		"numgen random mod 2 0 snat ip to 10.0.0.1",
		"ip saddr . tcp sport { 10.0.0.1 . 1-1024 } drop",
		"ct status != dnat drop",
		"fib daddr . iif type local drop",
		"ip saddr @nope drop",
		"goto nowhere",
	} {
		r, err := nftmodel.ParseRule("ip", bad)
		if err != nil {
			continue
		}
		mm := m.Clone()
		mm.Chains[nftables.ChainServices].Rules = append(mm.Chains[nftables.ChainServices].Rules, r)
		if _, err := nftmodel.NewTracer(knftables.IPv4Family, mm); err == nil || !strings.Contains(err.Error(), "chain services rule 3") {
			t.Errorf("%q: err %v, want an error naming chain services rule 3", bad, err)
		}
	}
	// Typed rules no text reads into (a table read back is built as
	// values): NewTracer checks them as the reader does.
	ip6 := &nft.Payload{Base: "ip6", Field: "saddr"}
	port := &nft.Payload{Base: "tcp", Field: "dport"}
	for _, bad := range []nft.Rule{
		{&nft.Match{Left: []nft.Expr{ip6}, Right: []nft.Key{{nft.Addr(netip.MustParseAddr("::1"))}}}, &nft.Verdict{Kind: "drop"}},
		{&nft.Match{Left: []nft.Expr{port}, Right: []nft.Key{{nft.Addr(netip.MustParseAddr("10.0.0.1"))}}}, &nft.Verdict{Kind: "drop"}},
		{&nft.Verdict{Kind: "accept"}, &nft.Verdict{Kind: "drop"}},
		{&nft.Update{Set: "aff", Key: port}},
		{&nft.DNAT{Addr: netip.MustParseAddr("fd00::1")}},
		{&nft.Match{Left: []nft.Expr{port}, Op: nft.OpLt, Anon: true, Right: []nft.Key{{nft.Num(1)}}}},
		{&nft.Verdict{Kind: "queue"}},
		{},
	} {
		mm := m.Clone()
		mm.Chains[nftables.ChainServices].Rules = append(mm.Chains[nftables.ChainServices].Rules, bad)
		if _, err := nftmodel.NewTracer(knftables.IPv4Family, mm); err == nil || !strings.Contains(err.Error(), "chain services rule 3") {
			t.Errorf("%#v: err %v, want an error naming chain services rule 3", bad, err)
		}
	}
	mm := m.Clone()
	for id, e := range mm.Sets[nftables.MapFrontends].Elements {
		e.Verdict = &nft.Verdict{Kind: "queue"}
		mm.Sets[nftables.MapFrontends].Elements[id] = e
	}
	if _, err := nftmodel.NewTracer(knftables.IPv4Family, mm); err == nil {
		t.Errorf("an element with verdict \"queue\": no error")
	}
	tr, err := nftmodel.NewTracer(knftables.IPv4Family, m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Trace(trace.Host{}, trace.Packet{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: "tcp", DstPort: 80}); err == nil {
		t.Errorf("an IPv6 packet in an ip table: no error")
	}
	if _, err := nftmodel.NewTracer(knftables.IPv6Family, m); err == nil {
		t.Errorf("an ip table read as ip6: no error")
	}
}

// TestTraceCountersIndependentOfPaths: the counters a sequence carries are
// the numgen inc expressions' own: another Service's traffic in between
// does not move them.
func TestTraceCountersIndependentOfPaths(t *testing.T) {
	a := simplePort("a", "10.96.0.10", proxy.AlgorithmRoundRobin, "10.244.1.1", "10.244.1.2")
	b := simplePort("b", "10.96.0.11", proxy.AlgorithmRoundRobin, "10.244.2.1", "10.244.2.2")
	b.NodePort = 30081
	tr, _ := traceTable(t, v1.IPv4Protocol, nfttest.Config(), nfttest.Node, a, b)
	h := trace.Host{Counters: map[string]uint32{}}
	pa := trace.Packet{Src: netip.MustParseAddr("10.244.1.50"), Dst: a.ClusterIP, Proto: "tcp", SrcPort: 1, DstPort: 80, InIface: "eth1"}
	pb := pa
	pb.Dst = b.ClusterIP
	var got []string
	for _, p := range []trace.Packet{pa, pb, pb, pb, pa} {
		outs, err := tr.Trace(h, p)
		if err != nil {
			t.Fatal(err)
		}
		h.Counters = outs[0].Counters
		got = append(got, outs[0].Dst.Addr().String())
	}
	want := []string{"10.244.1.1", "10.244.2.1", "10.244.2.2", "10.244.2.1", "10.244.1.2"}
	if !slices.Equal(got, want) {
		t.Errorf("%v, want %v (counters %v)", got, want, slices.Sorted(maps.Keys(h.Counters)))
	}
}

// TestTraceAgreesWithIntent: beyond the behaviour table, for the rich
// ports under every configuration, a packet of each source class to each
// frontend gets what intent.Decide says: the verdict, the endpoints with
// their shares (equal for random and round robin, the weights for least
// connection, the client's slot for source hash), the masquerade (a pod
// reaching itself is masqueraded whatever the route).
func TestTraceAgreesWithIntent(t *testing.T) {
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		fa := addrsOf(fam)
		for _, tc := range traceConfigs(fa) {
			t.Run(string(fam)+"/"+tc.name, func(t *testing.T) {
				ports := richPorts(t, fa, tc)
				f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
				plan, _ := nfttest.Renderer(t, tc.cfg).Render(nftables.Input{Full: true, Ports: ports, Node: tc.node}, nil)
				nfttest.Run(t, f, plan)
				tr, err := nftmodel.NewTracer(nftables.Family(fam), f.Model())
				if err != nil {
					t.Fatal(err)
				}
				h := trace.Host{LocalAddrs: []netip.Addr{fa.node, fa.loopback}}
				outside := intent.FromOutside
				podClass := outside
				if tc.node.PodSources {
					podClass = intent.FromPod
				}
				for _, p := range ports {
					for i := range p.Frontends {
						fe := &p.Frontends[i]
						dsts := []netip.Addr{fe.Addr}
						if fe.Kind == intent.NodePort {
							dsts = []netip.Addr{fa.node}
							if tc.node.Localhost {
								dsts = append(dsts, fa.loopback)
							}
						}
						type client struct {
							pkt   trace.Packet
							class intent.Source
						}
						for _, dst := range dsts {
							clients := []client{
								{trace.Packet{Src: fa.pod, InIface: tc.iface}, podClass},
								{trace.Packet{Src: fa.outside, InIface: "eth0"}, outside},
								{trace.Packet{Src: fa.inRange, InIface: "eth0"}, outside},
								{trace.Packet{Src: fa.node, Local: true}, intent.FromNode},
							}
							for _, ep := range p.Local {
								clients = append(clients, client{trace.Packet{Src: ep.IP, InIface: tc.iface}, podClass})
							}
							for _, c := range clients {
								pkt := c.pkt
								pkt.Dst, pkt.DstPort, pkt.Proto, pkt.SrcPort = dst, uint16(fe.Port), nftables.ProtoName(p.Protocol), 40000
								if dst.IsLoopback() {
									if !pkt.Local {
										continue
									}
									pkt.Src = dst
								}
								outs, err := tr.Trace(h, pkt)
								if err != nil {
									t.Fatal(err)
								}
								agree(t, p, fe, c.class, pkt, outs)
							}
						}
					}
				}
			})
		}
	}
}

// agree checks a trace against the intent's decision.
func agree(t *testing.T, p *intent.Port, fe *intent.Frontend, class intent.Source, pkt trace.Packet, outs []trace.Outcome) {
	t.Helper()
	d := p.Decide(fe, class, pkt.Src)
	want := map[intent.Verdict]trace.Verdict{intent.DNAT: trace.VerdictDNAT, intent.Reject: trace.VerdictReject, intent.Drop: trace.VerdictDrop}[d.Verdict]
	share := map[netip.AddrPort]float64{}
	for _, o := range outs {
		if o.Verdict != want {
			t.Errorf("%s (%s) %s from %s: %v, the intent says %s; path:%s", p, p.Algorithm, fe, class, o, d.Verdict, nfttest.Path(o))
			continue
		}
		if want != trace.VerdictDNAT {
			continue
		}
		share[o.Dst] += o.Probability
		hairpin := !pkt.Local && o.Dst.Addr() == pkt.Src && slices.Contains(p.Hairpin(), pkt.Src)
		if o.Masquerade != (d.Masquerade || hairpin) {
			t.Errorf("%s %s from %s (%s): masquerade %v, the intent says %v (hairpin %v); path:%s", p, fe, class, pkt.Src, o.Masquerade, d.Masquerade, hairpin, nfttest.Path(o))
		}
	}
	if want != trace.VerdictDNAT {
		return
	}
	wantShare := map[netip.AddrPort]float64{}
	if p.Algorithm == proxy.AlgorithmSourceHash && len(d.Endpoints) <= proxy.MaxSourceHashEndpoints {
		slot := trace.ClusterSlot(pkt.Src, proxy.SourceHashSeed, proxy.SourceHashSlots)
		wantShare[d.Endpoints[proxy.SourceHashTable(d.Endpoints)[slot]].AddrPort()] = 1
	} else {
		total := 0.0
		for i := range d.Endpoints {
			total += nfttest.Weight(d.Weights, i)
		}
		for i, ep := range d.Endpoints {
			wantShare[ep.AddrPort()] += nfttest.Weight(d.Weights, i) / total
		}
	}
	if !nfttest.SameShares(share, wantShare) {
		t.Errorf("%s (%s) %s from %s (%s): endpoints %v, the intent says %v", p, p.Algorithm, fe, class, pkt.Src, nfttest.FmtShares(share), nfttest.FmtShares(wantShare))
	}
}
