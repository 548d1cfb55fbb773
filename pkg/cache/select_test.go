package cache

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// TestEndpointSelection is the table of Kubernetes endpoint semantics: which
// endpoints a port uses for cluster-scoped and node-local traffic.
func TestEndpointSelection(t *testing.T) {
	zoneA := map[string]string{v1.LabelTopologyZone: "zone-a"}
	ports := []string{"80"}
	v4 := discovery.AddressTypeIPv4
	tests := []struct {
		name      string
		svcMods   []func(*v1.Service)
		nodeLabel map[string]string
		eps       []ep
		cluster   string
		local     string
		hasAny    bool
	}{
		{
			name:    "ready endpoints only",
			eps:     []ep{"10.0.1.1@node1", "10.0.2.1@node2", "10.0.2.2@node2!"},
			cluster: "10.0.1.1:80(L) 10.0.2.1:80", hasAny: true,
		},
		{
			name:    "nil ready condition means ready",
			eps:     []ep{"10.0.2.1@node2"},
			cluster: "10.0.2.1:80", hasAny: true,
		},
		{
			name:    "no endpoints",
			cluster: "", hasAny: false,
		},
		{
			name:    "no ready endpoint: serving terminating ones are used",
			eps:     []ep{"10.0.2.1@node2!~", "10.0.2.2@node2!~^", "10.0.2.3@node2!"},
			cluster: "10.0.2.1:80", hasAny: true,
		},
		{
			name:    "ready endpoints win over terminating ones",
			eps:     []ep{"10.0.2.1@node2!~", "10.0.2.2@node2"},
			cluster: "10.0.2.2:80", hasAny: true,
		},
		{
			name:    "not serving, not ready: nothing usable",
			eps:     []ep{"10.0.2.1@node2!~^", "10.0.2.2@node2!"},
			cluster: "", hasAny: false,
		},
		{
			name:    "internalTrafficPolicy Local: only local endpoints, no cluster list",
			svcMods: []func(*v1.Service){itpLocal},
			eps:     []ep{"10.0.1.1@node1", "10.0.2.1@node2"},
			cluster: "", local: "10.0.1.1:80(L)", hasAny: true,
		},
		{
			name:    "internalTrafficPolicy Local with only remote endpoints: none local, but some exist",
			svcMods: []func(*v1.Service){itpLocal},
			eps:     []ep{"10.0.2.1@node2"},
			cluster: "", local: "", hasAny: true,
		},
		{
			name:    "externalTrafficPolicy Local: cluster list for internal traffic, local list for external",
			svcMods: []func(*v1.Service){nodePort(0, 30080), etpLocal},
			eps:     []ep{"10.0.1.1@node1", "10.0.2.1@node2"},
			cluster: "10.0.1.1:80(L) 10.0.2.1:80", local: "10.0.1.1:80(L)", hasAny: true,
		},
		{
			name:    "local terminating fallback is independent of cluster",
			svcMods: []func(*v1.Service){nodePort(0, 30080), etpLocal},
			eps:     []ep{"10.0.1.1@node1!~", "10.0.2.1@node2"},
			cluster: "10.0.2.1:80", local: "10.0.1.1:80(L)", hasAny: true,
		},
		{
			// A port reachable from outside keeps its cluster endpoints
			// even with internalTrafficPolicy Local: pods and the node
			// short-circuit to them on its external frontends (upstream
			// UsesClusterEndpoints; issue 27).
			name:    "both traffic policies Local",
			svcMods: []func(*v1.Service){nodePort(0, 30080), etpLocal, itpLocal},
			eps:     []ep{"10.0.1.1@node1", "10.0.2.1@node2"},
			cluster: "10.0.1.1:80(L) 10.0.2.1:80", local: "10.0.1.1:80(L)", hasAny: true,
		},
		{
			name:    "internalTrafficPolicy Local without external frontends has no cluster endpoints",
			svcMods: []func(*v1.Service){itpLocal},
			eps:     []ep{"10.0.1.1@node1", "10.0.2.1@node2"},
			cluster: "", local: "10.0.1.1:80(L)", hasAny: true,
		},
		{
			name:      "zone hints for this node's zone are used",
			nodeLabel: zoneA,
			eps:       []ep{"10.0.1.1@node1/zone-a#hz=zone-a", "10.0.2.1@node2/zone-b#hz=zone-b", "10.0.3.1@node3/zone-a#hz=zone-a"},
			cluster:   "10.0.1.1:80(L) 10.0.3.1:80", hasAny: true,
		},
		{
			name:      "hints ignored when one ready endpoint lacks them",
			nodeLabel: zoneA,
			eps:       []ep{"10.0.1.1@node1/zone-a#hz=zone-a", "10.0.2.1@node2/zone-b"},
			cluster:   "10.0.1.1:80(L) 10.0.2.1:80", hasAny: true,
		},
		{
			name:      "hints ignored when none names this zone",
			nodeLabel: zoneA,
			eps:       []ep{"10.0.2.1@node2/zone-b#hz=zone-b", "10.0.3.1@node3/zone-c#hz=zone-c"},
			cluster:   "10.0.2.1:80 10.0.3.1:80", hasAny: true,
		},
		{
			name:    "hints ignored when the node has no zone label",
			eps:     []ep{"10.0.1.1@node1/zone-a#hz=zone-a", "10.0.2.1@node2/zone-b#hz=zone-b"},
			cluster: "10.0.1.1:80(L) 10.0.2.1:80", hasAny: true,
		},
		{
			name:      "not-ready endpoints without hints do not disable topology",
			nodeLabel: zoneA,
			eps:       []ep{"10.0.1.1@node1/zone-a#hz=zone-a", "10.0.2.1@node2/zone-b#hz=zone-b", "10.0.2.9@node2!"},
			cluster:   "10.0.1.1:80(L)", hasAny: true,
		},
		{
			name:      "node hints (PreferSameNode) beat zone hints",
			nodeLabel: zoneA,
			svcMods:   []func(*v1.Service){func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameNode) }},
			eps: []ep{"10.0.1.1@node1/zone-a#hz=zone-a#hn=node1", "10.0.3.1@node3/zone-a#hz=zone-a#hn=node3",
				"10.0.2.1@node2/zone-b#hz=zone-b#hn=node2"},
			cluster: "10.0.1.1:80(L)", hasAny: true,
		},
		{
			name:      "node hints not naming this node fall back to zone hints",
			nodeLabel: zoneA,
			eps:       []ep{"10.0.3.1@node3/zone-a#hz=zone-a#hn=node3", "10.0.2.1@node2/zone-b#hz=zone-b#hn=node2"},
			cluster:   "10.0.3.1:80", hasAny: true,
		},
		{
			name:      "topology does not apply to local traffic policy",
			nodeLabel: zoneA,
			svcMods:   []func(*v1.Service){nodePort(0, 30080), etpLocal},
			eps:       []ep{"10.0.1.1@node1/zone-a#hz=zone-b", "10.0.2.1@node2/zone-b#hz=zone-a"},
			cluster:   "10.0.2.1:80", local: "10.0.1.1:80(L)", hasAny: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := svc("ns/s", []string{"10.96.0.1"}, ports, tc.svcMods...)
			es := slice("ns/s-1", "s", v4, ports, tc.eps...)
			snap := Build(thisNode, node(thisNode, tc.nodeLabel), []*v1.Service{s}, []*discovery.EndpointSlice{es})
			p := mustPort(t, snap, v1.IPv4Protocol, spn("ns/s", "", ""))
			if got := epList(p.ClusterEndpoints); got != tc.cluster {
				t.Errorf("cluster endpoints %q, want %q", got, tc.cluster)
			}
			if got := epList(p.LocalEndpoints); got != tc.local {
				t.Errorf("local endpoints %q, want %q", got, tc.local)
			}
			if p.HasAnyEndpoints != tc.hasAny {
				t.Errorf("HasAnyEndpoints %v, want %v", p.HasAnyEndpoints, tc.hasAny)
			}
		})
	}
}

// TestSliceMerge covers how EndpointSlices of a Service are combined.
func TestSliceMerge(t *testing.T) {
	v4, v6 := discovery.AddressTypeIPv4, discovery.AddressTypeIPv6
	dual := svc("ns/s", []string{"10.96.0.1", "fd00:96::1"}, []string{"http:80", "dns:53/UDP"})
	tests := []struct {
		name   string
		slices []*discovery.EndpointSlice
		want   map[string]string // "family port" → cluster endpoints
	}{
		{
			name: "several slices per Service",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080", "dns:5353/UDP"}, "10.0.1.1", "10.0.1.2"),
				slice("ns/s-b", "s", v4, []string{"http:8080", "dns:5353/UDP"}, "10.0.1.3"),
			},
			want: map[string]string{
				"IPv4 http": "10.0.1.1:8080 10.0.1.2:8080 10.0.1.3:8080",
				"IPv4 dns":  "10.0.1.1:5353 10.0.1.2:5353 10.0.1.3:5353",
			},
		},
		{
			name: "named target port resolved per slice",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080"}, "10.0.1.1"),
				slice("ns/s-b", "s", v4, []string{"http:9090"}, "10.0.1.2"),
			},
			want: map[string]string{"IPv4 http": "10.0.1.1:8080 10.0.1.2:9090", "IPv4 dns": ""},
		},
		{
			name: "a port is matched by name and protocol",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080/UDP", "dns:5353/TCP"}, "10.0.1.1"),
			},
			want: map[string]string{"IPv4 http": "", "IPv4 dns": ""},
		},
		{
			name: "the same address in two slices collapses, the ready copy wins",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080"}, "10.0.1.1!", "10.0.1.2"),
				slice("ns/s-b", "s", v4, []string{"http:8080"}, "10.0.1.1"),
			},
			want: map[string]string{"IPv4 http": "10.0.1.1:8080 10.0.1.2:8080"},
		},
		{
			name: "IPv4 and IPv6 slices feed their own family; FQDN ignored",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080"}, "10.0.1.1"),
				slice("ns/s-b", "s", v6, []string{"http:8080"}, "fd00:1::1"),
				slice("ns/s-c", "s", discovery.AddressTypeFQDN, []string{"http:8080"}, "example.com"),
			},
			want: map[string]string{"IPv4 http": "10.0.1.1:8080", "IPv6 http": "[fd00:1::1]:8080"},
		},
		{
			name: "junk addresses and addresses of the wrong family are skipped, the rest kept",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080", "dns:99999/UDP"}, "10.0.1.1", "junk", "fd00::1", "10.0.1.300"),
			},
			want: map[string]string{"IPv4 http": "10.0.1.1:8080", "IPv4 dns": ""},
		},
		{
			name: "slices of other Services are not mixed in",
			slices: []*discovery.EndpointSlice{
				slice("ns/s-a", "s", v4, []string{"http:8080"}, "10.0.1.1"),
				slice("ns/t-a", "t", v4, []string{"http:8080"}, "10.0.9.9"),
				slice("other/s-a", "s", v4, []string{"http:8080"}, "10.0.9.8"),
			},
			want: map[string]string{"IPv4 http": "10.0.1.1:8080"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := Build(thisNode, nil, []*v1.Service{dual}, tc.slices)
			for key, want := range tc.want {
				var fam v1.IPFamily
				var port string
				for i := range key {
					if key[i] == ' ' {
						fam, port = v1.IPFamily(key[:i]), key[i+1:]
					}
				}
				proto := v1.ProtocolTCP
				if port == "dns" {
					proto = v1.ProtocolUDP
				}
				p := mustPort(t, snap, fam, spn("ns/s", port, proto))
				if got := epList(p.ClusterEndpoints); got != want {
					t.Errorf("%s: %q, want %q", key, got, want)
				}
			}
		})
	}
}

func TestEndpointConditionsAndPlacementKept(t *testing.T) {
	s := svc("ns/s", []string{"10.96.0.1"}, []string{"80"})
	es := slice("ns/s-a", "s", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1@node1/zone-a", "10.0.2.1@node2/zone-b!~")
	snap := Build(thisNode, nil, []*v1.Service{s}, []*discovery.EndpointSlice{es})
	p := mustPort(t, snap, v1.IPv4Protocol, spn("ns/s", "", ""))
	if len(p.ClusterEndpoints) != 1 {
		t.Fatalf("endpoints %v", p.ClusterEndpoints)
	}
	e := p.ClusterEndpoints[0]
	if e.NodeName() != "node1" || e.Zone() != "zone-a" || !e.Ready || !e.Serving || e.Terminating || !e.Local {
		t.Errorf("endpoint %+v", e)
	}
}
