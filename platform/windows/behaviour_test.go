package windows

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/pkg/proxytest"
)

// windowsDifferences are rows of the shared table whose Linux expectation
// HNS cannot meet, keyed by "<case>/<from>-><target>" (both protocols and
// families). They should become Unsupported marks in pkg/proxytest.
var windowsDifferences = map[string]string{
	"no-endpoints/client-1->clusterip": reasonNoReject,
	"no-endpoints/node1->clusterip":    reasonNoReject,
	"no-endpoints/outside->nodeport":   reasonNoReject,
	"no-endpoints/outside->externalip": reasonNoReject,
	"no-endpoints/outside->lbip":       reasonNoReject,

	"etp-local-no-local-endpoints/client-1->externalip": reasonNoShortCircuit,
	"etp-local-no-local-endpoints/node1->nodeport":      reasonNoShortCircuit,

	"cluster-cidr-masquerade/outside->clusterip": reasonClusterIPOutside,
	"no-cluster-cidr/outside->clusterip":         reasonClusterIPOutside,

	"masquerade-all/client-1->clusterip": "--masquerade-all has no HNS equivalent: pod sources stay unmasqueraded",
}

// windowsNarrower are rows where HNS reaches only part of the expected
// backends (every answer is still an expected one).
var windowsNarrower = map[string]string{
	"etp-local/client-1->externalip": reasonNoShortCircuit,
	"etp-local/client-1->lbip":       reasonNoShortCircuit,
	"etp-local/client-1->nodeport":   reasonNoShortCircuit,
	"etp-local/node1->nodeport":      reasonNoShortCircuit,
	"etp-local/node1->externalip":    reasonNoShortCircuit,
}

const (
	reasonNoReject         = "HNS cannot reject: a service port without endpoints has no load balancer, so traffic is dropped, not refused"
	reasonNoShortCircuit   = "HNS keeps one endpoint set per frontend: pods and the node reaching an externalTrafficPolicy Local frontend get the local endpoints, not the cluster-wide ones"
	reasonClusterIPOutside = "HNS applies ClusterIP load balancers to traffic from this node's pods and the node itself, not to traffic routed in from outside"
)

// TestBehaviourTable evaluates the shared behaviour table (pkg/proxytest)
// against the fake HNS: the table's objects go through the shared cache,
// two Backends (IPv4 and IPv6) program a FakeHNS for node1 on an L2Bridge
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

		f := NewFakeHNS(hnsModern)
		netID := f.AddNetwork(Network{Name: "cbr0", Type: NetworkTypeL2Bridge})
		for _, pod := range topo.PodsOn(topo.ProxyNode) { // the CNI's endpoints
			f.AddEndpoint(Endpoint{HostComputeNetwork: netID, Name: pod.Name,
				IPConfigurations: []IPConfig{{IPAddress: pod.IPv4.String()}, {IPAddress: pod.IPv6.String()}}})
		}
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			b, err := New(Options{HNS: f, Family: fam, NetworkName: "cbr0",
				Interfaces: func() ([]HostInterface, error) {
					return []HostInterface{{Name: "Ethernet", MAC: "00-15-5d-00-00-01", Addrs: []netip.Addr{node1.IPv4, node1.IPv6}}}, nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Sync(context.Background(), snap, proxy.Changes{Full: true}); err != nil {
				t.Fatalf("%s %s: sync: %v", pc, fam, err)
			}
		}
		r := newResolver(f, topo)
		for _, row := range tb.RowsFor(pc) {
			key := fmt.Sprintf("%s/%s->%s", row.Case.Name, row.From, row.Target)
			if reason := row.Skip(proxytest.Windows); reason != "" {
				t.Logf("%s: skipped on Windows: %s", row.Name, reason)
				continue
			}
			if reason := windowsDifferences[key]; reason != "" {
				t.Logf("%s: differs on Windows: %s", row.Name, reason)
				continue
			}
			row := row
			t.Run(row.Name, func(t *testing.T) {
				obs, reached, err := r.resolve(row)
				if err != nil {
					t.Fatal(err)
				}
				if err := row.Check(topo, obs); err != nil {
					t.Error(err)
				}
				if row.Expect.Outcome == proxytest.Answer && windowsNarrower[key] == "" &&
					strings.Join(reached, ",") != strings.Join(sortedStrings(row.Expect.Backends), ",") {
					t.Errorf("reaches %v, want every one of %v", reached, row.Expect.Backends)
				}
			})
		}
	}
	// Every documented difference must still be a row of the table.
	for key := range windowsDifferences {
		if !tableHas(tb, key) {
			t.Errorf("windowsDifferences lists %q, which the table no longer has", key)
		}
	}
	for key := range windowsNarrower {
		if !tableHas(tb, key) {
			t.Errorf("windowsNarrower lists %q, which the table no longer has", key)
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

// hnsResolver answers "where does this connection go" from the load
// balancers and endpoints a FakeHNS holds, under this model of HNS (VFP):
//   - a load balancer matches a connection by protocol, family, frontend VIP
//     and external port; a load balancer without frontend VIP (a NodePort)
//     matches every address of the node, and from the node itself only with
//     the LocalRoutedVIP flag;
//   - load balancers without the VIPExternalIP flag (ClusterIPs) apply to
//     traffic from this node's pods and from the node, not to traffic routed
//     in from elsewhere;
//   - no matching load balancer: the packet is dropped (HNS has no reject);
//   - the SourceIP distribution keeps a client address on one endpoint;
//   - the backend sees the client's address through ClusterIP and DSR load
//     balancers, and a node address through other external frontends, and
//     when a pod reaches itself (hairpin).
type hnsResolver struct {
	topo *proxytest.Topology
	lbs  []LoadBalancer
	ips  map[string][]netip.Addr // endpoint ID → addresses
}

func newResolver(f *FakeHNS, topo *proxytest.Topology) *hnsResolver {
	r := &hnsResolver{topo: topo, lbs: f.LoadBalancers(), ips: map[string][]netip.Addr{}}
	for _, ep := range f.Endpoints() {
		r.ips[strings.ToLower(ep.ID)] = ep.IPs()
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
	onNode := from.Node == r.topo.ProxyNode // a pod on node1 or node1 itself
	isNode := from.Role == proxytest.RoleNode && from.Name == r.topo.ProxyNode
	v6 := row.Family == v1.IPv6Protocol
	proto := protocolNumber(row.Protocol)

	var lb *LoadBalancer
	for i := range r.lbs {
		c := &r.lbs[i]
		pm := c.PortMappings[0]
		if (c.Flags&LBFlagIPv6 != 0) != v6 || pm.Protocol != proto || pm.ExternalPort != dst.Port() {
			continue
		}
		external := pm.Flags&PortFlagVIPExternalIP != 0
		switch {
		case len(c.FrontendVIPs) == 0:
			if !r.topo.IsNodeAddr(r.topo.ProxyNode, dst.Addr()) || !external || (isNode && pm.Flags&PortFlagLocalRoutedVIP == 0) {
				continue
			}
		case c.FrontendVIPs[0] != dst.Addr().String():
			continue
		case !external && !onNode:
			continue
		}
		lb = c
		break
	}
	obs := make([]proxytest.Observation, row.Attempts)
	if lb == nil {
		for i := range obs {
			obs[i] = proxytest.Observation{Outcome: proxytest.Dropped, Detail: "no HNS load balancer for " + dst.String()}
		}
		return obs, nil, nil
	}
	var backends []netip.Addr
	for _, id := range lb.HostComputeEndpoints {
		for _, ip := range r.ips[strings.ToLower(id)] {
			if ip.Is6() == v6 {
				backends = append(backends, ip)
			}
		}
	}
	sort.Slice(backends, func(i, j int) bool { return backends[i].Less(backends[j]) })
	pm := lb.PortMappings[0]
	reachedSet := map[string]bool{}
	client := from.Addr(row.Family)
	for i := range obs {
		pick := i % len(backends)
		if pm.DistributionType == DistributionSourceIP {
			h := fnv.New32a()
			h.Write(client.AsSlice())
			pick = int(h.Sum32() % uint32(len(backends)))
		}
		be := backends[pick]
		name := r.topo.HostByAddr(be)
		src := client
		switch {
		case r.topo.HostByAddr(be) == from.Name:
			src = node.Addr(row.Family) // hairpin
		case lb.Flags&LBFlagDSR != 0:
		case pm.Flags&PortFlagVIPExternalIP != 0:
			src = node.Addr(row.Family)
		}
		if pm.InternalPort != proxytest.EchoPort {
			obs[i] = proxytest.Observation{Outcome: proxytest.Dropped, Detail: fmt.Sprintf("internal port %d", pm.InternalPort)}
			continue
		}
		obs[i] = proxytest.Observation{Outcome: proxytest.Answer, Backend: name, Source: src}
		reachedSet[name] = true
	}
	// Every endpoint of the load balancer is reachable by some client (with
	// affinity, each client sticks to one of them).
	for _, be := range backends {
		reachedSet[r.topo.HostByAddr(be)] = true
	}
	var reached []string
	for n := range reachedSet {
		reached = append(reached, n)
	}
	sort.Strings(reached)
	return obs, reached, nil
}
