package iptables

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// benchPorts builds n ClusterIP service ports with eps endpoints each, like
// the upstream benchmark (10 endpoints per Service).
func benchPorts(n, eps int) map[proxy.ServicePortName]*proxy.ServicePort {
	out := make(map[proxy.ServicePortName]*proxy.ServicePort, n)
	for i := 0; i < n; i++ {
		name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, Port: "http", Protocol: v1.ProtocolTCP}
		sp := &proxy.ServicePort{
			Name: name, Family: v1.IPv4Protocol, Type: v1.ServiceTypeClusterIP,
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Protocol: v1.ProtocolTCP,
			HasAnyEndpoints: true,
		}
		for j := 0; j < eps; j++ {
			k := i*eps + j
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, proxy.Endpoint{
				IP: netip.AddrFrom4([4]byte{10, byte(128 + k>>16), byte(k >> 8), byte(k)}), Port: 8080, Ready: true, Serving: true,
			})
		}
		out[name] = sp
	}
	return out
}

var benchSizes = []int{1000, 10000, 20000}

// BenchmarkPlanFull measures the start-up plan: a new planner rendering every
// Service (10 endpoints each).
func BenchmarkPlanFull(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			v := proxy.NewFamilyView(v1.IPv4Protocol, benchPorts(n, 10))
			in := fullInput(v)
			cfg := testConfig(v1.IPv4Protocol)
			var plan *Plan
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				plan = planned(mustPlanner(b, cfg), in)
			}
			b.ReportMetric(float64(plan.Stats.Rules), "rules")
			b.ReportMetric(float64(plan.Stats.Chains), "chains")
			b.ReportMetric(float64(len(plan.Restore)), "bytes")
		})
	}
}

// BenchmarkPlanOneEndpointChange measures a partial plan after one
// endpoint of one Service changed.
func BenchmarkPlanOneEndpointChange(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ports := benchPorts(n, 10)
			p := mustPlanner(b, testConfig(v1.IPv4Protocol))
			in := fullInput(proxy.NewFamilyView(v1.IPv4Protocol, ports))
			planned(p, in)
			var name proxy.ServicePortName
			for k := range ports {
				name = k
				break
			}
			orig := ports[name]
			variants := [2]*proxy.ServicePort{}
			for i := range variants {
				sp := *orig
				sp.ClusterEndpoints = append([]proxy.Endpoint{}, orig.ClusterEndpoints...)
				sp.ClusterEndpoints[0].Port = int32(9000 + i)
				variants[i] = &sp
			}
			views := [2]*proxy.FamilyView{}
			for i := range views {
				m := clone(ports)
				m[name] = variants[i]
				views[i] = proxy.NewFamilyView(v1.IPv4Protocol, m)
			}
			in.Changes = changed(name)
			var plan *Plan
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				in.View = views[i%2]
				plan = planned(p, in)
			}
			b.ReportMetric(float64(plan.Stats.WrittenRules), "rules-written")
		})
	}
}
