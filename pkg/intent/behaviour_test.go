package intent_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/test/proxytest"
)

// nodeWide are the targets whose outcome depends on node-wide settings (the
// NodePort addresses), not on a service port's intent: each renderer's own
// behaviour tests check them.
var nodeWide = map[proxytest.Target]bool{
	proxytest.TargetLocalhostNodePort: true,
	proxytest.TargetSecondaryNodePort: true,
}

// TestBehaviourTable checks every row of the shared behaviour table against
// the intent, once for all platforms: the objects go through the shared
// cache, the intent of node1's ports is built, and each row's client, by its
// source class and address, must get what the row expects (DNAT to one of
// its backends, seen masqueraded or not, REJECT, DROP). Renderers are then
// checked against the same rows (platform/linux/iptables, platform/windows).
func TestBehaviourTable(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	topo := tb.Topology
	node1, _ := topo.Node(topo.ProxyNode)
	checked := 0
	for _, pc := range tb.Configs() {
		nodes, svcs, slices := tb.Objects(pc)
		var nodeObj *v1.Node
		for _, n := range nodes {
			if n.Name == topo.ProxyNode {
				nodeObj = n
			}
		}
		snap := cache.Build(topo.ProxyNode, nodeObj, svcs, slices)
		for _, row := range tb.RowsFor(pc) {
			if nodeWide[row.Target] {
				continue
			}
			cfg := intent.Config{Family: row.Family, MasqueradeAll: pc.MasqueradeAll, PodSources: pc.ClusterCIDR, NodeIPs: node1.Addrs(row.Family)}
			t.Run(row.Name, func(t *testing.T) {
				checkRow(t, topo, snap.Family(row.Family), cfg, row)
			})
			checked++
		}
	}
	if checked < 100 {
		t.Fatalf("only %d rows checked", checked)
	}
}

// SourceOf classifies a topology host the way node1 does with cfg: a pod
// (of any node) is FromPod when pods can be told apart, node1 is FromNode,
// anything else FromOutside.
func sourceOf(topo *proxytest.Topology, h proxytest.Host, podSources bool) intent.Source {
	switch {
	case h.Role == proxytest.RoleNode && h.Name == topo.ProxyNode:
		return intent.FromNode
	case h.Role == proxytest.RolePod && podSources:
		return intent.FromPod
	}
	return intent.FromOutside
}

func checkRow(t *testing.T, topo *proxytest.Topology, view *proxy.FamilyView, cfg intent.Config, row proxytest.Row) {
	from, _ := topo.Host(row.From)
	dst, err := row.Address(topo)
	if err != nil {
		t.Fatal(err)
	}
	var fe *intent.Frontend
	var port *intent.Port
	for _, sp := range view.Sorted() {
		if sp.Name.Name != row.Service || sp.Protocol != row.Protocol {
			continue
		}
		p, problems := intent.Build(cfg, sp, nil)
		if len(problems) > 0 {
			t.Fatalf("problems: %v", problems)
		}
		if f := p.Lookup(dst, row.Target == proxytest.TargetNodePort); f != nil {
			fe, port = f, p
		}
	}
	if fe == nil {
		// No frontend: kproxy does not capture the address, nothing on the
		// node owns it, and the connection goes nowhere.
		if row.Expect.Outcome != proxytest.Dropped {
			t.Fatalf("no frontend for %s, want %s", dst, row.Expect.Outcome)
		}
		return
	}
	src := sourceOf(topo, from, cfg.PodSources)
	d := port.Decide(fe, src, from.Addr(row.Family))
	want := map[proxytest.Outcome]intent.Verdict{
		proxytest.Answer: intent.DNAT, proxytest.Rejected: intent.Reject, proxytest.Dropped: intent.Drop,
	}[row.Expect.Outcome]
	if d.Verdict != want {
		t.Fatalf("%s from %s (%s): %s, want %s", fe, from.Name, src, d.Verdict, want)
	}
	if want != intent.DNAT {
		return
	}
	var names []string
	for _, ep := range d.Endpoints {
		names = append(names, topo.HostByAddr(ep.IP))
	}
	slices.Sort(names)
	wantNames := slices.Clone(row.Expect.Backends)
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("%s from %s (%s): endpoints %v, want %v", fe, from.Name, src, names, wantNames)
	}
	for _, ep := range d.Endpoints {
		if ep.Port != proxytest.EchoPort {
			t.Errorf("endpoint %s: want port %d", ep, proxytest.EchoPort)
		}
	}
	// A pod reaching itself is masqueraded whatever the route (hairpin).
	hairpin := slices.Contains(port.Hairpin(), from.Addr(row.Family)) && len(d.Endpoints) == 1
	masq := d.Masquerade || hairpin
	switch row.Expect.Source {
	case proxytest.SourceClient:
		if masq && from.Role != proxytest.RoleNode {
			t.Errorf("%s from %s (%s): masqueraded, want the client's source", fe, from.Name, src)
		}
	case proxytest.SourceNode:
		if !masq && !(from.Role == proxytest.RoleNode && from.Name == topo.ProxyNode) {
			t.Errorf("%s from %s (%s): not masqueraded, want a node source", fe, from.Name, src)
		}
	}
	if row.Expect.Sticky && port.AffinitySeconds <= 0 {
		t.Errorf("want session affinity")
	}
}

// TestFrontendOrder: the ClusterIP first, then NodePort, externalIPs and
// load balancer IPs; invalid addresses are left out with a problem naming
// the field.
func TestFrontendOrder(t *testing.T) {
	sp := &proxy.ServicePort{
		Name:   proxy.ServicePortName{Port: "p", Protocol: v1.ProtocolTCP},
		Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP,
		ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, NodePort: 30080,
		ExternalIPs:     []netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("fd00::1")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.168.2.1")},
		ClusterEndpoints: []proxy.Endpoint{
			{IP: netip.MustParseAddr("10.244.0.1"), Port: 8080, Ready: true, Serving: true},
			{IP: netip.MustParseAddr("fd00::5"), Port: 8080, Ready: true, Serving: true},
		},
		HasAnyEndpoints: true,
	}
	sp.Name.Name, sp.Name.Namespace = "s", "ns"
	p, problems := intent.Build(intent.Config{Family: v1.IPv4Protocol, PodSources: true}, sp, nil)
	var kinds []string
	for _, fe := range p.Frontends {
		kinds = append(kinds, fe.String())
	}
	if got, want := strings.Join(kinds, ", "), "ClusterIP 10.96.0.1:80, NodePort :30080, externalIP 192.168.1.1:80, LoadBalancer IP 192.168.2.1:80"; got != want {
		t.Errorf("frontends %s, want %s", got, want)
	}
	if len(p.Cluster) != 1 {
		t.Errorf("cluster endpoints %v, want the IPv4 one only", p.Cluster)
	}
	var msgs []string
	for _, pr := range problems {
		msgs = append(msgs, pr.Reason+": "+pr.Message)
	}
	want := []string{
		`InvalidField: service port ns/s:p: externalIPs[1]: "fd00::1" is not a valid IPv4 address`,
		`InvalidEndpoint: service port ns/s:p: clusterEndpoints[1]: endpoint [fd00::5]:8080 is not a valid IPv4 address and port`,
	}
	slices.Sort(msgs)
	slices.Sort(want)
	if !slices.Equal(msgs, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
	sp2 := *sp
	sp2.ClusterIP = netip.MustParseAddr("fd00::10")
	if p, problems := intent.Build(intent.Config{Family: v1.IPv4Protocol}, &sp2, nil); p != nil || len(problems) != 1 || problems[0].Reason != proxy.ReasonInvalidServicePort {
		t.Errorf("invalid ClusterIP: got %v %v, want no port and one InvalidServicePort problem", p, problems)
	}
}

// TestPreserveDestinationRoutes: the preserve-destination annotation is
// decided here, as routes. Where the platform honours it, the NodePort
// serves only this node's endpoints (masqueraded unless
// externalTrafficPolicy is Local), the load balancer IPs too, unmasqueraded
// and keeping the destination; the externalIPs and the ClusterIP are left
// as without it. Where the platform ignores it (Linux, as upstream), every
// route is the annotation-free one.
func TestPreserveDestinationRoutes(t *testing.T) {
	local := proxy.Endpoint{IP: netip.MustParseAddr("10.244.1.5"), Port: 8080, Ready: true, Serving: true, Local: true}
	remote := proxy.Endpoint{IP: netip.MustParseAddr("10.244.2.5"), Port: 8080, Ready: true, Serving: true}
	mk := func(etpLocal bool, eps ...proxy.Endpoint) *proxy.ServicePort {
		sp := &proxy.ServicePort{
			Name:   proxy.ServicePortName{Port: "p", Protocol: v1.ProtocolTCP},
			Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP,
			ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, NodePort: 30080,
			ExternalIPs:         []netip.Addr{netip.MustParseAddr("192.168.1.1")},
			LoadBalancerIPs:     []netip.Addr{netip.MustParseAddr("192.168.2.1")},
			ExternalPolicyLocal: etpLocal, PreserveDestination: true,
			ClusterEndpoints: eps, HasAnyEndpoints: len(eps) > 0,
		}
		for _, ep := range eps {
			if ep.Local {
				sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
			}
		}
		sp.Name.Name, sp.Name.Namespace = "s", "ns"
		return sp
	}
	all := func(r intent.Route) [3]intent.Route { return [3]intent.Route{r, r, r} }
	kept := func(r intent.Route) intent.Route { r.PreserveDestination = true; return r }
	cluster := intent.Route{Verdict: intent.DNAT, Set: intent.Cluster}
	clusterMasq := intent.Route{Verdict: intent.DNAT, Set: intent.Cluster, Masquerade: true}
	localRoute := intent.Route{Verdict: intent.DNAT, Set: intent.Local}
	localMasq := intent.Route{Verdict: intent.DNAT, Set: intent.Local, Masquerade: true}
	drop := intent.Route{Verdict: intent.Drop}
	for _, tc := range []struct {
		name            string
		honoured        bool
		sp              *proxy.ServicePort
		np, extIP, lbIP [3]intent.Route
	}{
		{"honoured, policy Cluster", true, mk(false, local, remote), all(localMasq), all(clusterMasq), all(kept(localRoute))},
		{"honoured, policy Local", true, mk(true, local, remote), all(localRoute),
			[3]intent.Route{cluster, clusterMasq, localRoute}, all(kept(localRoute))},
		{"honoured, none here", true, mk(false, remote), all(drop), all(clusterMasq), all(kept(drop))},
		{"ignored (Linux), policy Cluster", false, mk(false, local, remote), all(clusterMasq), all(clusterMasq), all(clusterMasq)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := intent.Config{Family: v1.IPv4Protocol, PodSources: true, PreserveDestination: tc.honoured}
			p, problems := intent.Build(cfg, tc.sp, nil)
			if len(problems) != 0 {
				t.Fatalf("problems %v", problems)
			}
			if got := p.ClusterIP().Routes; got != all(cluster) && got != [3]intent.Route{cluster, clusterMasq, clusterMasq} {
				t.Errorf("ClusterIP routes %+v changed", got)
			}
			for i, want := range [][3]intent.Route{tc.np, tc.extIP, tc.lbIP} {
				if got := p.Frontends[i+1].Routes; got != want {
					t.Errorf("%s routes %+v, want %+v", &p.Frontends[i+1], got, want)
				}
			}
		})
	}
}
