package iptables

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/linux/trace"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestBehaviourTable runs the shared behaviour table (test/proxytest) against
// the generated rules with the packet tracer: the objects go through the
// shared cache, the planner renders node1's rules, and each row's first
// packet is followed through the nat and filter tables. The same rows run on
// a real kernel in test/e2e.
func TestBehaviourTable(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	topo := tb.Topology
	node1, _ := topo.Node(topo.ProxyNode)
	for _, pc := range tb.Configs() {
		nodes, svcs, slices := tb.Objects(pc)
		var nodeObj *v1.Node
		for _, n := range nodes {
			if n.Name == topo.ProxyNode {
				nodeObj = n
			}
		}
		snap := cache.Build(topo.ProxyNode, nodeObj, svcs, slices)
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
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
			local := append(node1.Addrs(fam), netip.MustParseAddr(map[v1.IPFamily]string{v1.IPv4Protocol: "127.0.0.1", v1.IPv6Protocol: "::1"}[fam]))
			plan := planned(mustPlanner(t, cfg), testInput{View: snap.Family(fam), Node: snap.Node, LocalAddrs: local, Changes: fullChanges})
			if pr := unexpected(tb, problems(plan)); len(pr) > 0 {
				t.Fatalf("%s %s: problems: %v", pc, fam, pr)
			}
			rs := iptmodel.New()
			kernel(t, rs, plan)
			h := trace.Host{LocalAddrs: local}
			for _, row := range tb.RowsFor(pc) {
				if row.Family != fam {
					continue
				}
				if reason := row.Skip(proxytest.Linux); reason != "" {
					t.Logf("%s: skipped on Linux: %s", row.Name, reason)
					continue
				}
				t.Run(row.Name, func(t *testing.T) { traceRow(t, topo, rs, h, row) })
			}
		}
	}
}

func traceRow(t *testing.T, topo *proxytest.Topology, rs *iptmodel.Ruleset, h trace.Host, row proxytest.Row) {
	from, ok := topo.Host(row.From)
	if !ok {
		t.Fatalf("unknown client %s", row.From)
	}
	dst, err := row.Address(topo)
	if err != nil {
		t.Fatal(err)
	}
	pkt := trace.Packet{
		Src: from.Addr(row.Family), Dst: dst.Addr(), Proto: strings.ToLower(string(row.Protocol)),
		SrcPort: 40000, DstPort: dst.Port(), Local: from.Name == topo.ProxyNode,
	}
	if pkt.Local && dst.Addr().IsLoopback() {
		pkt.Src = dst.Addr()
	}
	outs, err := rs.Trace(h, pkt)
	if err != nil {
		t.Fatalf("%s: %v", pkt, err)
	}
	want := map[proxytest.Outcome]trace.Verdict{
		proxytest.Answer: trace.VerdictDNAT, proxytest.Rejected: trace.VerdictReject, proxytest.Dropped: trace.VerdictDrop,
	}[row.Expect.Outcome]
	reached := map[string]bool{}
	for _, o := range outs {
		// What the rules leave alone meets the rest of the topology: the
		// node's stack refuses a connection to a port nothing listens on,
		// and an address nobody owns (one kproxy does not capture) is a
		// black hole.
		if o.Verdict == trace.VerdictAccept {
			switch o.Delivered {
			case "local":
				o.Verdict = trace.VerdictReject
			case "forward", "out":
				o.Verdict = trace.VerdictDrop
			}
		}
		if o.Verdict != want {
			t.Errorf("%s: outcome %v, want %s (path %s)", pkt, o, row.Expect.Outcome, strings.Join(o.Path, " "))
			continue
		}
		if want != trace.VerdictDNAT {
			continue
		}
		name := topo.HostByAddr(o.Dst.Addr())
		if !o.DNAT || o.Dst.Port() != proxytest.EchoPort || !contains(row.Expect.Backends, name) {
			t.Errorf("%s: reaches %s (%s), want one of %v on port %d (path %s)", pkt, o.Dst, name, row.Expect.Backends, proxytest.EchoPort, strings.Join(o.Path, " "))
			continue
		}
		reached[name] = true
		switch row.Expect.Source {
		case proxytest.SourceClient:
			if o.Masquerade && !pkt.Local {
				t.Errorf("%s: masqueraded, want the client's own source (path %s)", pkt, strings.Join(o.Path, " "))
			}
		case proxytest.SourceNode:
			if !o.Masquerade && !pkt.Local {
				t.Errorf("%s: not masqueraded, want a node source (path %s)", pkt, strings.Join(o.Path, " "))
			}
		}
		if row.Expect.Sticky && len(o.AffinitySets) != 1 {
			t.Errorf("%s: affinity: recorded in %v, want one recent list", pkt, o.AffinitySets)
		}
	}
	if want == trace.VerdictDNAT && len(reached) != len(row.Expect.Backends) {
		t.Errorf("%s: reaches %v, want every one of %v", pkt, reached, row.Expect.Backends)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// unexpected returns the problems the table does not expect: every one but
// the FrontendConflict of a contender (see proxytest.Case.Contenders).
func unexpected(tb *proxytest.Table, problems []proxy.Unsupported) []proxy.Unsupported {
	var out []proxy.Unsupported
	for _, u := range problems {
		if u.Reason == intent.ReasonFrontendConflict && tb.Contender(u.Service.Namespace, u.Service.Name) {
			continue
		}
		out = append(out, u)
	}
	return out
}
