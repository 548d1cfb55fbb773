package proxytest_test

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestTableAgreesWithCache cross-checks two independent derivations of the
// same semantics: the backends each row expects, and the endpoints the shared
// cache selects for node1 from the row's objects. A mismatch means the table
// or the cache is wrong; either way a runner would report a confusing failure.
//
// Which endpoint list applies follows the Service proxy rules: ClusterIP
// traffic uses the internal endpoints; external frontends use the external
// endpoints for clients outside node1, and the cluster endpoints for node1
// itself and for pods when the proxy can tell pods apart (--cluster-cidr).
func TestTableAgreesWithCache(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	top := tb.Topology
	node, err := top.NodeObject(top.ProxyNode)
	if err != nil {
		t.Fatal(err)
	}
	snaps := map[*proxytest.Case]*proxy.Snapshot{}
	for _, c := range tb.Cases {
		snaps[c] = cache.Build(top.ProxyNode, node, c.Services, c.Slices)
	}
	for _, r := range tb.Rows {
		t.Run(r.Name, func(t *testing.T) {
			view := snaps[r.Case].Family(r.Family)
			name := proxy.ServicePortName{
				NamespacedName: types.NamespacedName{Namespace: proxytest.Namespace, Name: r.Service},
				Port:           proxytest.PortName(r.Protocol), Protocol: r.Protocol,
			}
			sp := view.Get(name)
			if sp == nil {
				t.Fatalf("cache has no service port %s in %s", name, r.Family)
			}
			from, _ := top.Host(r.From)
			var eps []proxy.Endpoint
			var which string
			switch {
			case r.Target == proxytest.TargetClusterIP:
				eps, which = sp.InternalEndpoints(), "internal"
			case from.Name == top.ProxyNode,
				from.Role == proxytest.RolePod && from.Node == top.ProxyNode && r.Config().ClusterCIDR:
				eps, which = sp.ClusterEndpoints, "cluster (short-circuit)"
			case from.Role == proxytest.RolePod && from.Node == top.ProxyNode:
				eps, which = sp.LocalEndpoints, "local (pods not told apart)"
				if !sp.ExternalPolicyLocal {
					eps, which = sp.ClusterEndpoints, "cluster"
				}
			default:
				eps, which = sp.ExternalEndpoints(), "external"
			}
			got := podNames(top, eps)
			if r.Target == proxytest.TargetLoadBalancerIP && len(sp.LoadBalancerIPs) == 0 {
				if r.Expect.Outcome != proxytest.Dropped {
					t.Errorf("the cache captures no LoadBalancer IP (ipMode Proxy): row should expect a drop")
				}
				return
			}
			if r.Target == proxytest.TargetSecondaryNodePort && r.Config().NodePortAddresses == "primary" {
				if r.Expect.Outcome != proxytest.Rejected {
					t.Errorf("NodePorts only on primary IPs: the secondary address should refuse")
				}
				return
			}
			if r.Target == proxytest.TargetLoadBalancerIP && len(sp.LoadBalancerSourceRanges) > 0 && !inAny(sp.LoadBalancerSourceRanges, from.Addr(r.Family)) {
				if r.Expect.Outcome != proxytest.Dropped {
					t.Errorf("client %s is outside loadBalancerSourceRanges %v: row should expect a drop", from.Addr(r.Family), sp.LoadBalancerSourceRanges)
				}
				return
			}
			switch r.Expect.Outcome {
			case proxytest.Answer:
				want := append([]string(nil), r.Expect.Backends...)
				sort.Strings(want)
				if strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("row expects backends %v, cache selects %s endpoints %v", want, which, got)
				}
			case proxytest.Dropped:
				if len(got) != 0 || !sp.HasAnyEndpoints {
					t.Errorf("row expects a drop, cache selects %s endpoints %v (hasAnyEndpoints %v)", which, got, sp.HasAnyEndpoints)
				}
			case proxytest.Rejected:
				if len(got) != 0 || sp.HasAnyEndpoints {
					t.Errorf("row expects a reject, cache selects %s endpoints %v (hasAnyEndpoints %v)", which, got, sp.HasAnyEndpoints)
				}
			}
		})
	}
}

func inAny(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func podNames(top *proxytest.Topology, eps []proxy.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		name := top.HostByAddr(ep.IP)
		if name == "" {
			name = fmt.Sprintf("?%s", ep.IP)
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
