package windows

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
	"github.com/kproxy/kproxy/test/proxytest"
)

// windowsAnswers are what HNS-side kproxy does for the rows of the shared
// table whose Linux expectation HNS cannot meet, keyed by
// "<case>/<from>-><target>" (both protocols and families): the rows the
// table marks unsupported on Windows, and those where HNS reaches only part
// of the expected backends. Each is asserted like any other row (the
// outcome, the source, and exactly the backends reached), so a change in
// what the HNS backend does is caught here. docs/windows.md has the same
// list for users.
var windowsAnswers = map[string]windowsAnswer{
	// No reject in HNS: a frontend without endpoints has no load balancer.
	"no-endpoints/client-1->clusterip": {dropped(), reasonNoReject},
	"no-endpoints/node1->clusterip":    {dropped(), reasonNoReject},
	"no-endpoints/outside->nodeport":   {dropped(), reasonNoReject},
	"no-endpoints/outside->externalip": {dropped(), reasonNoReject},
	"no-endpoints/outside->lbip":       {dropped(), reasonNoReject},

	// One endpoint set per frontend: pods and the node reaching an
	// externalTrafficPolicy Local frontend get its local endpoints (with
	// DSR: their source kept), or nothing when this node has none.
	"etp-local/client-1->externalip":                       {answer(proxytest.SourceClient, local), reasonNoShortCircuit},
	"etp-local/client-1->lbip":                             {answer(proxytest.SourceClient, local), reasonNoShortCircuit},
	"etp-local/client-1->nodeport":                         {answer(proxytest.SourceClient, local), reasonNoShortCircuit},
	"etp-local/node1->nodeport":                            {answer(proxytest.SourceAny, local), reasonNoShortCircuit},
	"etp-local/node1->externalip":                          {answer(proxytest.SourceAny, local), reasonNoShortCircuit},
	"etp-local-no-local-endpoints/client-1->externalip":    {dropped(), reasonNoShortCircuit},
	"etp-local-no-local-endpoints/node1->nodeport":         {dropped(), reasonNoShortCircuit},
	"itp-etp-local-remote-only/client-1->externalip":       {dropped(), reasonNoShortCircuit},
	"itp-etp-local-remote-only/client-1->lbip":             {dropped(), reasonNoShortCircuit},
	"itp-etp-local-remote-only/client-1->nodeport":         {dropped(), reasonNoShortCircuit},
	"itp-etp-local-remote-only/node1->nodeport":            {dropped(), reasonNoShortCircuit},
	"itp-etp-local-remote-only/node1->externalip":          {dropped(), reasonNoShortCircuit},
	"itp-etp-local-terminating-local/client-1->externalip": {answer(proxytest.SourceClient, local), reasonNoShortCircuit},
	"itp-etp-local-terminating-local/node1->nodeport":      {answer(proxytest.SourceAny, local), reasonNoShortCircuit},
	"itp-etp-local-both/client-1->externalip":              {answer(proxytest.SourceClient, local), reasonNoShortCircuit},
	"itp-etp-local-both/node1->nodeport":                   {answer(proxytest.SourceAny, local), reasonNoShortCircuit},

	// ClusterIP load balancers apply to this node's pods and the node only.
	"cluster-cidr-masquerade/outside->clusterip": {dropped(), reasonClusterIPOutside},
	"no-cluster-cidr/outside->clusterip":         {dropped(), reasonClusterIPOutside},

	// No source filter in HNS: the LB IP answers every source.
	"source-ranges-deny/outside->lbip":         {answer(proxytest.SourceNode, local, remote), reasonSourceRanges},
	"source-ranges-other-family/outside->lbip": {answer(proxytest.SourceNode, local, remote), reasonSourceRanges},

	// --masquerade-all has no HNS equivalent: pod sources are kept.
	"masquerade-all/client-1->clusterip": {answer(proxytest.SourceClient, local, remote), reasonMasqueradeAll},

	// A NodePort load balancer (no frontend VIP) takes every address of the
	// node (no nodePortAddresses), but not localhost.
	"nodeport/node1->localhost-nodeport":                      {dropped(), reasonLocalhost},
	"nodeport-addresses-all/client-1->secondary-nodeport":     {answer(proxytest.SourceNode, local, remote), reasonNodePortAddrs},
	"nodeport-addresses-primary/client-1->secondary-nodeport": {answer(proxytest.SourceNode, local, remote), reasonNodePortAddrs},
}

// windowsAnswer is a row's expectation on Windows, and why it differs.
type windowsAnswer struct {
	expect proxytest.Expect
	reason string
}

const (
	local, remote          = proxytest.PodA1, proxytest.PodB1
	reasonNoReject         = "HNS cannot reject: a service port without endpoints has no load balancer, so traffic is dropped, not refused"
	reasonNoShortCircuit   = "HNS keeps one endpoint set per frontend: pods and the node reaching an externalTrafficPolicy Local frontend get the local endpoints, not the cluster-wide ones"
	reasonClusterIPOutside = "HNS applies ClusterIP load balancers to traffic from this node's pods and the node itself, not to traffic routed in from outside"
	reasonSourceRanges     = "HNS load balancers cannot filter by source address: the LoadBalancer IP answers every client"
	reasonMasqueradeAll    = "--masquerade-all has no HNS equivalent: pod sources stay unmasqueraded"
	reasonLocalhost        = "Windows has no localhost NodePorts: nothing takes 127.0.0.1:<nodePort>"
	reasonNodePortAddrs    = "an HNS NodePort load balancer has no frontend VIP: in kproxy's model of HNS (Resolve) it takes every address of the node, the pod gateway address too, whatever --nodeport-addresses says (not proven on a real node)"
)

func answer(src proxytest.Source, backends ...string) proxytest.Expect {
	return proxytest.Expect{Outcome: proxytest.Answer, Source: src, Backends: backends}
}

func dropped() proxytest.Expect { return proxytest.Expect{Outcome: proxytest.Dropped} }

// TestBehaviourTable evaluates the shared behaviour table (test/proxytest)
// against the fake HNS: the table's objects go through the shared cache,
// two Backends (IPv4 and IPv6) program a fakehns.Fake for node1 on an L2Bridge
// network, and a resolver answers each row from the load balancers HNS holds,
// under the model in hnsResolver.
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

		f := fakehns.New(wt.HNSModern)
		netID := f.AddNetwork(hns.Network{Name: "cbr0", Type: hns.NetworkTypeL2Bridge})
		for _, pod := range topo.PodsOn(topo.ProxyNode) { // the CNI's endpoints
			f.AddEndpoint(hns.Endpoint{HostComputeNetwork: netID, Name: pod.Name,
				IPConfigurations: []hns.IPConfig{{IPAddress: pod.IPv4.String()}, {IPAddress: pod.IPv6.String()}}})
		}
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			b, err := New(Options{HNS: f, Family: fam, NetworkName: "cbr0",
				Interfaces: func() ([]HostInterface, error) {
					return []HostInterface{{Name: "Ethernet", MAC: "00-15-5d-00-00-01", Addrs: []netip.Addr{node1.IPv4, node1.IPv6}}}, nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			if err := syncSnap(context.Background(), b, snap, proxy.Changes{Full: true}); err != nil {
				t.Fatalf("%s %s: sync: %v", pc, fam, err)
			}
		}
		r := newResolver(t, f, netID, topo)
		for _, row := range tb.RowsFor(pc) {
			key := fmt.Sprintf("%s/%s->%s", row.Case.Name, row.From, row.Target)
			wa, differs := windowsAnswers[key]
			if reason := row.Skip(proxytest.Windows); reason != "" && !differs {
				t.Errorf("%s: marked unsupported on Windows (%s), but windowsAnswers says nothing of what Windows does", row.Name, reason)
				continue
			}
			if differs {
				row.Expect = wa.expect
				if row.Expect.Outcome == proxytest.Answer {
					row.Attempts = max(row.Attempts, 4)
				} else {
					row.Attempts = 1
				}
			}
			row := row
			t.Run(row.Name, func(t *testing.T) {
				obs, reached, err := r.resolve(row)
				if err != nil {
					t.Fatal(err)
				}
				if err := row.Check(topo, obs); err != nil {
					if differs {
						t.Errorf("Windows' documented answer (%s): %v", wa.reason, err)
					} else {
						t.Error(err)
					}
				}
				if row.Expect.Outcome == proxytest.Answer &&
					strings.Join(reached, ",") != strings.Join(sortedStrings(row.Expect.Backends), ",") {
					t.Errorf("reaches %v, want every one of %v", reached, row.Expect.Backends)
				}
			})
		}
	}
	// Every documented difference must still be a row of the table.
	for key := range windowsAnswers {
		if !tableHas(tb, key) {
			t.Errorf("windowsAnswers lists %q, which the table no longer has", key)
		}
	}
}

func tableHas(tb *proxytest.Table, key string) bool {
	for _, row := range tb.Rows {
		if fmt.Sprintf("%s/%s->%s", row.Case.Name, row.From, row.Target) == key {
			return true
		}
	}
	return false
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// hnsResolver maps the rows of the table onto Resolve, over the load
// balancers a fakehns.Fake holds (read back through LiveLoadBalancers, as
// `kproxy explain --live` does). A backend port other than the echo port
// counts as dropped (nothing listens there).
type hnsResolver struct {
	topo *proxytest.Topology
	lbs  map[v1.IPFamily][]*plan.LBSpec
}

func newResolver(t *testing.T, f *fakehns.Fake, netID string, topo *proxytest.Topology) *hnsResolver {
	t.Helper()
	r := &hnsResolver{topo: topo, lbs: map[v1.IPFamily][]*plan.LBSpec{}}
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		lbs, problems := reconcile.LiveLoadBalancers(fam, netID, f.Endpoints(), f.LoadBalancers())
		if len(problems) > 0 {
			t.Fatalf("%s: load balancers not understood: %v", fam, problems)
		}
		r.lbs[fam] = lbs
	}
	return r
}

func (r *hnsResolver) resolve(row proxytest.Row) ([]proxytest.Observation, []string, error) {
	from, ok := r.topo.Host(row.From)
	if !ok {
		return nil, nil, fmt.Errorf("unknown client %s", row.From)
	}
	dst, err := row.Address(r.topo)
	if err != nil {
		return nil, nil, err
	}
	node, _ := r.topo.Node(r.topo.ProxyNode)
	origin := plan.OriginRemote
	switch {
	case from.Role == proxytest.RoleNode && from.Name == r.topo.ProxyNode:
		origin = plan.OriginNode
	case from.Node == r.topo.ProxyNode:
		origin = plan.OriginPod
	}
	c := plan.Conn{Protocol: plan.ProtocolNumber(row.Protocol), Src: from.Addr(row.Family), Dst: dst, From: origin,
		NodeAddrs: node.Addrs(row.Family)}
	res := plan.Resolve(r.lbs[row.Family], c)
	obs := make([]proxytest.Observation, row.Attempts)
	if res.LB == nil {
		for i := range obs {
			obs[i] = proxytest.Observation{Outcome: proxytest.Dropped, Detail: "no HNS load balancer for " + dst.String()}
		}
		return obs, nil, nil
	}
	reachedSet := map[string]bool{}
	for i := range obs {
		be := res.Pick
		if !be.IsValid() {
			be = res.Endpoints[i%len(res.Endpoints)]
		}
		src := c.Src
		if res.SeesNode(c, be) {
			src = node.Addr(row.Family)
		}
		if res.LB.InternalPort != proxytest.EchoPort {
			obs[i] = proxytest.Observation{Outcome: proxytest.Dropped, Detail: fmt.Sprintf("internal port %d", res.LB.InternalPort)}
			continue
		}
		name := r.topo.HostByAddr(be)
		obs[i] = proxytest.Observation{Outcome: proxytest.Answer, Backend: name, Source: src}
		reachedSet[name] = true
	}
	// Every endpoint of the load balancer is reachable by some client (with
	// affinity, each client sticks to one of them).
	for _, be := range res.Endpoints {
		reachedSet[r.topo.HostByAddr(be)] = true
	}
	var reached []string
	for n := range reachedSet {
		reached = append(reached, n)
	}
	sort.Strings(reached)
	return obs, reached, nil
}
