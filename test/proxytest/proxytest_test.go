package proxytest

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

func mustTable(t *testing.T) *Table {
	t.Helper()
	tb, err := New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return tb
}

// TestTableConsistent checks the invariants runners rely on.
func TestTableConsistent(t *testing.T) {
	tb := mustTable(t)
	top := tb.Topology
	rowNames := map[string]bool{}
	caseNames := map[string]bool{}
	clusterIPs := map[string]string{}
	nodePorts := map[int32]string{}
	for _, c := range tb.Cases {
		if caseNames[c.Name] {
			t.Errorf("case %s: duplicate name", c.Name)
		}
		caseNames[c.Name] = true
		if c.Semantic == "" {
			t.Errorf("case %s: no semantic", c.Name)
		}
		for _, svc := range c.Services {
			for _, ip := range svc.Spec.ClusterIPs {
				if other, dup := clusterIPs[ip]; dup {
					t.Errorf("case %s: ClusterIP %s also used by %s", c.Name, ip, other)
				}
				clusterIPs[ip] = c.Name
				a := netip.MustParseAddr(ip)
				if !top.ServiceCIDR(familyOf(a)).Contains(a) {
					t.Errorf("case %s: ClusterIP %s outside the service CIDR", c.Name, ip)
				}
			}
			for _, p := range svc.Spec.Ports {
				if p.NodePort == 0 || p.Protocol != v1.ProtocolTCP {
					continue
				}
				if other, dup := nodePorts[p.NodePort]; dup {
					t.Errorf("case %s: NodePort %d also used by %s", c.Name, p.NodePort, other)
				}
				nodePorts[p.NodePort] = c.Name
			}
		}
	}
	for _, r := range tb.Rows {
		if rowNames[r.Name] {
			t.Errorf("row %s: duplicate name", r.Name)
		}
		rowNames[r.Name] = true
		if _, ok := top.Host(r.From); !ok {
			t.Errorf("row %s: unknown client %q", r.Name, r.From)
		}
		if r.Attempts < 1 {
			t.Errorf("row %s: %d attempts", r.Name, r.Attempts)
		}
		addr, err := r.Address(top)
		if err != nil {
			t.Errorf("row %s: %v", r.Name, err)
		} else if r.Target != TargetLocalhostNodePort && familyOf(addr.Addr()) != r.Family {
			t.Errorf("row %s: address %s is not %s", r.Name, addr, r.Family)
		}
		for p, reason := range r.Unsupported {
			if reason == "" {
				t.Errorf("row %s: unsupported on %s without a reason", r.Name, p)
			}
		}
		switch r.Expect.Outcome {
		case Answer:
			if len(r.Expect.Backends) == 0 {
				t.Errorf("row %s: answer expected but no backends listed", r.Name)
			}
			endpoints := slicePods(r.Case.Slices)
			for _, b := range r.Expect.Backends {
				if !endpoints[b] {
					t.Errorf("row %s: backend %s is not an endpoint of the case", r.Name, b)
				}
			}
		case Rejected, Dropped:
			if len(r.Expect.Backends) != 0 || r.Expect.Sticky {
				t.Errorf("row %s: %s row lists backends or stickiness", r.Name, r.Expect.Outcome)
			}
		default:
			t.Errorf("row %s: unknown outcome %q", r.Name, r.Expect.Outcome)
		}
	}
	for _, c := range tb.Configs() {
		if len(tb.RowsFor(c)) == 0 {
			t.Errorf("config %s has no rows", c)
		}
	}
	if len(tb.Configs()) != 4 {
		t.Errorf("configs = %v, want default, masquerade-all, nodeport-addresses=primary and no-cluster-cidr", tb.Configs())
	}
}

func slicePods(slices []*discovery.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil {
				out[e.TargetRef.Name] = true
			}
		}
	}
	return out
}

func findRow(t *testing.T, tb *Table, name string) Row {
	t.Helper()
	for _, r := range tb.Rows {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no row %q", name)
	return Row{}
}

func TestRowAddress(t *testing.T) {
	tb := mustTable(t)
	for _, tc := range []struct {
		row  string
		want string
	}{
		{"clusterip/client-1->clusterip/TCP/IPv4", "10.96.0.1:80"},
		{"clusterip/client-1->clusterip/UDP/IPv6", "[fd00:10:96::1]:80"},
		{"nodeport/outside->nodeport/TCP/IPv4", "192.168.50.1:30002"},
		{"nodeport/outside->nodeport/UDP/IPv6", "[fd00:50::1]:30002"},
		{"nodeport/node1->localhost-nodeport/TCP/IPv4", "127.0.0.1:30002"},
		{"externalip/outside->externalip/TCP/IPv4", "192.168.60.3:80"},
		{"loadbalancer/outside->lbip/UDP/IPv6", "[fd00:70::4]:80"},
		{"loadbalancer/outside->nodeport/TCP/IPv4", "192.168.50.1:30004"},
		{"nodeport-addresses-all/client-1->secondary-nodeport/UDP/IPv6", "[fd00:10:244:1::1]:30022"},
	} {
		t.Run(tc.row, func(t *testing.T) {
			got, err := findRow(t, tb, tc.row).Address(tb.Topology)
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("Address = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRowAddressErrors(t *testing.T) {
	tb := mustTable(t)
	base := findRow(t, tb, "clusterip/client-1->clusterip/TCP/IPv4")
	for _, tc := range []struct {
		name   string
		mutate func(r *Row)
		want   string
	}{
		{"no nodeport", func(r *Row) { r.Target = TargetNodePort }, "has no NodePort"},
		{"no externalIP", func(r *Row) { r.Target = TargetExternalIP }, "has no IPv4 externalIP"},
		{"no LB IP", func(r *Row) { r.Target = TargetLoadBalancerIP }, "has no IPv4 LoadBalancer IP"},
		{"unknown service", func(r *Row) { r.Service = "nope" }, `no service "nope"`},
		{"unknown target", func(r *Row) { r.Target = "bogus" }, "unknown target"},
		{"localhost IPv6", func(r *Row) {
			*r = findRow(t, tb, "nodeport/node1->localhost-nodeport/TCP/IPv4")
			r.Family = v1.IPv6Protocol
		}, "IPv4 only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			tc.mutate(&r)
			_, err := r.Address(tb.Topology)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Address error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestRowCheck(t *testing.T) {
	tb := mustTable(t)
	a := netip.MustParseAddr
	ans := func(backend, src string) Observation {
		return Observation{Outcome: Answer, Backend: backend, Source: a(src)}
	}
	for _, tc := range []struct {
		name    string
		row     string
		obs     []Observation
		wantErr string // "" for success
	}{
		{"answer from allowed backend, client source", "clusterip/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodA1, "10.244.1.100"), ans(PodB1, "10.244.1.100")}, ""},
		{"IPv4-mapped source accepted", "clusterip/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodA1, "::ffff:10.244.1.100")}, ""},
		{"masqueraded where the client should be seen", "clusterip/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodA1, "10.244.1.1")}, "want the client's own 10.244.1.100"},
		{"wrong backend", "itp-local/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodB1, "10.244.1.100")}, "answered by pod-b1"},
		{"node client seen from its pod gateway", "clusterip/node1->clusterip/UDP/IPv6",
			[]Observation{ans(PodA1, "fd00:10:244:1::1")}, ""},
		{"masqueraded to node IP", "nodeport/outside->nodeport/TCP/IPv6",
			[]Observation{ans(PodB1, "fd00:50::1")}, ""},
		{"masquerade expected but client seen", "nodeport/outside->nodeport/TCP/IPv6",
			[]Observation{ans(PodB1, "fd00:50::100")}, "want an address of node1"},
		{"eTP Local keeps the client source", "etp-local/outside->nodeport/TCP/IPv4",
			[]Observation{ans(PodA1, "192.168.50.100")}, ""},
		{"sticky holds", "affinity/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodB2, "10.244.1.100"), ans(PodB2, "10.244.1.100")}, ""},
		{"sticky broken", "affinity/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodB2, "10.244.1.100"), ans(PodA1, "10.244.1.100")}, "answered by 2 backends"},
		{"rejected as expected", "no-endpoints/outside->nodeport/UDP/IPv4",
			[]Observation{{Outcome: Rejected}}, ""},
		{"dropped where a reject is expected", "no-endpoints/outside->nodeport/UDP/IPv4",
			[]Observation{{Outcome: Dropped, Detail: "timeout after 1s"}}, "want rejected, got dropped: timeout after 1s"},
		{"answer where a drop is expected", "itp-local-no-local-endpoints/client-1->clusterip/TCP/IPv4",
			[]Observation{ans(PodB1, "10.244.1.100")}, "want dropped, got answer from pod-b1"},
		{"no observations", "clusterip/client-1->clusterip/TCP/IPv4", nil, "no observations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := findRow(t, tb, tc.row).Check(tb.Topology, tc.obs)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Check: unexpected error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Check error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestEndpointConditions(t *testing.T) {
	for _, tc := range []struct {
		ep                          EP
		ready, serving, terminating bool
	}{
		{EP{}, true, true, false},
		{EP{NotReady: true}, false, false, false},
		{EP{Terminating: true}, false, true, true},
		{EP{Terminating: true, NotServing: true}, false, false, true},
		{EP{NotServing: true}, false, false, false},
	} {
		c := tc.ep.conditions()
		if *c.Ready != tc.ready || *c.Serving != tc.serving || *c.Terminating != tc.terminating {
			t.Errorf("%+v: ready/serving/terminating = %v/%v/%v, want %v/%v/%v", tc.ep,
				*c.Ready, *c.Serving, *c.Terminating, tc.ready, tc.serving, tc.terminating)
		}
	}
}

func TestSlices(t *testing.T) {
	top := Default()
	svc := top.Service("web", 7)
	slices, err := top.Slices(svc, EP{Pod: PodB2, ZoneHint: Zone2})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices) != 2 || slices[0].Name != "web-ipv4" || slices[1].Name != "web-ipv6" {
		t.Fatalf("slices = %v, want web-ipv4 and web-ipv6", slices)
	}
	for _, s := range slices {
		if s.Labels[discovery.LabelServiceName] != "web" {
			t.Errorf("%s: service-name label %q", s.Name, s.Labels[discovery.LabelServiceName])
		}
		if len(s.Endpoints) != 1 || *s.Endpoints[0].NodeName != Node2 || *s.Endpoints[0].Zone != Zone2 ||
			s.Endpoints[0].Hints.ForZones[0].Name != Zone2 {
			t.Errorf("%s: endpoints %+v", s.Name, s.Endpoints)
		}
		if len(s.Ports) != 2 || *s.Ports[0].Name != PortTCP || *s.Ports[1].Protocol != v1.ProtocolUDP {
			t.Errorf("%s: ports %+v", s.Name, s.Ports)
		}
	}
	if got := slices[1].Endpoints[0].Addresses[0]; got != "fd00:10:244:2::11" {
		t.Errorf("IPv6 address %s, want fd00:10:244:2::11", got)
	}
	if _, err := top.Slices(svc, EP{Pod: Node1}); err == nil {
		t.Error("a node accepted as an endpoint")
	}
}

func TestServiceAddresses(t *testing.T) {
	top := Default()
	svc := top.Service("big", 300, WithLoadBalancer(), WithExternalIPs(), WithExternalLocal())
	for _, tc := range []struct{ got, want string }{
		{svc.Spec.ClusterIPs[0], "10.96.1.44"},
		{svc.Spec.ClusterIPs[1], "fd00:10:96::300"},
		{svc.Spec.ExternalIPs[1], "fd00:60::300"},
		{svc.Status.LoadBalancer.Ingress[0].IP, "192.168.71.44"},
		{string(svc.Spec.Type), "LoadBalancer"},
		{string(svc.Spec.ExternalTrafficPolicy), "Local"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	if svc.Spec.Ports[1].NodePort != 30300 || svc.Spec.HealthCheckNodePort != 31300 {
		t.Errorf("nodePort %d healthCheckNodePort %d", svc.Spec.Ports[1].NodePort, svc.Spec.HealthCheckNodePort)
	}
}

func TestTopologyLookups(t *testing.T) {
	top := Default()
	a := netip.MustParseAddr
	for _, tc := range []struct {
		addr string
		host string
		node bool // is an address of node1
	}{
		{"10.244.1.10", PodA1, false},
		{"fd00:10:244:2::12", PodB3, false},
		{"192.168.50.1", Node1, true},
		{"10.244.1.1", Node1, true},
		{"fd00:10:244:1::1", Node1, true},
		{"10.244.2.1", Node2, false},
		{"fd00:50::100", Outside, false},
		{"10.9.9.9", "", false},
	} {
		if got := top.HostByAddr(a(tc.addr)); got != tc.host {
			t.Errorf("HostByAddr(%s) = %q, want %q", tc.addr, got, tc.host)
		}
		if got := top.IsNodeAddr(Node1, a(tc.addr)); got != tc.node {
			t.Errorf("IsNodeAddr(node1, %s) = %v, want %v", tc.addr, got, tc.node)
		}
	}
	if n := len(top.PodsOn(Node1)); n != 3 {
		t.Errorf("pods on node1 = %d, want 3", n)
	}
}

// TestManifestRoundTrip decodes the rendered YAML back into typed objects.
func TestManifestRoundTrip(t *testing.T) {
	tb := mustTable(t)
	for _, c := range tb.Configs() {
		t.Run(c.String(), func(t *testing.T) {
			nodes, svcs, slices := tb.Objects(c)
			data, err := tb.Manifest(c)
			if err != nil {
				t.Fatal(err)
			}
			docs := bytes.Split(data, []byte("\n---\n"))
			if want := len(nodes) + len(svcs) + len(slices); len(docs) != want {
				t.Fatalf("%d documents, want %d", len(docs), want)
			}
			var gotSvc v1.Service
			if err := yaml.UnmarshalStrict(docs[len(nodes)], &gotSvc); err != nil {
				t.Fatalf("decode first service: %v", err)
			}
			if !equality.Semantic.DeepEqual(&gotSvc, svcs[0]) {
				t.Errorf("service round trip differs:\n got %+v\nwant %+v", gotSvc, svcs[0])
			}
			var gotSlice discovery.EndpointSlice
			if err := yaml.UnmarshalStrict(docs[len(docs)-1], &gotSlice); err != nil {
				t.Fatalf("decode last slice: %v", err)
			}
			if !equality.Semantic.DeepEqual(&gotSlice, slices[len(slices)-1]) {
				t.Errorf("slice round trip differs")
			}
			for _, want := range []string{"kind: Node", "kind: Service", "kind: EndpointSlice", "apiVersion: discovery.k8s.io/v1"} {
				if !bytes.Contains(data, []byte(want)) {
					t.Errorf("manifest lacks %q", want)
				}
			}
		})
	}
}
