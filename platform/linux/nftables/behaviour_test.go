package nftables_test

import (
	"context"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"
	"github.com/kproxy/kproxy/platform/linux/trace"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	"github.com/kproxy/kproxy/test/proxytest"
)

// behaviourEnv is one proxy run of the behaviour table: one configuration
// and family, node1's table rendered from the intent of its ports and
// applied to a Fake, and the tracer over it.
type behaviourEnv struct {
	topo   *proxytest.Topology
	cfg    facts.Config
	icfg   intent.Config
	node   nftables.Node
	ports  map[proxy.ServicePortName]*intent.Port
	tracer *nftmodel.Tracer
	host   trace.Host
}

// newBehaviourEnv maps the table's configuration onto facts.Config and the
// node's facts the way the nftables backend does (platform/linux
// NFTBackend.facts: detect-local by the cluster CIDRs, NodePort addresses,
// localhost NodePorts for IPv4), renders every port in full and applies
// the transaction.
func newBehaviourEnv(t *testing.T, tb *proxytest.Table, pc proxytest.Config, snap *proxy.Snapshot, fam v1.IPFamily) *behaviourEnv {
	t.Helper()
	topo := tb.Topology
	node1, _ := topo.Node(topo.ProxyNode)
	cfg := facts.DefaultConfig(fam)
	cfg.MasqueradeAll = pc.MasqueradeAll
	if pc.ClusterCIDR {
		cfg.ClusterCIDRs = topo.ClusterCIDRs()
	}
	if pc.NodePortAddresses != "" {
		var err error
		cfg.NodePortAddresses, cfg.NodePortPrimary, err = facts.ParseNodePortAddresses(strings.Split(pc.NodePortAddresses, ","))
		if err != nil {
			t.Fatal(err)
		}
	}
	loopback := netip.MustParseAddr(map[v1.IPFamily]string{v1.IPv4Protocol: "127.0.0.1", v1.IPv6Protocol: "::1"}[fam])
	local := append(node1.Addrs(fam), loopback)
	e := &behaviourEnv{topo: topo, cfg: cfg, host: trace.Host{LocalAddrs: local}, ports: map[proxy.ServicePortName]*intent.Port{}}
	e.icfg = intent.Config{Family: fam, MasqueradeAll: cfg.MasqueradeAll, NodeIPs: cfg.NodeIPs(snap.Node, local)}
	e.node.PodCIDRs = cfg.OfFamily(cfg.ClusterCIDRs)
	e.node.PodSources = len(e.node.PodCIDRs) > 0
	e.icfg.PodSources = e.node.PodSources
	e.node.NodePortsAll, e.node.NodePortIPs = cfg.NodePortDestinations(snap.Node, local)
	e.node.Localhost = fam == v1.IPv4Protocol && cfg.LocalhostNodePorts &&
		(e.node.NodePortsAll || slices.ContainsFunc(e.node.NodePortIPs, netip.Addr.IsLoopback))

	// The ports' intent as pkg/app builds it: one View, frontend ownership
	// decided across the Services.
	view := intent.NewBuilder(fam).Build(intent.Input{Config: e.icfg, Ports: snap.Family(fam), Node: snap.Node,
		LocalAddrs: local, Changes: proxy.Changes{Full: true}})
	for _, u := range view.Problems() {
		if u.Reason != intent.ReasonFrontendConflict || !tb.Contender(u.Service.Namespace, u.Service.Name) {
			t.Fatalf("%s %s: %s: %v", pc, fam, u.Service, u)
		}
	}
	for _, p := range view.Sorted() {
		e.ports[p.Name] = p
	}
	rd, err := nftables.NewRenderer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := rd.Render(nftables.Input{Full: true, Ports: e.ports, Node: e.node}, nil)
	f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
	if err := f.Run(context.Background(), plan.Tx); err != nil {
		t.Fatalf("%s %s: transaction refused: %v", pc, fam, err)
	}
	if e.tracer, err = nftmodel.NewTracer(nftables.Family(fam), f.Model()); err != nil {
		t.Fatalf("%s %s: %v", pc, fam, err)
	}
	return e
}

// TestBehaviourTable runs the shared behaviour table (test/proxytest)
// against the nftables renderer: the objects go through the shared cache,
// node1's table is rendered from the intent of its ports and applied to a
// Fake, and each row's first packet is traced through it. Every outcome
// must be what the row expects; then every outcome must also be what the
// intent decides for the row's frontend and source class (the renderer
// renders what the intent says, no more, no less).
func TestBehaviourTable(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	topo := tb.Topology
	checked, skipped := 0, 0
	for _, pc := range tb.Configs() {
		nodes, svcs, eps := tb.Objects(pc)
		var nodeObj *v1.Node
		for _, n := range nodes {
			if n.Name == topo.ProxyNode {
				nodeObj = n
			}
		}
		snap := cache.Build(topo.ProxyNode, nodeObj, svcs, eps)
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			env := newBehaviourEnv(t, tb, pc, snap, fam)
			for _, row := range tb.RowsFor(pc) {
				if row.Family != fam {
					continue
				}
				if reason := row.Skip(proxytest.Linux); reason != "" {
					// Not honoured on Linux: the renderer must still render
					// what the intent says.
					t.Logf("%s: skipped on Linux: %s", row.Name, reason)
					t.Run(row.Name, func(t *testing.T) { env.crossCheck(t, row, env.traceRow(t, row)) })
					skipped++
					continue
				}
				if u, ok := nftUnsupported[row.Name]; ok {
					t.Logf("%s: not honoured by the nftables mode: %s", row.Name, u.reason)
					t.Run(row.Name, func(t *testing.T) { u.check(t, env, row) })
					continue
				}
				t.Run(row.Name, func(t *testing.T) {
					outs := env.traceRow(t, row)
					env.checkRow(t, row, outs)
					env.crossCheck(t, row, outs)
				})
				checked++
			}
		}
	}
	t.Logf("%d rows checked against the table and the intent", checked)
	if want := len(tb.Rows) - skipped - len(nftUnsupported); checked != want {
		t.Fatalf("%d rows checked, want %d", checked, want)
	}
	for name := range nftUnsupported {
		if !slices.ContainsFunc(tb.Rows, func(r proxytest.Row) bool { return r.Name == name }) {
			t.Errorf("nftUnsupported lists %s, which the table does not have", name)
		}
	}
}

// nftUnsupported lists the rows the nftables mode cannot honour, by name,
// with the reason and a check of what it does instead (run in place of the
// row's). None: every row of the table holds in the nftables mode.
var nftUnsupported = map[string]unsupportedRow{}

type unsupportedRow struct {
	reason string
	check  func(t *testing.T, env *behaviourEnv, row proxytest.Row)
}

// packet is the row's first packet, as platform/linux/iptables traceRow makes
// it: from the client's address, or from the loopback address when node1
// sends to a loopback address.
func (e *behaviourEnv) packet(t *testing.T, row proxytest.Row) (trace.Packet, proxytest.Host) {
	t.Helper()
	from, ok := e.topo.Host(row.From)
	if !ok {
		t.Fatalf("unknown client %s", row.From)
	}
	dst, err := row.Address(e.topo)
	if err != nil {
		t.Fatal(err)
	}
	p := trace.Packet{Src: from.Addr(row.Family), Dst: dst.Addr(), Proto: strings.ToLower(string(row.Protocol)),
		SrcPort: 40000, DstPort: dst.Port(), Local: from.Name == e.topo.ProxyNode}
	if p.Local && dst.Addr().IsLoopback() {
		p.Src = dst.Addr()
	}
	if !p.Local {
		p.InIface = "eth0"
		if from.Role == proxytest.RolePod && from.Node == e.topo.ProxyNode {
			p.InIface = "veth-" + from.Name
		}
	}
	return p, from
}

func (e *behaviourEnv) traceRow(t *testing.T, row proxytest.Row) []trace.Outcome {
	t.Helper()
	p, _ := e.packet(t, row)
	outs, err := e.tracer.Trace(e.host, p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if len(outs) == 0 {
		t.Fatalf("%s: no outcome", p)
	}
	sum := 0.0
	for _, o := range outs {
		sum += o.Probability
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("%s: probabilities sum to %v", p, sum)
	}
	return outs
}

// experienced is what the client of an outcome sees: a packet no rule
// handled meets the rest of the topology (the node's stack refuses a
// connection to a port nothing listens on; an address nobody owns, one
// kproxy does not capture, is a black hole).
func experienced(o trace.Outcome) proxytest.Outcome {
	switch o.Verdict {
	case trace.VerdictDNAT:
		return proxytest.Answer
	case trace.VerdictReject:
		return proxytest.Rejected
	case trace.VerdictDrop:
		return proxytest.Dropped
	}
	if o.Delivered == "local" {
		return proxytest.Rejected
	}
	return proxytest.Dropped
}

// checkSticky: the first connection records the client in exactly one
// affinity set; the next, with the client in that set, reaches the same
// endpoint, every time.
func (e *behaviourEnv) checkSticky(t *testing.T, p trace.Packet, first trace.Outcome) {
	t.Helper()
	if len(first.AffinitySets) != 1 {
		t.Errorf("%s: affinity: recorded in %v, want one set; path:%s", p, first.AffinitySets, nfttest.Path(first))
		return
	}
	h := e.host
	h.AffinityHit = map[string]bool{first.AffinitySets[0]: true}
	p.SrcPort++
	outs, err := e.tracer.Trace(h, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if o.Verdict != trace.VerdictDNAT || o.Dst != first.Dst || o.Probability != 1 || !slices.Equal(o.AffinitySets, first.AffinitySets) {
			t.Errorf("%s: affinity: the next connection of a client in %s: %v (sets %v), want %s always, its set refreshed; path:%s",
				p, first.AffinitySets[0], o, o.AffinitySets, first.Dst, nfttest.Path(o))
		}
	}
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// sourceOf classifies a client the way node1 does (pkg/intent's behaviour
// test): a pod (of any node) is FromPod when pods can be told apart, node1
// is FromNode, anything else FromOutside.
func (e *behaviourEnv) sourceOf(h proxytest.Host) intent.Source {
	switch {
	case h.Role == proxytest.RoleNode && h.Name == e.topo.ProxyNode:
		return intent.FromNode
	case h.Role == proxytest.RolePod && e.icfg.PodSources:
		return intent.FromPod
	}
	return intent.FromOutside
}

// nodePortDst reports whether NodePorts answer on a: every local address
// by default (loopback only for IPv4 with localhost NodePorts), or the
// --nodeport-addresses ones.
func (e *behaviourEnv) nodePortDst(a netip.Addr) bool {
	if e.node.NodePortsAll {
		return e.host.IsLocal(a) && (!a.IsLoopback() || e.node.Localhost)
	}
	return slices.Contains(e.node.NodePortIPs, a)
}

// crossCheck: the outcomes are what intent.Decide says for the row's
// frontend, source class and address: the same verdict, the same endpoints
// (each with its share), the same masquerade, a pod reaching itself
// through the Service (hairpin) masqueraded whatever the route.
func (e *behaviourEnv) crossCheck(t *testing.T, row proxytest.Row, outs []trace.Outcome) {
	t.Helper()
	p, from := e.packet(t, row)
	dst := netip.AddrPortFrom(p.Dst, p.DstPort)
	var fe *intent.Frontend
	var port *intent.Port
	for _, ip := range e.ports {
		if ip.Name.Name != row.Service || ip.Protocol != row.Protocol {
			continue
		}
		if f := ip.Lookup(dst, e.nodePortDst(p.Dst)); f != nil {
			fe, port = f, ip
		}
	}
	if fe == nil {
		for _, o := range outs {
			if o.Verdict != trace.VerdictAccept || o.Dst != dst || o.Masquerade {
				t.Errorf("%s: no frontend in the intent, but %v; path:%s", p, o, nfttest.Path(o))
			}
		}
		return
	}
	src := e.sourceOf(from)
	d := port.Decide(fe, src, p.Src)
	want := map[intent.Verdict]trace.Verdict{intent.DNAT: trace.VerdictDNAT, intent.Reject: trace.VerdictReject, intent.Drop: trace.VerdictDrop}[d.Verdict]
	share := map[netip.AddrPort]float64{}
	for _, o := range outs {
		if o.Verdict != want {
			t.Errorf("%s: %s from %s (%s): %v, the intent says %s; path:%s", p, fe, from.Name, src, o, d.Verdict, nfttest.Path(o))
			continue
		}
		if want != trace.VerdictDNAT {
			continue
		}
		share[o.Dst] += o.Probability
		hairpin := !p.Local && o.Dst.Addr() == p.Src && slices.Contains(port.Hairpin(), p.Src)
		if o.Masquerade != (d.Masquerade || hairpin) {
			t.Errorf("%s: %s from %s (%s): masquerade %v, the intent says %v (hairpin %v); path:%s", p, fe, from.Name, src, o.Masquerade, d.Masquerade, hairpin, nfttest.Path(o))
		}
	}
	if want != trace.VerdictDNAT {
		return
	}
	wantShare := map[netip.AddrPort]float64{}
	switch {
	case port.Algorithm == proxy.AlgorithmSourceHash && len(d.Endpoints) <= proxy.MaxSourceHashEndpoints:
		// One endpoint: the slot of the client's address.
		slot := trace.ClusterSlot(p.Src, proxy.SourceHashSeed, proxy.SourceHashSlots)
		wantShare[d.Endpoints[proxy.SourceHashTable(d.Endpoints)[slot]].AddrPort()] = 1
	default:
		total := 0.0
		for i := range d.Endpoints {
			total += nfttest.Weight(d.Weights, i)
		}
		for i, ep := range d.Endpoints {
			wantShare[ep.AddrPort()] += nfttest.Weight(d.Weights, i) / total
		}
	}
	if !nfttest.SameShares(share, wantShare) {
		t.Errorf("%s: %s from %s (%s): endpoints %v, the intent says %v", p, fe, from.Name, src, nfttest.FmtShares(share), nfttest.FmtShares(wantShare))
	}
}

// checkRow checks the outcomes against the row, as platform/linux/iptables
// traceRow does for the iptables mode.
func (e *behaviourEnv) checkRow(t *testing.T, row proxytest.Row, outs []trace.Outcome) {
	t.Helper()
	p, _ := e.packet(t, row)
	reached := map[string]bool{}
	for _, o := range outs {
		if got := experienced(o); got != row.Expect.Outcome {
			t.Errorf("%s: outcome %v (%s), want %s; path:%s", p, o, got, row.Expect.Outcome, nfttest.Path(o))
			continue
		}
		if row.Expect.Outcome != proxytest.Answer {
			continue
		}
		name := e.topo.HostByAddr(o.Dst.Addr())
		if o.Dst.Port() != proxytest.EchoPort || !slices.Contains(row.Expect.Backends, name) {
			t.Errorf("%s: reaches %s (%s), want one of %v on port %d; path:%s", p, o.Dst, name, row.Expect.Backends, proxytest.EchoPort, nfttest.Path(o))
			continue
		}
		reached[name] = true
		switch row.Expect.Source {
		case proxytest.SourceClient:
			if o.Masquerade && !p.Local {
				t.Errorf("%s: masqueraded, want the client's own source; path:%s", p, nfttest.Path(o))
			}
		case proxytest.SourceNode:
			if !o.Masquerade && !p.Local {
				t.Errorf("%s: not masqueraded, want a node source; path:%s", p, nfttest.Path(o))
			}
		}
		if row.Expect.Sticky {
			e.checkSticky(t, p, o)
		}
	}
	if row.Expect.Outcome == proxytest.Answer && len(reached) != len(row.Expect.Backends) {
		t.Errorf("%s: reaches %v, want every one of %v", p, slices.Sorted(mapsKeys(reached)), row.Expect.Backends)
	}
}
