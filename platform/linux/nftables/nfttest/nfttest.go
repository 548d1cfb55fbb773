// Package nfttest holds the helpers the nftables renderer's tests and its
// model's tests share: a test configuration and node, a renderer, random
// service ports, a port's intent, running a plan on a Fake. Tests only:
// no product package imports it.
package nfttest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"github.com/kproxy/kproxy/platform/linux/trace"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Config is the configuration the tests render with (IPv4, cluster CIDR
// 10.244.0.0/16).
func Config() facts.Config {
	cfg := facts.DefaultConfig(v1.IPv4Protocol)
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	return cfg
}

// Node holds the node facts the tests render with.
var Node = nftables.Node{PodSources: true, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, NodePortsAll: true, Localhost: true}

// Renderer returns a renderer for cfg or fails the test.
func Renderer(t testing.TB, cfg facts.Config) *nftables.Renderer {
	t.Helper()
	r, err := nftables.NewRenderer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// GenPort makes a random service port: a ClusterIP, maybe a NodePort,
// externalIPs and load balancer IPs (with source ranges), traffic policies,
// affinity, an algorithm, 0-5 endpoints some of them local.
func GenPort(rnd *rand.Rand, i int) *proxy.ServicePort {
	name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}, Port: "p",
		Protocol: []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}[rnd.IntN(3)]}
	sp := &proxy.ServicePort{Name: name, Family: v1.IPv4Protocol, Protocol: name.Protocol,
		ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)}), Port: int32(80 + rnd.IntN(3))}
	if rnd.IntN(3) == 0 {
		sp.NodePort = int32(30000 + i)
	}
	if rnd.IntN(4) == 0 {
		// Shared across ports on purpose: two Services may claim one.
		sp.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 1, byte(rnd.IntN(4) + 1)})}
	}
	if rnd.IntN(4) == 0 {
		sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 2, byte(i%250 + 1)})}
		if rnd.IntN(2) == 0 {
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.50.0/24")}
		}
	}
	sp.ExternalPolicyLocal = sp.ExternallyAccessible() && rnd.IntN(3) == 0
	sp.InternalPolicyLocal = rnd.IntN(5) == 0
	if rnd.IntN(5) == 0 {
		sp.AffinityTimeoutSeconds = int32(10 + rnd.IntN(3))
	}
	sp.Algorithm = []proxy.Algorithm{"", proxy.AlgorithmRoundRobin, proxy.AlgorithmSourceHash, proxy.AlgorithmLeastConnection}[rnd.IntN(4)]
	n := rnd.IntN(6)
	for e := range n {
		ep := proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(rnd.IntN(3)), byte(e + 1)}), Port: 8080, Ready: true, Serving: true}
		ep.Local = ep.IP.As4()[2] == 1
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
	}
	proxy.SortEndpoints(sp.ClusterEndpoints)
	// One address once (the cache collapses duplicates).
	var eps []proxy.Endpoint
	for _, ep := range sp.ClusterEndpoints {
		if len(eps) == 0 || eps[len(eps)-1].IP != ep.IP {
			eps = append(eps, ep)
		}
	}
	sp.ClusterEndpoints = eps
	for _, ep := range eps {
		if ep.Local {
			sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
		}
	}
	sp.HasAnyEndpoints = len(eps) > 0
	if len(sp.ClusterEndpoints) == 0 {
		sp.ClusterEndpoints = nil
	}
	return sp
}

// Build returns sp's intent (least-connection ports with 3 connections on
// their first endpoint) or fails the test.
func Build(t testing.TB, sp *proxy.ServicePort) *intent.Port {
	t.Helper()
	var conns map[netip.AddrPort]int
	if sp.Algorithm == proxy.AlgorithmLeastConnection && len(sp.ClusterEndpoints) > 0 {
		conns = map[netip.AddrPort]int{sp.ClusterEndpoints[0].AddrPort(): 3}
	}
	p, problems := intent.Build(intent.Config{Family: v1.IPv4Protocol, PodSources: true, NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.10")}}, sp, conns)
	if p == nil {
		t.Fatalf("%s: %v", sp.Name, problems)
	}
	return p
}

// Views builds the intent of a changing set of ports the way pkg/app
// does, through one intent.Builder, so that frontend ownership and
// handovers between ports are decided as in production.
type Views struct {
	b     *intent.Builder
	Ports map[proxy.ServicePortName]*proxy.ServicePort
}

// NewViews returns Views over no ports.
func NewViews() *Views {
	return &Views{b: intent.NewBuilder(v1.IPv4Protocol), Ports: map[proxy.ServicePortName]*proxy.ServicePort{}}
}

// With returns v with ports as its ports (a copy of the map).
func (v *Views) With(ports map[proxy.ServicePortName]*proxy.ServicePort) *Views {
	for n, sp := range ports {
		v.Ports[n] = sp
	}
	return v
}

// Build builds the View of v.Ports after the ports named in changed were
// added, changed or removed (every port when full) and returns the intent
// a render takes: every port of the View when full, else the changed ports
// (nil for a port gone or left out).
func (v *Views) Build(full bool, changed map[proxy.ServicePortName]struct{}) map[proxy.ServicePortName]*intent.Port {
	conns := map[proxy.ServicePortName]map[netip.AddrPort]int{}
	cc := map[proxy.ServicePortName]struct{}{}
	for n, sp := range v.Ports {
		if sp.Algorithm == proxy.AlgorithmLeastConnection && len(sp.ClusterEndpoints) > 0 {
			conns[n] = map[netip.AddrPort]int{sp.ClusterEndpoints[0].AddrPort(): 3}
			if _, ok := changed[n]; ok {
				cc[n] = struct{}{}
			}
		}
	}
	view := v.b.Build(intent.Input{
		Config:  intent.Config{PodSources: true, NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.50.10")}},
		Ports:   proxy.NewFamilyView(v1.IPv4Protocol, v.Ports),
		Changes: proxy.Changes{Full: full, Ports: changed},
		Conns:   conns, ConnsChanged: cc,
	})
	out := map[proxy.ServicePortName]*intent.Port{}
	if full {
		for _, p := range view.Sorted() {
			out[p.Name] = p
		}
		return out
	}
	view.ChangedPorts(func(n proxy.ServicePortName, p *intent.Port) { out[n] = p })
	return out
}

// ownGen matches the generation that ends a port's own chain name.
var ownGen = regexp.MustCompile(`(port-[a-z2-7]{8}-[^ ]*?-(?:eps-cluster|eps-local|route-cip|route-ext|route-np|fw-[a-z2-7]{8}))-[0-9]+`)

// Normalized is a Fake's dump with own chains' generations removed (a
// partial sync names a rewritten chain afresh), sorted again.
func Normalized(f *nftmodel.Fake) string {
	lines := strings.Split(ownGen.ReplaceAllString(f.Dump(), "$1"), "\n")
	return strings.Join(lines, "\n")
}

// Run runs plan on f or fails the test.
func Run(t testing.TB, f *nftmodel.Fake, plan *nftables.Plan) {
	t.Helper()
	if err := f.Run(context.Background(), plan.Tx); err != nil {
		t.Fatalf("transaction refused: %v\n%s", err, plan.Tx)
	}
}

// Path renders an outcome's path, one step a line.
func Path(o trace.Outcome) string { return "\n\t" + strings.Join(o.Path, "\n\t") }

// Weight is the weight of endpoint i (1 when ws is nil: equal weights).
func Weight(ws []float64, i int) float64 {
	if ws == nil {
		return 1
	}
	return ws[i]
}

// SameShares reports whether two endpoint shares agree (to rounding).
func SameShares(a, b map[netip.AddrPort]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		// Least-connection weights are rounded to 2^-31.
		if !ok || math.Abs(v-w) > 1e-6 {
			return false
		}
	}
	return true
}

// FmtShares renders endpoint shares, sorted by endpoint.
func FmtShares(m map[netip.AddrPort]float64) string {
	keys := slices.SortedFunc(func(yield func(netip.AddrPort) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}, netip.AddrPort.Compare)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s:%.4g", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// Elem returns the element of set whose key and value parts are as nft
// lists them (knftables.Element's Key and Value: "10.96.0.1", "tcp", "80";
// "goto dnat-cluster-ip-tcp-r2"), or fails the test.
func Elem(t testing.TB, set string, key, value []string) nftables.Elem {
	t.Helper()
	part := func(s string) nft.Value {
		if a, err := netip.ParseAddr(s); err == nil {
			return nft.Addr(a)
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			return nft.Prefix(p)
		}
		if v, ok := nft.Proto(s); ok {
			return v
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("element of %s: part %q is not an address, a protocol or a number", set, s)
		}
		return nft.Num(n)
	}
	var e nft.Elem
	for _, s := range key {
		e.Key = append(e.Key, part(s))
	}
	if len(value) == 1 {
		kind, chain, _ := strings.Cut(value[0], " ")
		switch kind {
		case "jump", "goto", "drop", "accept", "return", "continue":
			e.Verdict = &nft.Verdict{Kind: kind, Chain: strings.Trim(chain, `"`)}
		}
	}
	if e.Verdict == nil {
		for _, s := range value {
			e.Data = append(e.Data, part(s))
		}
	}
	el, err := nftables.NewElem(set, e)
	if err != nil {
		t.Fatal(err)
	}
	return el
}
