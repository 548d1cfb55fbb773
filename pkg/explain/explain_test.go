package explain

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// noTrace answers every query with one DNAT target.
type noTrace struct{}

func (noTrace) Trace(Query) (*Trace, error) {
	return &Trace{Targets: []Target{{Verdict: DNAT, Endpoint: "10.244.1.5:8080", Probability: 1}}}, nil
}

func port(name string, clusterIP string, opts func(*proxy.ServicePort)) *proxy.ServicePort {
	ep := proxy.Endpoint{IP: netip.MustParseAddr("10.244.1.5"), Port: 8080, Ready: true, Serving: true, Local: true}
	sp := &proxy.ServicePort{
		Name:   proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Protocol: v1.ProtocolTCP},
		Family: v1.IPv4Protocol, Protocol: v1.ProtocolTCP, Type: v1.ServiceTypeClusterIP,
		ClusterIP: netip.MustParseAddr(clusterIP), Port: 80,
		ClusterEndpoints: []proxy.Endpoint{ep}, LocalEndpoints: []proxy.Endpoint{ep}, HasAnyEndpoints: true,
	}
	if opts != nil {
		opts(sp)
	}
	return sp
}

func view(ports ...*proxy.ServicePort) *intent.View {
	m := map[proxy.ServicePortName]*proxy.ServicePort{}
	for _, sp := range ports {
		m[sp.Name] = sp
	}
	snap := &proxy.Snapshot{Node: proxy.Node{Name: "node1", Known: true}, IPv4: proxy.NewFamilyView(v1.IPv4Protocol, m)}
	return intent.NewBuilder(v1.IPv4Protocol).Build(intent.Input{Config: intent.Config{PodSources: true},
		Ports: snap.IPv4, Node: snap.Node, Changes: proxy.Changes{Full: true}})
}

// An address that is one Service's externalIP and another's ClusterIP
// goes where the proxy programs it, to the ClusterIP's Service (the
// intent's ownership: ClusterIP claims first), although the other comes
// first by name.
func TestFrontendIsTheIntentsOwner(t *testing.T) {
	v := view(
		port("a-external", "10.96.0.10", func(sp *proxy.ServicePort) { sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("10.96.0.20")} }),
		port("b-cluster", "10.96.0.20", nil),
	)
	q := Query{To: netip.MustParseAddrPort("10.96.0.20:80"), Protocol: v1.ProtocolTCP, From: netip.MustParseAddr("10.244.1.9"), Origin: FromPod}
	res, err := Explain("test", false, v, q, noTrace{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Frontend == nil || res.Frontend.Service != "ns/b-cluster" || res.Frontend.Kind != KindClusterIP {
		t.Errorf("frontend %+v, want the ClusterIP of ns/b-cluster", res.Frontend)
	}
}

// The decisions are the intent's route for the client's kind: a pod
// reaching the NodePort of a Service whose external policy is Local, with
// its only endpoint on another node, is short-circuited to the cluster
// endpoints; an outside client is dropped.
func TestDecisionsFollowTheRoute(t *testing.T) {
	remote := proxy.Endpoint{IP: netip.MustParseAddr("10.244.2.5"), Port: 8080, Ready: true, Serving: true}
	v := view(port("web", "10.96.0.10", func(sp *proxy.ServicePort) {
		sp.Type, sp.NodePort, sp.ExternalPolicyLocal = v1.ServiceTypeNodePort, 30080, true
		sp.ClusterEndpoints, sp.LocalEndpoints = []proxy.Endpoint{remote}, nil
	}))
	node := netip.MustParseAddr("192.168.50.11")
	for _, tc := range []struct {
		origin  Origin
		verdict Verdict
		want    string
	}{
		{FromPod, DNAT, "short-circuited to the cluster-wide endpoints (1)"},
		{FromOutside, Drop, "no usable endpoint on this node under a Local policy: connections are dropped"},
	} {
		q := Query{To: netip.AddrPortFrom(node, 30080), Protocol: v1.ProtocolTCP, From: netip.MustParseAddr("10.244.1.9"), Origin: tc.origin, NodeAddrs: []netip.Addr{node}}
		p, fe := FindFrontend(v, q)
		if p == nil || fe.Kind != intent.NodePort {
			t.Fatalf("%s: frontend %v", tc.origin, fe)
		}
		ds := strings.Join(Decisions(p, fe, q, tc.verdict), "\n")
		if !strings.Contains(ds, tc.want) {
			t.Errorf("%s: decisions\n%s\nwant %q", tc.origin, ds, tc.want)
		}
	}
}
