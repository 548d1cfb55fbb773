package windows

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with testdata/<name>.golden (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run with -update to create it): %v", err)
	}
	mustEqual(t, path, got, string(want))
}

func baseFacts(n Network) *Facts {
	return &Facts{
		Family:    v1.IPv4Protocol,
		Network:   n,
		NodeIP:    mustAddr("10.0.0.1"),
		HostMAC:   "00-15-5d-00-00-01",
		SourceVIP: mustAddr("10.244.1.250"),
		Caps:      CapabilitiesFor(hnsModern),
	}
}

func TestPlanGolden(t *testing.T) {
	cases := []struct {
		name  string
		facts func(*Facts)
		ports []*proxy.ServicePort
	}{{
		name: "l2bridge-clusterip",
		ports: []*proxy.ServicePort{
			svcPort("web", v1.ProtocolTCP, "10.96.0.10", 80,
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080), remoteEP("10.244.3.7", 8080))),
			svcPort("dns", v1.ProtocolUDP, "10.96.0.53", 53, named("kube-system", "dns", "dns"),
				eps(remoteEP("10.244.2.9", 53))),
			svcPort("sctp", v1.ProtocolSCTP, "10.96.0.90", 9000, eps(remoteEP("10.244.2.9", 9000))),
			svcPort("empty", v1.ProtocolTCP, "10.96.0.11", 80),
		},
	}, {
		name: "l2bridge-external-frontends",
		ports: []*proxy.ServicePort{
			svcPort("np", v1.ProtocolTCP, "10.96.0.20", 80, nodePort(30080),
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))),
			svcPort("ext", v1.ProtocolTCP, "10.96.0.21", 443, externalIPs("192.168.60.1", "192.168.60.2"),
				eps(remoteEP("10.244.2.6", 8443))),
			svcPort("lb", v1.ProtocolUDP, "10.96.0.22", 53, nodePort(30053), lbIPs("192.168.70.1"),
				eps(remoteEP("10.244.3.6", 5353))),
		},
	}, {
		name: "external-local-dsr-healthcheck",
		facts: func(f *Facts) {
			f.ForwardHealthCheckVIP = true
			f.HealthzPort = 10256
			f.RootEndpointIP = mustAddr("10.244.1.2")
		},
		ports: []*proxy.ServicePort{
			svcPort("lb-local", v1.ProtocolTCP, "10.96.0.30", 80, nodePort(30030), lbIPs("192.168.70.3"), externalLocal(),
				healthCheckNodePort(32000), eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))),
			svcPort("lb-cluster", v1.ProtocolTCP, "10.96.0.31", 80, lbIPs("192.168.70.4"),
				eps(remoteEP("10.244.2.5", 8080))),
			svcPort("lb-local-none-here", v1.ProtocolTCP, "10.96.0.32", 80, nodePort(30032), lbIPs("192.168.70.5"), externalLocal(),
				healthCheckNodePort(32002), eps(remoteEP("10.244.2.5", 8080))),
		},
	}, {
		// As upstream: the health check load balancer has the Service's
		// protocol and, on overlay, the source VIP.
		name: "overlay-udp-healthcheck",
		facts: func(f *Facts) {
			f.Network = overlay
			f.ForwardHealthCheckVIP = true
			f.HealthzPort = 10256
			f.RootEndpointIP = mustAddr("10.244.1.2")
		},
		ports: []*proxy.ServicePort{
			svcPort("dns-lb", v1.ProtocolUDP, "10.96.0.35", 53, lbIPs("192.168.70.6"), healthCheckNodePort(32005),
				eps(remoteEP("10.244.2.9", 53))),
		},
	}, {
		// The preserve-destination annotation, as upstream: the NodePort and
		// the LB IP only to local endpoints, the LB IP with DSR, UseMux and
		// PreserveDIP; the ClusterIP unchanged. Without DSR it is ignored
		// (with a warning).
		name: "preserve-destination",
		ports: []*proxy.ServicePort{
			svcPort("keep-dip", v1.ProtocolTCP, "10.96.0.36", 80, nodePort(30036), lbIPs("192.168.70.7"), preserveDestination(),
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))),
			svcPort("keep-dip-none-here", v1.ProtocolTCP, "10.96.0.37", 80, nodePort(30037), lbIPs("192.168.70.8"), preserveDestination(),
				eps(remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "preserve-destination-without-dsr",
		facts: func(f *Facts) { f.Caps.DSR = false },
		ports: []*proxy.ServicePort{
			svcPort("keep-dip", v1.ProtocolTCP, "10.96.0.36", 80, nodePort(30036), lbIPs("192.168.70.7"), preserveDestination(),
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "external-local-without-dsr",
		facts: func(f *Facts) { f.Caps.DSR = false; f.EnableDSR = true },
		ports: []*proxy.ServicePort{
			svcPort("np-local", v1.ProtocolTCP, "10.96.0.40", 80, nodePort(30040), externalLocal(),
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "cluster-dsr-internal-local",
		facts: func(f *Facts) { f.EnableDSR = true },
		ports: []*proxy.ServicePort{
			svcPort("itp", v1.ProtocolTCP, "10.96.0.50", 80, internalLocal(), nodePort(30050),
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))),
			svcPort("itp-none-here", v1.ProtocolTCP, "10.96.0.51", 80, internalLocal(),
				eps(remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name: "affinity-and-source-ranges",
		ports: []*proxy.ServicePort{
			svcPort("sticky", v1.ProtocolTCP, "10.96.0.60", 80, affinity(10800), eps(remoteEP("10.244.2.5", 8080))),
			svcPort("sticky-short", v1.ProtocolTCP, "10.96.0.61", 80, affinity(60), eps(remoteEP("10.244.2.5", 8080))),
			svcPort("ranges", v1.ProtocolTCP, "10.96.0.62", 80, lbIPs("192.168.70.6"), sourceRanges("203.0.113.0/24"),
				eps(remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "affinity-unsupported",
		facts: func(f *Facts) { f.Caps = CapabilitiesFor(Version{Major: 11, Minor: 0}) },
		ports: []*proxy.ServicePort{
			svcPort("sticky", v1.ProtocolTCP, "10.96.0.60", 80, affinity(10800), eps(remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "overlay",
		facts: func(f *Facts) { f.Network = overlay },
		ports: []*proxy.ServicePort{
			// Pods only: the source VIP.
			svcPort("pods", v1.ProtocolTCP, "10.96.0.70", 80, nodePort(30070),
				eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080), remoteEP("10.244.3.5", 8080))),
			// Another node's IP (a host-network pod): the node IP as source.
			svcPort("hostnet", v1.ProtocolTCP, "10.96.0.71", 443, eps(remoteEP("10.0.0.2", 6443))),
			// Outside every remote subnet: the node IP as source, the node as provider.
			svcPort("public", v1.ProtocolTCP, "10.96.0.72", 80, eps(remoteEP("203.0.113.9", 80))),
			svcPort("empty", v1.ProtocolTCP, "10.96.0.73", 80),
		},
	}, {
		name: "bad-input-and-limits",
		ports: []*proxy.ServicePort{
			svcPort("mixed", v1.ProtocolTCP, "10.96.0.80", 80,
				eps(remoteEP("10.244.2.5", 8080), remoteEP("10.244.2.6", 8080), remoteEP("10.244.2.7", 9090))),
			svcPort("bad-proto", "ICMP", "10.96.0.81", 80, eps(remoteEP("10.244.2.5", 8080))),
			svcPort("bad-ep", v1.ProtocolTCP, "10.96.0.82", 80,
				eps(remoteEP("10.244.2.5", 0), remoteEP("10.244.2.6", 8080))),
			svcPort("ext-first", v1.ProtocolTCP, "10.96.0.83", 80, externalIPs("192.168.60.9"), eps(remoteEP("10.244.2.5", 8080))),
			svcPort("ext-second", v1.ProtocolTCP, "10.96.0.84", 80, externalIPs("192.168.60.9"), eps(remoteEP("10.244.2.6", 8080))),
			svcPort("ext-same", v1.ProtocolTCP, "10.96.0.85", 80, externalIPs("192.168.60.9"), eps(remoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "ipv6",
		facts: func(f *Facts) { f.Family = v1.IPv6Protocol; f.NodeIP = mustAddr("fd00::1") },
		ports: []*proxy.ServicePort{
			svcPort("web6", v1.ProtocolTCP, "fd00:10:96::10", 80, nodePort(30080), lbIPs("fd00:70::1"),
				eps(localEP("fd00:244:1::5", 8080), remoteEP("fd00:244:2::5", 8080))),
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := baseFacts(l2bridge)
			if tc.facts != nil {
				tc.facts(f)
			}
			s := snap(nil, tc.ports...)
			p := BuildPlan(f, s.Family(f.Family))
			if p.Err != nil {
				t.Fatalf("plan error: %v", p.Err)
			}
			golden(t, "plan/"+tc.name, p.String())
			// Deterministic: the same input gives the same plan.
			if again := BuildPlan(f, s.Family(f.Family)).String(); again != p.String() {
				t.Errorf("plan not deterministic:\n%s\nvs\n%s", again, p.String())
			}
		})
	}
}

func TestPlanErrors(t *testing.T) {
	ports := []*proxy.ServicePort{svcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, eps(remoteEP("10.244.2.5", 8080)))}
	cases := []struct {
		name  string
		facts func(*Facts)
		want  error
	}{
		{"overlay without source VIP", func(f *Facts) { f.Network = overlay; f.SourceVIP = netip.Addr{} }, ErrNoSourceVIP},
		{"overlay without node IP", func(f *Facts) { f.Network = overlay; f.NodeIP = netip.Addr{} }, ErrNoNodeIP},
		{"l2bridge needs neither", func(f *Facts) { f.SourceVIP, f.NodeIP = netip.Addr{}, netip.Addr{} }, nil},
		{"ipv6 on old HNS", func(f *Facts) { f.Family = v1.IPv6Protocol; f.Caps.IPv6 = false }, ErrNoIPv6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := baseFacts(l2bridge)
			tc.facts(f)
			p := BuildPlan(f, snap(nil, ports...).IPv4)
			if f.Family == v1.IPv6Protocol {
				p = BuildPlan(f, snap(nil, svcPort("web6", v1.ProtocolTCP, "fd00::10", 80, eps(remoteEP("fd00::5", 80)))).IPv6)
			}
			if !errors.Is(p.Err, tc.want) {
				t.Fatalf("got error %v, want %v", p.Err, tc.want)
			}
			if tc.want != nil && (len(p.LoadBalancers) != 0 || len(p.Endpoints) != 0) {
				t.Errorf("a failed plan must be empty, got:\n%s", p)
			}
			if tc.want == nil && len(p.LoadBalancers) != 1 {
				t.Errorf("want one load balancer, got:\n%s", p)
			}
		})
	}
}

func TestPlanTooManyEndpoints(t *testing.T) {
	var list []proxy.Endpoint
	for i := 0; i < MaxEndpointsPerLB+10; i++ {
		list = append(list, remoteEP(fmt.Sprintf("10.244.%d.%d", 2+i/250, 1+i%250), 8080))
	}
	p := BuildPlan(baseFacts(l2bridge), snap(nil, svcPort("big", v1.ProtocolTCP, "10.96.0.10", 80, eps(list...))).IPv4)
	if n := len(p.LoadBalancers[0].Endpoints); n != MaxEndpointsPerLB {
		t.Errorf("load balancer has %d endpoints, want %d", n, MaxEndpointsPerLB)
	}
	if len(p.Endpoints) != MaxEndpointsPerLB {
		t.Errorf("%d remote endpoints planned, want %d (the cut ones are not created)", len(p.Endpoints), MaxEndpointsPerLB)
	}
	if len(p.Warnings) != 1 || p.Warnings[0].Reason != ReasonTooManyEndpoints {
		t.Errorf("warnings = %+v, want one %s", p.Warnings, ReasonTooManyEndpoints)
	}
}

func TestRemoteMAC(t *testing.T) {
	if a, b := RemoteMAC(mustAddr("fd00:244:2::5")), RemoteMAC(mustAddr("fd00:244:3::5")); a == b || !strings.HasPrefix(a, "02-11-") {
		t.Errorf("IPv6 MACs %s and %s: want distinct, 02-11 prefixed", a, b)
	}
	for _, tc := range []struct{ ip, want string }{
		{"10.244.2.5", "02-11-0a-f4-02-05"},
		{"fd00:244:2::5", RemoteMAC(mustAddr("fd00:244:2::5"))},
	} {
		if got := RemoteMAC(mustAddr(tc.ip)); got != tc.want {
			t.Errorf("RemoteMAC(%s) = %s, want %s", tc.ip, got, tc.want)
		}
	}
}

func TestCapabilitiesFor(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		want Capabilities
	}{
		{Version{9, 2}, Capabilities{}},
		{Version{9, 3}, Capabilities{DSR: true}},
		{Version{10, 1}, Capabilities{}},
		{Version{11, 10}, Capabilities{DSR: true, IPv6: true}},
		{Version{12, 0}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true}},
		{Version{15, 4}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true}},
		{Version{15, 5}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true, ModifyLoadBalancer: true}},
		{Version{16, 0}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true, ModifyLoadBalancer: true}},
	} {
		if got := CapabilitiesFor(tc.v); got != tc.want {
			t.Errorf("CapabilitiesFor(%s) = %+v, want %+v", tc.v, got, tc.want)
		}
	}
}

func TestLBSpecHNS(t *testing.T) {
	p := BuildPlan(baseFacts(overlay), snap(nil,
		svcPort("web", v1.ProtocolUDP, "10.96.0.10", 53, nodePort(30053), affinity(10800), eps(remoteEP("10.244.2.5", 5353)))).IPv4)
	var np *LBSpec
	for _, lb := range p.LoadBalancers {
		if lb.Kind == KindNodePort {
			np = lb
		}
	}
	got := np.HNS([]string{"id-1"})
	want := LoadBalancer{
		HostComputeEndpoints: []string{"id-1"},
		SourceVIP:            "10.244.1.250",
		PortMappings: []PortMapping{{Protocol: 17, InternalPort: 5353, ExternalPort: 30053,
			DistributionType: DistributionSourceIP, Flags: PortFlagVIPExternalIP | PortFlagLocalRoutedVIP}},
	}
	if fmt.Sprintf("%+v", *got) != fmt.Sprintf("%+v", want) {
		t.Errorf("HNS() = %+v\nwant     %+v", *got, want)
	}
	var remote *EndpointSpec
	for _, e := range p.Endpoints {
		if e.Role == RoleRemote {
			remote = e
		}
	}
	ep := remote.HNS("net-1")
	if !ep.IsRemote() || ep.ProviderAddress() != "10.0.0.2" || ep.MacAddress != "02-11-0a-f4-02-05" ||
		ep.HostComputeNetwork != "net-1" || !strings.HasPrefix(ep.Name, EndpointNamePrefix) {
		t.Errorf("remote endpoint = %+v", ep)
	}
}
