package iptables

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// mixed returns one service port of every kind, in family fam.
func mixed(fam v1.IPFamily) []*proxy.ServicePort {
	ip := func(v4, v6 string) string {
		if fam == v1.IPv6Protocol {
			return v6
		}
		return v4
	}
	local := ep(ip("10.244.1.5", "fd00:10:1::5"), 8080, true)
	r1 := ep(ip("10.244.2.5", "fd00:10:2::5"), 8080, false)
	r2 := ep(ip("10.244.2.6", "fd00:10:2::6"), 8080, false)
	srcRange := ip("192.168.50.0/24", "fd00:50::/64")
	return []*proxy.ServicePort{
		svc("default/web", ip("10.96.0.10", "fd00:96::10"), 80, v1.ProtocolTCP, withEndpoints(local, r1, r2)),
		svc("kube-system/dns", ip("10.96.0.53", "fd00:96::53"), 53, v1.ProtocolUDP, withEndpoints(r1, r2)),
		svc("default/np", ip("10.96.0.11", "fd00:96::11"), 80, v1.ProtocolTCP, withNodePort(30080), withExternalIPs(ip("198.51.100.7", "fd00:198::7")), withEndpoints(r1)),
		svc("default/lb", ip("10.96.0.12", "fd00:96::12"), 443, v1.ProtocolTCP, withNodePort(30443), withLB(ip("203.0.113.10", "fd00:203::10")),
			withSourceRanges(srcRange), withETPLocal(), withHealthCheck(32100), withAffinity(10800), withEndpoints(local, r1)),
		svc("default/itp", ip("10.96.0.13", "fd00:96::13"), 80, v1.ProtocolSCTP, withITPLocal(), withEndpoints(local, r2)),
		svc("default/empty", ip("10.96.0.14", "fd00:96::14"), 80, v1.ProtocolTCP, withNodePort(30081)),
		svc("default/nolocal", ip("10.96.0.15", "fd00:96::15"), 80, v1.ProtocolTCP, withNodePort(30082), withETPLocal(), withEndpoints(r1)),
	}
}

func TestGolden(t *testing.T) {
	tests := []struct {
		name  string
		fam   v1.IPFamily
		cfg   func(*facts.Config)
		ports func() []*proxy.ServicePort
	}{
		{name: "ipv4", fam: v1.IPv4Protocol, ports: func() []*proxy.ServicePort { return mixed(v1.IPv4Protocol) }},
		{name: "ipv6", fam: v1.IPv6Protocol, ports: func() []*proxy.ServicePort { return mixed(v1.IPv6Protocol) }},
		{
			name: "ipv4-options",
			fam:  v1.IPv4Protocol,
			cfg: func(c *facts.Config) {
				c.MasqueradeAll = true
				c.RandomFully = false
				c.LocalhostNodePorts = false
				c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.50.0/24"), netip.MustParsePrefix("127.0.0.0/8")}
				c.NodePortPrimary = true
				c.MasqueradeBit, c.FilterBit = 1, 2
			},
			ports: func() []*proxy.ServicePort { return mixed(v1.IPv4Protocol)[:3] },
		},
		{
			name: "ipv4-two-cluster-cidrs",
			fam:  v1.IPv4Protocol,
			cfg: func(c *facts.Config) {
				c.ClusterCIDRs = append(c.ClusterCIDRs, netip.MustParsePrefix("10.245.0.0/16"))
				c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
			},
			ports: func() []*proxy.ServicePort { return mixed(v1.IPv4Protocol)[:3] },
		},
		{
			name: "ipv4-sharded",
			fam:  v1.IPv4Protocol,
			cfg:  func(c *facts.Config) { c.ShardThreshold = 4 },
			ports: func() []*proxy.ServicePort {
				var out []*proxy.ServicePort
				for i := 0; i < 6; i++ {
					out = append(out, svc(fmt.Sprintf("default/s%d", i), fmt.Sprintf("10.96.%d.%d", i, 7+i%2), 80, v1.ProtocolTCP,
						withNodePort(int32(30000+i*40)), withEndpoints(ep("10.244.2.5", 8080, false))))
				}
				return out
			},
		},
		{
			name: "ipv4-algorithms",
			fam:  v1.IPv4Protocol,
			ports: func() []*proxy.ServicePort {
				eps := []proxy.Endpoint{ep(podLocal, 8080, true), ep(podRemote1, 8080, false), ep(podRemote2, 8080, false)}
				return []*proxy.ServicePort{
					svc("ns/rr", "10.96.0.31", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmRoundRobin), withEndpoints(eps...)),
					svc("ns/sh", "10.96.0.32", 80, v1.ProtocolTCP, withNodePort(30032), withAlgorithm(proxy.AlgorithmSourceHash), withEndpoints(eps...)),
					svc("ns/sh-sticky", "10.96.0.33", 80, v1.ProtocolTCP, withAlgorithm(proxy.AlgorithmSourceHash), withAffinity(60), withEndpoints(eps...)),
				}
			},
		},
		{
			name: "ipv6-sharded",
			fam:  v1.IPv6Protocol,
			cfg:  func(c *facts.Config) { c.ShardThreshold = 2 },
			ports: func() []*proxy.ServicePort {
				var out []*proxy.ServicePort
				for i := 0; i < 3; i++ {
					out = append(out, svc(fmt.Sprintf("default/s%d", i), fmt.Sprintf("fd00:96::%x", i*256), 80, v1.ProtocolUDP, withEndpoints(ep("fd00:10:2::5", 53, false))))
				}
				return out
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.fam)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			plan := planned(mustPlanner(t, cfg), fullInput(view(tc.fam, tc.ports()...)))
			if len(problems(plan)) > 0 {
				t.Fatalf("problems: %v", problems(plan))
			}
			golden(t, tc.name, plan.Restore)
		})
	}
}

// TestGoldenPartial records the restore input of partial syncs.
func TestGoldenPartial(t *testing.T) {
	p := mustPlanner(t, testConfig(v1.IPv4Protocol))
	ports := mixed(v1.IPv4Protocol)
	in := fullInput(view(v1.IPv4Protocol, ports...))
	planned(p, in)

	// The web service loses its local endpoint; the empty one is deleted.
	web := *ports[0]
	web.ClusterEndpoints = web.ClusterEndpoints[1:]
	next := []*proxy.ServicePort{&web}
	next = append(next, ports[1:5]...)
	next = append(next, ports[6])
	in.View = view(v1.IPv4Protocol, next...)
	in.Changes = changed(ports[0].Name, ports[5].Name)
	plan := planned(p, in)
	if plan.Full {
		t.Fatal("plan is full")
	}
	golden(t, "ipv4-partial", plan.Restore)
}
