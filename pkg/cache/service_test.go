package cache

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// TestServicePorts covers what the cache captures from a Service spec and
// status, per family.
func TestServicePorts(t *testing.T) {
	type want struct {
		fam  v1.IPFamily
		name string // port name
		// check inspects the port; return "" when fine.
		check func(p portView) string
	}
	tests := []struct {
		name    string
		svc     *v1.Service
		want    []want
		absent4 bool // no IPv4 port expected
		absent6 bool
	}{
		{
			name: "ClusterIP single stack",
			svc:  svc("ns/a", []string{"10.96.0.10"}, []string{"http:80/TCP"}),
			want: []want{{v1.IPv4Protocol, "http", func(p portView) string {
				return p.expect("10.96.0.10", 80, v1.ProtocolTCP, 0, v1.ServiceTypeClusterIP)
			}}},
			absent6: true,
		},
		{
			name: "protocol defaults to TCP; UDP and SCTP kept",
			svc:  svc("ns/a", []string{"10.96.0.10"}, []string{"a:53", "b:53/UDP", "c:9/SCTP"}),
			want: []want{
				{v1.IPv4Protocol, "a", func(p portView) string { return p.expect("10.96.0.10", 53, v1.ProtocolTCP, 0, "ClusterIP") }},
				{v1.IPv4Protocol, "b", func(p portView) string { return p.expect("10.96.0.10", 53, v1.ProtocolUDP, 0, "ClusterIP") }},
				{v1.IPv4Protocol, "c", func(p portView) string { return p.expect("10.96.0.10", 9, v1.ProtocolSCTP, 0, "ClusterIP") }},
			},
			absent6: true,
		},
		{
			name: "dual-stack clusterIPs give one port per family with that family's addresses",
			svc: svc("ns/a", []string{"fd00:96::10", "10.96.0.10"}, []string{"80"}, nodePort(0, 30080), lb("203.0.113.5", "2001:db8::5"),
				func(s *v1.Service) {
					s.Spec.ExternalIPs = []string{"192.0.2.7", "2001:db8::7"}
					s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
				}),
			want: []want{
				{v1.IPv4Protocol, "", func(p portView) string {
					return p.expect("10.96.0.10", 80, v1.ProtocolTCP, 30080, v1.ServiceTypeLoadBalancer) +
						p.list("externalIPs", p.ExternalIPs, "192.0.2.7") + p.list("lb", p.LoadBalancerIPs, "203.0.113.5") +
						p.prefixes("198.51.100.0/24")
				}},
				{v1.IPv6Protocol, "", func(p portView) string {
					return p.expect("fd00:96::10", 80, v1.ProtocolTCP, 30080, v1.ServiceTypeLoadBalancer) +
						p.list("externalIPs", p.ExternalIPs, "2001:db8::7") + p.list("lb", p.LoadBalancerIPs, "2001:db8::5") +
						p.prefixes("2001:db8:1::/48")
				}},
			},
		},
		{
			name: "clusterIP used when clusterIPs is empty",
			svc: svc("ns/a", nil, []string{"80"}, func(s *v1.Service) {
				s.Spec.ClusterIP = "fd00::1"
			}),
			want:    []want{{v1.IPv6Protocol, "", func(p portView) string { return p.expect("fd00::1", 80, "TCP", 0, "ClusterIP") }}},
			absent4: true,
		},
		{
			name: "nodePort ignored on a ClusterIP Service",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, func(s *v1.Service) {
				s.Spec.Ports[0].NodePort = 30001
			}),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.expect("10.96.0.10", 80, "TCP", 0, "ClusterIP") }}},
			absent6: true,
		},
		{
			name: "LoadBalancer ingress: VIP and unset ipMode captured, Proxy and hostname-only not",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, lb(), func(s *v1.Service) {
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "203.0.113.1"},
					{IP: "203.0.113.2", IPMode: ptr(v1.LoadBalancerIPModeVIP)},
					{IP: "203.0.113.3", IPMode: ptr(v1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
				}
			}),
			want: []want{{v1.IPv4Protocol, "", func(p portView) string {
				return p.list("lb", p.LoadBalancerIPs, "203.0.113.1", "203.0.113.2")
			}}},
			absent6: true,
		},
		{
			name: "source ranges from the legacy annotation when the field is empty",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, lb("203.0.113.1"), func(s *v1.Service) {
				s.Annotations = map[string]string{annotationSourceRanges: "198.51.100.0/24, 192.0.2.1/32"}
			}),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.prefixes("192.0.2.1/32", "198.51.100.0/24") }}},
			absent6: true,
		},
		{
			name: "session affinity ClientIP defaults to 10800 s",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			}),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.int("affinity", p.AffinityTimeoutSeconds, 10800) }}},
			absent6: true,
		},
		{
			name: "session affinity with a timeout",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
			}),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.int("affinity", p.AffinityTimeoutSeconds, 60) }}},
			absent6: true,
		},
		{
			name:    "no affinity by default",
			svc:     svc("ns/a", []string{"10.96.0.10"}, []string{"80"}),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.int("affinity", p.AffinityTimeoutSeconds, 0) }}},
			absent6: true,
		},
		{
			name: "externalTrafficPolicy Local with a health check port",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, nodePort(0, 30080), lb("203.0.113.1"), etpLocal, func(s *v1.Service) {
				s.Spec.HealthCheckNodePort = 31000
			}),
			want: []want{{v1.IPv4Protocol, "", func(p portView) string {
				return p.bool("etpLocal", p.ExternalPolicyLocal, true) + p.bool("itpLocal", p.InternalPolicyLocal, false) +
					p.int("hc", p.HealthCheckNodePort, 31000)
			}}},
			absent6: true,
		},
		{
			name:    "externalTrafficPolicy Local means nothing without an external frontend",
			svc:     svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, etpLocal),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.bool("etpLocal", p.ExternalPolicyLocal, false) }}},
			absent6: true,
		},
		{
			name: "externalTrafficPolicy Local applies to externalIPs of a ClusterIP Service",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, etpLocal, func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.9"}
			}),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.bool("etpLocal", p.ExternalPolicyLocal, true) }}},
			absent6: true,
		},
		{
			name:    "internalTrafficPolicy Local",
			svc:     svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, itpLocal),
			want:    []want{{v1.IPv4Protocol, "", func(p portView) string { return p.bool("itpLocal", p.InternalPolicyLocal, true) }}},
			absent6: true,
		},
		{
			name: "trafficDistribution is kept",
			svc: svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, func(s *v1.Service) {
				s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameNode)
			}),
			want: []want{{v1.IPv4Protocol, "", func(p portView) string {
				if p.TrafficDistribution != "PreferSameNode" {
					return "trafficDistribution " + p.TrafficDistribution
				}
				return ""
			}}},
			absent6: true,
		},
		{
			name:    "ExternalName produces nothing",
			svc:     svc("ns/a", nil, []string{"80"}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName; s.Spec.ExternalName = "x.example" }),
			absent4: true, absent6: true,
		},
		{
			name:    "headless produces nothing",
			svc:     svc("ns/a", []string{"None"}, []string{"80"}),
			absent4: true, absent6: true,
		},
		{
			name:    "no ClusterIP allocated yet produces nothing",
			svc:     svc("ns/a", nil, []string{"80"}),
			absent4: true, absent6: true,
		},
		{
			name: "bad parts are dropped, the rest kept",
			svc: svc("ns/a", []string{"10.96.0.300", "fd00::10"}, []string{"a:0", "b:70000", "c:80", "d:81/ICMP"}, nodePort(2, 99999), func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"junk", "2001:db8::1"}
			}),
			want: []want{{v1.IPv6Protocol, "c", func(p portView) string {
				return p.expect("fd00::10", 80, "TCP", 0, v1.ServiceTypeNodePort) + p.list("externalIPs", p.ExternalIPs, "2001:db8::1")
			}}},
			absent4: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := Build(thisNode, nil, []*v1.Service{tc.svc}, nil)
			if tc.absent4 && snap.IPv4.Len() != 0 {
				t.Errorf("IPv4 ports: %v, want none", portNames(snap.IPv4))
			}
			if tc.absent6 && snap.IPv6.Len() != 0 {
				t.Errorf("IPv6 ports: %v, want none", portNames(snap.IPv6))
			}
			for _, w := range tc.want {
				proto := v1.ProtocolTCP
				for _, p := range tc.svc.Spec.Ports {
					if p.Name == w.name && p.Protocol != "" {
						proto = p.Protocol
					}
				}
				p := mustPort(t, snap, w.fam, spn(tc.svc.Namespace+"/"+tc.svc.Name, w.name, proto))
				if msg := w.check(portView{p}); msg != "" {
					t.Errorf("%s port %q: %s", w.fam, w.name, msg)
				}
			}
		})
	}
}

func TestServiceProblemsNameObjectAndField(t *testing.T) {
	s := svc("ns/bad", []string{"10.96.0.300"}, []string{"a:0"})
	_, problems := parseService(s)
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := []string{
		`Service ns/bad: spec.clusterIPs[0]: not an IP address: "10.96.0.300"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	s = svc("ns/bad", []string{"10.96.0.3"}, []string{"a:0", "b:80"}, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(0))}}
	})
	_, problems = parseService(s)
	got = nil
	for _, p := range problems {
		got = append(got, p.Field)
	}
	if want := []string{"spec.ports[0].port", "spec.sessionAffinityConfig.clientIP.timeoutSeconds"}; !slices.Equal(got, want) {
		t.Errorf("problem fields %v, want %v", got, want)
	}
}

// TestBadServiceDoesNotDisturbOthers: a junk Service next to a good one.
func TestBadServiceDoesNotDisturbOthers(t *testing.T) {
	good := svc("ns/good", []string{"10.96.0.1"}, []string{"80"})
	bad := svc("ns/bad", []string{"not-an-ip"}, []string{"80"})
	snap := Build(thisNode, nil, []*v1.Service{bad, good}, []*discovery.EndpointSlice{
		slice("ns/good-1", "good", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1"),
		slice("ns/bad-1", "bad", discovery.AddressTypeIPv4, []string{"80"}, "garbage", "10.0.1.2"),
	})
	if got := portNames(snap.IPv4); !slices.Equal(got, []string{"ns/good/TCP"}) {
		t.Fatalf("ports %v", got)
	}
	if got := epList(snap.IPv4.Sorted()[0].ClusterEndpoints); got != "10.0.1.1:80" {
		t.Errorf("endpoints %q", got)
	}
}

// portView adds terse assertions to a ServicePort.
type portView struct{ *portAlias }

type portAlias = proxy.ServicePort

func (p portView) expect(cip string, port int32, proto v1.Protocol, np int32, typ v1.ServiceType) string {
	var out []string
	if p.ClusterIP != netip.MustParseAddr(cip) {
		out = append(out, "clusterIP "+p.ClusterIP.String())
	}
	if p.Port != port {
		out = append(out, "port")
	}
	if p.Protocol != proto {
		out = append(out, "protocol "+string(p.Protocol))
	}
	if p.NodePort != np {
		out = append(out, "nodePort")
	}
	if p.Type != typ {
		out = append(out, "type "+string(p.Type))
	}
	return strings.Join(out, "; ")
}

func (p portView) list(what string, got []netip.Addr, want ...string) string {
	if !slices.Equal(got, addrs(want...)) {
		return what + " " + addrString(got) + "; "
	}
	return ""
}

func (p portView) prefixes(want ...string) string {
	var w []netip.Prefix
	for _, s := range want {
		w = append(w, netip.MustParsePrefix(s))
	}
	if !slices.Equal(p.LoadBalancerSourceRanges, w) {
		return "sourceRanges mismatch; "
	}
	return ""
}

func (p portView) int(what string, got, want int32) string {
	if got != want {
		return what + " mismatch; "
	}
	return ""
}

func (p portView) bool(what string, got, want bool) string {
	if got != want {
		return what + " mismatch; "
	}
	return ""
}

func addrString(a []netip.Addr) string {
	var s []string
	for _, x := range a {
		s = append(s, x.String())
	}
	return "[" + strings.Join(s, " ") + "]"
}
