package main

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/explaincmd"
	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/linux"
	"github.com/kproxy/kproxy/test/proxytest"
)

// tableOptions are kproxy's options for one configuration of the table, set
// through the command-line flags.
func tableOptions(t *testing.T, topo *proxytest.Topology, pc proxytest.Config, mode string) *config.Options {
	t.Helper()
	args := []string{"--hostname-override", topo.ProxyNode, "--proxy-mode", mode}
	if pc.ClusterCIDR {
		var cidrs []string
		for _, p := range topo.ClusterCIDRs() {
			cidrs = append(cidrs, p.String())
		}
		args = append(args, "--cluster-cidr", strings.Join(cidrs, ","))
	}
	if pc.MasqueradeAll {
		args = append(args, "--masquerade-all")
	}
	switch {
	case pc.NodePortAddresses != "":
		args = append(args, "--nodeport-addresses", pc.NodePortAddresses)
	case mode == string(config.ModeNFTables):
		// The nftables mode defaults to the primary node IPs (as
		// upstream's); the table's default is every local address (as in
		// the e2e runs of that mode).
		args = append(args, "--nodeport-addresses", "0.0.0.0/0,::/0")
	}
	return tableOptionsFromArgs(t, args)
}

// tableOptionsFromArgs parses kproxy's flags for a planned explanation.
func tableOptionsFromArgs(t *testing.T, args []string) *config.Options {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o := config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	o.DryRun = true
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

// tableQuery is the explain query of a row, and the row's client.
func tableQuery(t *testing.T, topo *proxytest.Topology, row proxytest.Row) explain.Query {
	t.Helper()
	from, ok := topo.Host(row.From)
	if !ok {
		t.Fatalf("unknown client %s", row.From)
	}
	dst, err := row.Address(topo)
	if err != nil {
		t.Fatal(err)
	}
	q := explain.Query{To: dst, Protocol: row.Protocol, From: from.Addr(row.Family), Origin: explain.FromOutside}
	switch {
	case from.Role == proxytest.RoleNode && from.Name == topo.ProxyNode:
		q.Origin = explain.FromNode
		if dst.Addr().IsLoopback() {
			q.From = dst.Addr()
		}
	case from.Node == topo.ProxyNode:
		q.Origin = explain.FromPod
	}
	return q
}

// reached returns the hosts the DNAT targets reach; an error when a target
// is not an echo server.
func reached(topo *proxytest.Topology, res *explain.Result) ([]string, error) {
	var out []string
	for _, tg := range res.Targets {
		ap, err := netip.ParseAddrPort(tg.Endpoint)
		if err != nil || ap.Port() != proxytest.EchoPort {
			return nil, fmt.Errorf("target %+v is not an echo server", tg)
		}
		out = append(out, topo.HostByAddr(ap.Addr()))
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// TestExplainBehaviourTable: for every row of the shared behaviour table,
// `kproxy explain` (planned) gives the endpoint set and masquerade decision
// the row expects, for the iptables, nftables and kernelspace modes. Rows a
// platform does not support check what it does instead.
func TestExplainBehaviourTable(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	topo := tb.Topology
	node1, _ := topo.Node(topo.ProxyNode)
	checked := map[string]int{}
	for _, pc := range tb.Configs() {
		nodes, svcs, slices := tb.Objects(pc)
		var nodeObj *v1.Node
		for _, n := range nodes {
			if n.Name == topo.ProxyNode {
				nodeObj = n
			}
		}
		snap := cache.Build(topo.ProxyNode, nodeObj, svcs, slices)
		for _, mode := range []string{string(config.ModeIPTables), string(config.ModeNFTables), string(config.ModeKernelspace)} {
			o := tableOptions(t, topo, pc, mode)
			tracers := map[v1.IPFamily]explain.Tracer{}
			views := map[v1.IPFamily]*intent.View{}
			nodeAddrs := map[v1.IPFamily][]netip.Addr{}
			for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				loop := map[v1.IPFamily]netip.Addr{v1.IPv4Protocol: netip.MustParseAddr("127.0.0.1"), v1.IPv6Protocol: netip.IPv6Loopback()}[fam]
				local := append(node1.Addrs(fam), loop)
				switch mode {
				case string(config.ModeIPTables):
					views[fam] = explaincmd.FullView(o, snap, fam, local)
					tr, err := linux.PlannedIptables(modeconfig.IPTables(o, fam), views[fam])
					if err != nil {
						t.Fatal(err)
					}
					tracers[fam], nodeAddrs[fam] = tr, local
					continue
				case string(config.ModeNFTables):
					views[fam] = explaincmd.FullView(o, snap, fam, local)
					tr, err := linux.PlannedNFT(modeconfig.NFTables(o, fam), views[fam])
					if err != nil {
						t.Fatal(err)
					}
					tracers[fam], nodeAddrs[fam] = tr, local
					continue
				}
				tr, v, err := explaincmd.HNSTracer(o, snap, fam, nil, false)
				if err != nil {
					t.Fatal(err)
				}
				views[fam] = v
				tracers[fam], nodeAddrs[fam] = tr, []netip.Addr{node1.Addr(fam)}
			}
			for _, row := range tb.RowsFor(pc) {
				t.Run(mode+"/"+row.Name, func(t *testing.T) {
					q := tableQuery(t, topo, row)
					q.NodeAddrs = nodeAddrs[row.Family]
					res, err := explain.Explain(mode, false, views[row.Family], q, tracers[row.Family])
					if err != nil {
						t.Fatal(err)
					}
					if mode == string(config.ModeKernelspace) {
						checkKernelspaceRow(t, topo, row, q, res)
					} else {
						checkLinuxRow(t, topo, row, q, res)
					}
					checked[mode]++
				})
			}
		}
	}
	if checked["iptables"] < 100 || checked["nftables"] < 100 || checked["kernelspace"] < 100 {
		t.Errorf("rows checked: %v, want the whole table for each mode", checked)
	}
}

func describe(res *explain.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "verdict %s, masquerade %s, targets", res.Verdict, res.Masquerade)
	for _, tg := range res.Targets {
		fmt.Fprintf(&b, " %s:%s:%.2f", tg.Verdict, tg.Endpoint, tg.Probability)
	}
	return b.String()
}

func checkAnswer(t *testing.T, topo *proxytest.Topology, row proxytest.Row, q explain.Query, res *explain.Result, subset bool) {
	t.Helper()
	if res.Verdict != explain.DNAT {
		t.Fatalf("%s, want DNAT to %v", describe(res), row.Expect.Backends)
	}
	got, err := reached(topo, res)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string(nil), row.Expect.Backends...)
	sort.Strings(want)
	ok := slices.Equal(got, want)
	if subset {
		ok = len(got) > 0
		for _, g := range got {
			ok = ok && slices.Contains(want, g)
		}
	}
	if !ok {
		t.Errorf("reaches %v, want %v (%s)", got, want, describe(res))
	}
	var sum float64
	for _, tg := range res.Targets {
		sum += tg.Probability
	}
	if sum < 0.999 || sum > 1.001 {
		t.Errorf("probabilities sum to %v (%s)", sum, describe(res))
	}
	if q.Origin == explain.FromNode {
		return // the node's own source is a node address either way
	}
	for _, tg := range res.Targets {
		hairpin := tg.Endpoint == netip.AddrPortFrom(q.From, proxytest.EchoPort).String()
		switch {
		case row.Expect.Source == proxytest.SourceClient && tg.Masquerade:
			t.Errorf("%s masqueraded, want the client's source (%s)", tg.Endpoint, describe(res))
		case row.Expect.Source == proxytest.SourceNode && !tg.Masquerade && !hairpin:
			t.Errorf("%s not masqueraded, want a node source (%s)", tg.Endpoint, describe(res))
		}
	}
	if row.Expect.Sticky && !strings.Contains(strings.Join(res.Decisions, " "), "sessionAffinity ClientIP") {
		t.Errorf("affinity not named among the decisions %v", res.Decisions)
	}
}

// checkLinuxRow (iptables and nftables): what the rules leave alone meets
// the node's stack, as in the kernel runs: a local destination nothing
// listens on refuses, anything else is lost.
func checkLinuxRow(t *testing.T, topo *proxytest.Topology, row proxytest.Row, q explain.Query, res *explain.Result) {
	if reason := row.Skip(proxytest.Linux); reason != "" {
		t.Skipf("not supported on Linux: %s", reason)
	}
	local := q.To.Addr().IsLoopback() || slices.Contains(q.NodeAddrs, q.To.Addr())
	switch row.Expect.Outcome {
	case proxytest.Answer:
		checkAnswer(t, topo, row, q, res, false)
	case proxytest.Rejected:
		if res.Verdict != explain.Reject && !(res.Verdict == explain.NotHandled && local) {
			t.Errorf("%s, want REJECT (or not handled, to a local address)", describe(res))
		}
	case proxytest.Dropped:
		if res.Verdict != explain.Drop && !(res.Verdict == explain.NotHandled && !local) {
			t.Errorf("%s, want DROP (or not handled, to an address not on the node)", describe(res))
		}
	}
}

// checkKernelspaceRow checks a row against the HNS plan, and for a row HNS
// does not support, what it does instead (by the reason test/proxytest gives).
func checkKernelspaceRow(t *testing.T, topo *proxytest.Topology, row proxytest.Row, q explain.Query, res *explain.Result) {
	reason := row.Skip(proxytest.Windows)
	localPolicy := strings.Contains(strings.Join(res.Decisions, " "), "externalTrafficPolicy Local")
	switch {
	case reason == "":
		switch row.Expect.Outcome {
		case proxytest.Answer:
			// HNS keeps one endpoint set per frontend: a client on the
			// node reaching a Local-policy frontend gets the local ones.
			checkAnswer(t, topo, row, q, res, localPolicy && q.Origin != explain.FromOutside)
		default:
			// No load balancer: HNS has neither reject nor drop; the
			// address is not captured and nothing answers.
			if res.Verdict != explain.NotHandled {
				t.Errorf("%s, want not handled (no load balancer)", describe(res))
			}
		}
	case strings.Contains(reason, "masquerade-all"):
		for _, tg := range res.Targets {
			if res.Verdict != explain.DNAT || tg.Masquerade {
				t.Errorf("%s, want DNAT without masquerade (%s)", describe(res), reason)
			}
		}
	case strings.Contains(reason, "one endpoint set per frontend"):
		if res.Verdict == explain.DNAT {
			for _, tg := range res.Targets {
				if !tg.Local {
					t.Errorf("%s, want only this node's endpoints (%s)", describe(res), reason)
				}
			}
		} else if res.Verdict != explain.NotHandled {
			t.Errorf("%s, want this node's endpoints or not handled (%s)", describe(res), reason)
		}
	case strings.Contains(reason, "loadBalancerSourceRanges"):
		if res.Verdict != explain.DNAT {
			t.Errorf("%s, want DNAT: HNS does not filter (%s)", describe(res), reason)
		}
	case strings.Contains(reason, "cannot reject"):
		// No load balancer for a port without endpoints: the plan knows
		// the frontend is the Service's, and says it is dropped.
		if res.Verdict != explain.Drop {
			t.Errorf("%s, want DROP (%s)", describe(res), reason)
		}
	default:
		// ClusterIP from outside, localhost NodePorts, and NodePorts on
		// an address other than the node IP (the resolver's NodePort load
		// balancers serve the node IP only, so a secondary address is not
		// captured whatever nodePortAddresses says).
		if res.Verdict != explain.NotHandled {
			t.Errorf("%s, want not handled (%s)", describe(res), reason)
		}
	}
}
