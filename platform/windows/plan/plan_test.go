package plan

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
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
	wt.MustEqual(t, path, got, string(want))
}

func baseFacts(n hns.Network) *Facts {
	return &Facts{
		Family:    v1.IPv4Protocol,
		Network:   n,
		NodeIP:    wt.MustAddr("10.0.0.1"),
		HostMAC:   "00-15-5d-00-00-01",
		SourceVIP: wt.MustAddr("10.244.1.250"),
		Caps:      hns.CapabilitiesFor(wt.HNSModern),
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
			wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80,
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.7", 8080))),
			wt.SvcPort("dns", v1.ProtocolUDP, "10.96.0.53", 53, wt.Named("kube-system", "dns", "dns"),
				wt.Eps(wt.RemoteEP("10.244.2.9", 53))),
			wt.SvcPort("sctp", v1.ProtocolSCTP, "10.96.0.90", 9000, wt.Eps(wt.RemoteEP("10.244.2.9", 9000))),
			wt.SvcPort("empty", v1.ProtocolTCP, "10.96.0.11", 80),
		},
	}, {
		name: "l2bridge-external-frontends",
		ports: []*proxy.ServicePort{
			wt.SvcPort("np", v1.ProtocolTCP, "10.96.0.20", 80, wt.NodePort(30080),
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("ext", v1.ProtocolTCP, "10.96.0.21", 443, wt.ExternalIPs("192.168.60.1", "192.168.60.2"),
				wt.Eps(wt.RemoteEP("10.244.2.6", 8443))),
			wt.SvcPort("lb", v1.ProtocolUDP, "10.96.0.22", 53, wt.NodePort(30053), wt.LBIPs("192.168.70.1"),
				wt.Eps(wt.RemoteEP("10.244.3.6", 5353))),
		},
	}, {
		name: "external-local-dsr-healthcheck",
		facts: func(f *Facts) {
			f.ForwardHealthCheckVIP = true
			f.HealthzPort = 10256
			f.RootEndpointIP = wt.MustAddr("10.244.1.2")
		},
		ports: []*proxy.ServicePort{
			wt.SvcPort("lb-local", v1.ProtocolTCP, "10.96.0.30", 80, wt.NodePort(30030), wt.LBIPs("192.168.70.3"), wt.ExternalLocal(),
				wt.HealthCheckNodePort(32000), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("lb-cluster", v1.ProtocolTCP, "10.96.0.31", 80, wt.LBIPs("192.168.70.4"),
				wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("lb-local-none-here", v1.ProtocolTCP, "10.96.0.32", 80, wt.NodePort(30032), wt.LBIPs("192.168.70.5"), wt.ExternalLocal(),
				wt.HealthCheckNodePort(32002), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		// As upstream: the health check load balancer has the Service's
		// protocol and, on wt.Overlay, the source VIP.
		name: "overlay-udp-healthcheck",
		facts: func(f *Facts) {
			f.Network = wt.Overlay
			f.ForwardHealthCheckVIP = true
			f.HealthzPort = 10256
			f.RootEndpointIP = wt.MustAddr("10.244.1.2")
		},
		ports: []*proxy.ServicePort{
			wt.SvcPort("dns-lb", v1.ProtocolUDP, "10.96.0.35", 53, wt.LBIPs("192.168.70.6"), wt.HealthCheckNodePort(32005),
				wt.Eps(wt.RemoteEP("10.244.2.9", 53))),
		},
	}, {
		// The preserve-destination annotation, as upstream: the NodePort and
		// the LB IP only to local endpoints, the LB IP with DSR, UseMux and
		// PreserveDIP; the ClusterIP unchanged. Without DSR the destination
		// is not kept (a warning), the NodePort and LB IP still only local.
		name: "preserve-destination",
		ports: []*proxy.ServicePort{
			wt.SvcPort("keep-dip", v1.ProtocolTCP, "10.96.0.36", 80, wt.NodePort(30036), wt.LBIPs("192.168.70.7"), wt.PreserveDestination(),
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("keep-dip-none-here", v1.ProtocolTCP, "10.96.0.37", 80, wt.NodePort(30037), wt.LBIPs("192.168.70.8"), wt.PreserveDestination(),
				wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "preserve-destination-without-dsr",
		facts: func(f *Facts) { f.Caps.DSR = false },
		ports: []*proxy.ServicePort{
			wt.SvcPort("keep-dip", v1.ProtocolTCP, "10.96.0.36", 80, wt.NodePort(30036), wt.LBIPs("192.168.70.7"), wt.PreserveDestination(),
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "external-local-without-dsr",
		facts: func(f *Facts) { f.Caps.DSR = false; f.EnableDSR = true },
		ports: []*proxy.ServicePort{
			wt.SvcPort("np-local", v1.ProtocolTCP, "10.96.0.40", 80, wt.NodePort(30040), wt.ExternalLocal(),
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "cluster-dsr-internal-local",
		facts: func(f *Facts) { f.EnableDSR = true },
		ports: []*proxy.ServicePort{
			wt.SvcPort("itp", v1.ProtocolTCP, "10.96.0.50", 80, wt.InternalLocal(), wt.NodePort(30050),
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("itp-none-here", v1.ProtocolTCP, "10.96.0.51", 80, wt.InternalLocal(),
				wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name: "affinity-and-source-ranges",
		ports: []*proxy.ServicePort{
			wt.SvcPort("sticky", v1.ProtocolTCP, "10.96.0.60", 80, wt.Affinity(10800), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("sticky-short", v1.ProtocolTCP, "10.96.0.61", 80, wt.Affinity(60), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("ranges", v1.ProtocolTCP, "10.96.0.62", 80, wt.LBIPs("192.168.70.6"), wt.SourceRanges("203.0.113.0/24"),
				wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "affinity-unsupported",
		facts: func(f *Facts) { f.Caps = hns.CapabilitiesFor(hns.Version{Major: 11, Minor: 0}) },
		ports: []*proxy.ServicePort{
			wt.SvcPort("sticky", v1.ProtocolTCP, "10.96.0.60", 80, wt.Affinity(10800), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "overlay",
		facts: func(f *Facts) { f.Network = wt.Overlay },
		ports: []*proxy.ServicePort{
			// Pods only: the source VIP.
			wt.SvcPort("pods", v1.ProtocolTCP, "10.96.0.70", 80, wt.NodePort(30070),
				wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.5", 8080))),
			// Another node's IP (a host-network pod): the node IP as source.
			wt.SvcPort("hostnet", v1.ProtocolTCP, "10.96.0.71", 443, wt.Eps(wt.RemoteEP("10.0.0.2", 6443))),
			// Outside every remote subnet: the node IP as source, the node as provider.
			wt.SvcPort("public", v1.ProtocolTCP, "10.96.0.72", 80, wt.Eps(wt.RemoteEP("203.0.113.9", 80))),
			wt.SvcPort("empty", v1.ProtocolTCP, "10.96.0.73", 80),
		},
	}, {
		name: "bad-input-and-limits",
		ports: []*proxy.ServicePort{
			wt.SvcPort("mixed", v1.ProtocolTCP, "10.96.0.80", 80,
				wt.Eps(wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.2.6", 8080), wt.RemoteEP("10.244.2.7", 9090))),
			wt.SvcPort("bad-proto", "ICMP", "10.96.0.81", 80, wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("bad-ep", v1.ProtocolTCP, "10.96.0.82", 80,
				wt.Eps(wt.RemoteEP("10.244.2.5", 0), wt.RemoteEP("10.244.2.6", 8080))),
			wt.SvcPort("ext-first", v1.ProtocolTCP, "10.96.0.83", 80, wt.ExternalIPs("192.168.60.9"), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
			wt.SvcPort("ext-second", v1.ProtocolTCP, "10.96.0.84", 80, wt.ExternalIPs("192.168.60.9"), wt.Eps(wt.RemoteEP("10.244.2.6", 8080))),
			wt.SvcPort("ext-same", v1.ProtocolTCP, "10.96.0.85", 80, wt.ExternalIPs("192.168.60.9"), wt.Eps(wt.RemoteEP("10.244.2.5", 8080))),
		},
	}, {
		name:  "ipv6",
		facts: func(f *Facts) { f.Family = v1.IPv6Protocol; f.NodeIP = wt.MustAddr("fd00::1") },
		ports: []*proxy.ServicePort{
			wt.SvcPort("web6", v1.ProtocolTCP, "fd00:10:96::10", 80, wt.NodePort(30080), wt.LBIPs("fd00:70::1"),
				wt.Eps(wt.LocalEP("fd00:244:1::5", 8080), wt.RemoteEP("fd00:244:2::5", 8080))),
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := baseFacts(wt.L2Bridge)
			if tc.facts != nil {
				tc.facts(f)
			}
			s := wt.Snap(nil, tc.ports...)
			p := Build(f, wt.View(s, f.Family), nil)
			if p.Err != nil {
				t.Fatalf("plan error: %v", p.Err)
			}
			golden(t, "plan/"+tc.name, p.String())
			// Deterministic: the same input gives the same plan.
			if again := Build(f, wt.View(s, f.Family), nil).String(); again != p.String() {
				t.Errorf("plan not deterministic:\n%s\nvs\n%s", again, p.String())
			}
		})
	}
}

func TestPlanErrors(t *testing.T) {
	ports := []*proxy.ServicePort{wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.RemoteEP("10.244.2.5", 8080)))}
	cases := []struct {
		name  string
		facts func(*Facts)
		want  error
	}{
		{"overlay without source VIP", func(f *Facts) { f.Network = wt.Overlay; f.SourceVIP = netip.Addr{} }, ErrNoSourceVIP},
		{"overlay without node IP", func(f *Facts) { f.Network = wt.Overlay; f.NodeIP = netip.Addr{} }, ErrNoNodeIP},
		{"l2bridge needs neither", func(f *Facts) { f.SourceVIP, f.NodeIP = netip.Addr{}, netip.Addr{} }, nil},
		{"ipv6 on old HNS", func(f *Facts) { f.Family = v1.IPv6Protocol; f.Caps.IPv6 = false }, ErrNoIPv6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := baseFacts(wt.L2Bridge)
			tc.facts(f)
			p := Build(f, wt.IPv4View(wt.Snap(nil, ports...)), nil)
			if f.Family == v1.IPv6Protocol {
				p = Build(f, wt.View(wt.Snap(nil, wt.SvcPort("web6", v1.ProtocolTCP, "fd00::10", 80, wt.Eps(wt.RemoteEP("fd00::5", 80)))), v1.IPv6Protocol), nil)
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
		list = append(list, wt.RemoteEP(fmt.Sprintf("10.244.%d.%d", 2+i/250, 1+i%250), 8080))
	}
	p := Build(baseFacts(wt.L2Bridge), wt.IPv4View(wt.Snap(nil, wt.SvcPort("big", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(list...)))), nil)
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
	if a, b := RemoteMAC(wt.MustAddr("fd00:244:2::5")), RemoteMAC(wt.MustAddr("fd00:244:3::5")); a == b || !strings.HasPrefix(a, "02-11-") {
		t.Errorf("IPv6 MACs %s and %s: want distinct, 02-11 prefixed", a, b)
	}
	for _, tc := range []struct{ ip, want string }{
		{"10.244.2.5", "02-11-0a-f4-02-05"},
		{"fd00:244:2::5", RemoteMAC(wt.MustAddr("fd00:244:2::5"))},
	} {
		if got := RemoteMAC(wt.MustAddr(tc.ip)); got != tc.want {
			t.Errorf("RemoteMAC(%s) = %s, want %s", tc.ip, got, tc.want)
		}
	}
}

func TestLBSpecHNS(t *testing.T) {
	p := Build(baseFacts(wt.Overlay), wt.IPv4View(wt.Snap(nil,
		wt.SvcPort("web", v1.ProtocolUDP, "10.96.0.10", 53, wt.NodePort(30053), wt.Affinity(10800), wt.Eps(wt.RemoteEP("10.244.2.5", 5353))))), nil)
	var np *LBSpec
	for _, lb := range p.LoadBalancers {
		if lb.Kind == KindNodePort {
			np = lb
		}
	}
	got := np.HNS([]string{"id-1"})
	want := hns.LoadBalancer{
		HostComputeEndpoints: []string{"id-1"},
		SourceVIP:            "10.244.1.250",
		PortMappings: []hns.PortMapping{{Protocol: 17, InternalPort: 5353, ExternalPort: 30053,
			DistributionType: hns.DistributionSourceIP, Flags: hns.PortFlagVIPExternalIP | hns.PortFlagLocalRoutedVIP}},
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

// TestPreserveAndLocalWithoutDSR: on HNS without DSR, a Service both
// annotated preserve-destination and externalTrafficPolicy Local gets both
// warnings (the LB IP cannot keep the destination; the NodePort cannot keep
// the client's source).
func TestPreserveAndLocalWithoutDSR(t *testing.T) {
	f := baseFacts(wt.L2Bridge)
	f.Caps.DSR = false
	sp := wt.SvcPort("keep-local", v1.ProtocolTCP, "10.96.0.41", 80, wt.NodePort(30041), wt.LBIPs("192.168.70.9"), wt.PreserveDestination(),
		wt.ExternalLocal(), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080)))
	p := Build(f, wt.View(wt.Snap(nil, sp), f.Family), nil)
	var reasons []string
	for _, w := range p.Warnings {
		reasons = append(reasons, w.Reason)
	}
	slices.Sort(reasons)
	if want := []string{ReasonLocalPolicyWithoutDSR, ReasonPreserveDestinationUnsupported}; !slices.Equal(reasons, want) {
		t.Errorf("warnings %v, want %v", reasons, want)
	}
}
