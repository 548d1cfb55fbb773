package reconcile

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

const netID = "net-1"

// HNS listings for reconcile tests.
func lep(id, ip string) hns.Endpoint {
	return hns.Endpoint{ID: id, Name: "pod-" + ip, HostComputeNetwork: netID, IPConfigurations: []hns.IPConfig{{IPAddress: ip}}, MacAddress: "00-15-5d-aa-bb-cc"}
}

func rep(id, ip, pa string) hns.Endpoint {
	spec := &plan.EndpointSpec{IP: wt.MustAddr(ip), Role: plan.RoleRemote, MAC: plan.RemoteMAC(wt.MustAddr(ip))}
	if pa != "" {
		spec.ProviderAddress = wt.MustAddr(pa)
	}
	ep := spec.HNS(netID)
	ep.ID = id
	ep.Name = "" // as kube-proxy leaves them: owned through the MAC
	return *ep
}

func hlb(id string, proto uint32, vip string, ext, in uint16, pflags hns.PortMappingFlags, epIDs ...string) hns.LoadBalancer {
	lb := hns.LoadBalancer{ID: id, HostComputeEndpoints: epIDs,
		PortMappings: []hns.PortMapping{{Protocol: proto, ExternalPort: ext, InternalPort: in, Flags: pflags}}}
	if vip != "" {
		lb.FrontendVIPs = []string{vip}
	}
	return lb
}

func TestReconcile(t *testing.T) {
	web := func(endpoints ...proxy.Endpoint) *proxy.ServicePort {
		return wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(endpoints...))
	}
	cases := []struct {
		name    string
		network hns.Network
		eps     []hns.Endpoint
		lbs     []hns.LoadBalancer
		ports   []*proxy.ServicePort
		modify  bool
		mutate  func(*State)
		want    string
		missing string
	}{{
		name:  "from scratch: endpoints, then load balancers",
		eps:   []hns.Endpoint{lep("L1", "10.244.1.5")},
		ports: []*proxy.ServicePort{web(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))},
		want: `create-endpoint Remote 10.244.2.5 (missing)
create-lb v4 TCP *:30080 -> 8080 flags=0 pflags=18 dist=0 src= eps=10.244.1.5,10.244.2.5 (missing)
create-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5,10.244.2.5 (missing)
`,
	}, {
		name: "leftovers that match are adopted; the rest is deleted",
		eps: []hns.Endpoint{lep("L1", "10.244.1.5"), rep("R1", "10.244.2.5", ""), rep("R9", "10.244.2.99", ""),
			lep("L9", "10.244.1.99")},
		lbs: []hns.LoadBalancer{
			hlb("LB1", 6, "10.96.0.10", 80, 8080, 0, "R1", "L1"),
			hlb("LB2", 6, "", 30080, 8080, 18, "L1", "R1"),
			hlb("LB3", 6, "10.96.0.99", 80, 8080, 0, "R9"),                                     // stale Service
			{ID: "LB4", HostComputeEndpoints: []string{"R1"}},                                  // malformed: no port mapping
			hlb("LB5", 6, "10.96.0.98", 80, 8080, 0, "gone"),                                   // dangling
			hlb("LB6", 17, "10.96.0.10", 80, 8080, 0, "R1"),                                    // wrong protocol: stale
			{ID: "LB7", Flags: hns.LBFlagIPv6, PortMappings: []hns.PortMapping{{Protocol: 6}}}, // the IPv6 backend's
		},
		ports: []*proxy.ServicePort{web(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))},
		want: `delete-lb LB4 (malformed: 0 port mappings; it may hold any port)
delete-lb v4 TCP 10.96.0.99:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.2.99 (stale)
delete-lb v4 UDP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.2.5 (stale)
delete-lb LB5 (refers to endpoint gone, which is not in the network)
delete-endpoint 10.244.2.99 (unused)
`,
	}, {
		name: "what blocks a creation goes before it: a partly created load balancer, one nothing wants on the port",
		eps:  []hns.Endpoint{lep("L1", "10.244.1.5"), rep("R1", "10.244.2.5", "")},
		lbs: []hns.LoadBalancer{
			{ID: "LB4", FrontendVIPs: []string{"10.96.0.10"}}, // partly created: no port mapping, no endpoints
			hlb("LB3", 6, "10.96.0.99", 80, 8080, 0, "R1"),    // stale, on the port of the ClusterIP to create
			hlb("LB8", 6, "10.96.0.98", 81, 8080, 0, "R1"),    // stale, on another port
		},
		ports: []*proxy.ServicePort{wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080)))},
		want: `delete-lb v4 TCP 10.96.0.99:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.2.5 (stale, on the port of a load balancer to create)
delete-lb LB4 (malformed: 0 port mappings; it may hold any port)
create-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5 (missing)
delete-lb v4 TCP 10.96.0.98:81 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.2.5 (stale)
delete-endpoint 10.244.2.5 (unused)
`,
	}, {
		name:  "a leftover with a different endpoint set is replaced, not adopted",
		eps:   []hns.Endpoint{lep("L1", "10.244.1.5"), rep("R1", "10.244.2.5", "")},
		lbs:   []hns.LoadBalancer{hlb("LB1", 6, "10.96.0.10", 80, 8080, 0, "R1")},
		ports: []*proxy.ServicePort{wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080)))},
		want: `delete-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.2.5 (replaced: content changed)
create-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5,10.244.2.5 (replaces LB1)
`,
	}, {
		name:   "endpoint churn with in-place updates",
		eps:    []hns.Endpoint{lep("L1", "10.244.1.5"), rep("R1", "10.244.2.5", "")},
		lbs:    []hns.LoadBalancer{hlb("LB1", 6, "10.96.0.10", 80, 8080, 0, "R1", "L1"), hlb("LB2", 6, "", 30080, 8080, 18, "L1", "R1")},
		ports:  []*proxy.ServicePort{web(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.3.5", 8080))},
		modify: true,
		want: `create-endpoint Remote 10.244.3.5 (missing)
update-lb v4 TCP *:30080 -> 8080 flags=0 pflags=18 dist=0 src= eps=10.244.1.5,10.244.3.5 (content changed)
update-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5,10.244.3.5 (content changed)
delete-endpoint 10.244.2.5 (unused)
`,
	}, {
		name:  "a local endpoint recreated by the CNI has a new ID: the load balancer follows",
		eps:   []hns.Endpoint{lep("L1", "10.244.1.5")},
		lbs:   []hns.LoadBalancer{hlb("LB1", 6, "10.96.0.10", 80, 8080, 0, "L1")},
		ports: []*proxy.ServicePort{wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080)))},
		// The record still holds the old ID; HNS now has L2 for the address.
		mutate: func(st *State) { st.Endpoints[wt.MustAddr("10.244.1.5")].ID = "l2" },
		want: `delete-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5 (replaced: endpoint IDs changed)
create-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5 (replaces LB1)
`,
	}, {
		name:    "provider address changed: load balancers go before the endpoint is recreated",
		network: wt.Overlay,
		eps: []hns.Endpoint{lep("L1", "10.244.1.5"), rep("R1", "10.244.2.5", "10.0.0.22"),
			{ID: "SV", Name: "kproxy-sourcevip-10.244.1.250", HostComputeNetwork: netID, IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.1.250"}}},
			rep("V1", "10.96.0.10", "10.0.0.1")},
		lbs: []hns.LoadBalancer{
			{ID: "LB1", SourceVIP: "10.244.1.250", FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{"R1"},
				PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 8080}}},
		},
		ports: []*proxy.ServicePort{wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.RemoteEP("10.244.2.5", 8080)))},
		want: `delete-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src=10.244.1.250 eps=10.244.2.5 (endpoint r1 is replaced)
delete-endpoint 10.244.2.5 (provider address 10.0.0.22, want 10.0.0.2)
create-endpoint Remote 10.244.2.5 (replaces r1)
create-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src=10.244.1.250 eps=10.244.2.5 (missing)
`,
	}, {
		name:    "local endpoints HNS lacks are left out; a load balancer left with none is not created",
		eps:     []hns.Endpoint{rep("R1", "10.244.1.7", "")}, // a stale remote endpoint for a now-local address does not count
		ports:   []*proxy.ServicePort{web(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080)), wt.SvcPort("lonely", v1.ProtocolTCP, "10.96.0.11", 80, wt.Eps(wt.LocalEP("10.244.1.7", 8080)))},
		missing: "10.244.1.5 10.244.1.7",
		want: `create-endpoint Remote 10.244.2.5 (missing)
create-lb v4 TCP *:30080 -> 8080 flags=0 pflags=18 dist=0 src= eps=10.244.2.5 (missing)
create-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.2.5 (missing)
delete-endpoint 10.244.1.7 (unused)
`,
	}, {
		name: "endpoints kproxy does not own are never deleted",
		eps: []hns.Endpoint{
			{ID: "X1", HostComputeNetwork: netID, IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.2.77"}}, Flags: hns.EndpointFlagRemote, MacAddress: "00-aa-bb-cc-dd-ee"},
			lep("L1", "10.244.1.9"),
			{ID: "K1", Name: "kproxy-servicevip-10.96.0.77", HostComputeNetwork: netID, IPConfigurations: []hns.IPConfig{{IPAddress: "10.96.0.77"}}, Flags: hns.EndpointFlagRemote},
		},
		want: `delete-endpoint 10.96.0.77 (unused)
`,
	}, {
		name:   "a duplicate remote endpoint beside a local one: the local one is used, the duplicate deleted",
		eps:    []hns.Endpoint{rep("R1", "10.244.1.5", ""), lep("L1", "10.244.1.5")},
		lbs:    []hns.LoadBalancer{hlb("LB1", 6, "10.96.0.10", 80, 8080, 0, "R1")},
		ports:  []*proxy.ServicePort{wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080)))},
		modify: true,
		want: `update-lb v4 TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src= eps=10.244.1.5 (endpoint IDs changed)
delete-endpoint 10.244.1.5 (duplicate address)
`,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.network
			if n.Type == "" {
				n = wt.L2Bridge
			}
			f := baseFacts(n)
			p := plan.Build(f, wt.IPv4View(wt.Snap(nil, tc.ports...)), nil)
			if p.Err != nil {
				t.Fatal(p.Err)
			}
			st := Observe(v1.IPv4Protocol, netID, tc.eps, tc.lbs)
			if tc.mutate != nil {
				tc.mutate(st)
			}
			r := Reconcile(p, st, tc.modify)
			wt.MustEqual(t, "operations", r.String(), tc.want)
			var missing []string
			for _, ip := range r.MissingLocal {
				missing = append(missing, ip.String())
			}
			if got := strings.Join(missing, " "); got != tc.missing {
				t.Errorf("missing local = %q, want %q", got, tc.missing)
			}
		})
	}
}

func TestReconcileDoesNotModifyInputs(t *testing.T) {
	p := plan.Build(baseFacts(wt.L2Bridge), wt.IPv4View(wt.Snap(nil,
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))))), nil)
	before := p.String()
	st := Observe(v1.IPv4Protocol, netID, nil, nil)
	r := Reconcile(p, st, true)
	if p.String() != before {
		t.Errorf("plan modified:\n%s\nwas\n%s", p, before)
	}
	if len(st.Endpoints) != 0 || len(st.LoadBalancers) != 0 {
		t.Errorf("state modified: %+v", st)
	}
	if len(r.Dropped) != 0 || len(r.MissingLocal) != 1 || r.MissingLocal[0] != netip.MustParseAddr("10.244.1.5") {
		t.Errorf("dropped %v missing %v", r.Dropped, r.MissingLocal)
	}
}

func TestObserveFamilies(t *testing.T) {
	eps := []hns.Endpoint{
		{ID: "D", HostComputeNetwork: netID, IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.1.5"}, {IPAddress: "fd00:244:1::5"}}},
		{ID: "O", HostComputeNetwork: "other", IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.1.6"}}},
	}
	lbs := []hns.LoadBalancer{
		hlb("V4", 6, "10.96.0.10", 80, 8080, 0, "D"),
		{ID: "V6", Flags: hns.LBFlagIPv6, FrontendVIPs: []string{"fd00:10:96::10"}, HostComputeEndpoints: []string{"d"},
			PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 8080}}},
	}
	v4 := Observe(v1.IPv4Protocol, netID, eps, lbs)
	v6 := Observe(v1.IPv6Protocol, netID, eps, lbs)
	if len(v4.Endpoints) != 1 || v4.Endpoints[wt.MustAddr("10.244.1.5")] == nil {
		t.Errorf("IPv4 endpoints: %v (the other network's must not appear)", v4.Endpoints)
	}
	if len(v6.Endpoints) != 1 || v6.Endpoints[wt.MustAddr("fd00:244:1::5")] == nil {
		t.Errorf("IPv6 endpoints: %v", v6.Endpoints)
	}
	if len(v4.LoadBalancers) != 1 || len(v4.Orphans) != 0 || len(v6.LoadBalancers) != 1 || len(v6.Orphans) != 0 {
		t.Errorf("v4 %v/%v v6 %v/%v: each family sees its own load balancer only (IDs are case-insensitive)",
			v4.LoadBalancers, v4.Orphans, v6.LoadBalancers, v6.Orphans)
	}
}

func baseFacts(n hns.Network) *plan.Facts {
	return &plan.Facts{
		Family:    v1.IPv4Protocol,
		Network:   n,
		NodeIP:    wt.MustAddr("10.0.0.1"),
		HostMAC:   "00-15-5d-00-00-01",
		SourceVIP: wt.MustAddr("10.244.1.250"),
		Caps:      hns.CapabilitiesFor(wt.HNSModern),
	}
}
