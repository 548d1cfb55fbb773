package healthcheck

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// largeSnapshot has services Services of ports ports each, every tenth a
// LoadBalancer with externalTrafficPolicy Local and a health check node
// port, each port with endpoints endpoints (a quarter of them local).
func largeSnapshot(services, ports, endpoints int) *proxy.Snapshot {
	m := map[proxy.ServicePortName]*proxy.ServicePort{}
	for s := range services {
		name := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", s)}
		for p := range ports {
			sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: name, Port: fmt.Sprintf("p%d", p), Protocol: v1.ProtocolTCP},
				Family: v1.IPv4Protocol, Port: int32(80 + p), HasAnyEndpoints: true}
			if s%10 == 0 {
				sp.Type, sp.NodePort, sp.ExternalPolicyLocal, sp.HealthCheckNodePort = v1.ServiceTypeLoadBalancer, int32(30000+s), true, int32(32000+s)
			}
			for e := range endpoints {
				ep := proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, byte(s >> 8), byte(s), byte(e)}), Port: 8080, Ready: true, Serving: true, Local: e%4 == 0}
				sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
				if ep.Local && sp.ExternalPolicyLocal {
					sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
				}
			}
			m[sp.Name] = sp
		}
	}
	return &proxy.Snapshot{IPv4: proxy.NewFamilyView(v1.IPv4Protocol, m), IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)}
}

// BenchmarkServicesFromSnapshot measures what every successful sync pays to
// derive the health check node ports: 10,000 service ports (5,000 Services
// of 2 ports, 500 of them with a health check node port), 10 endpoints each.
func BenchmarkServicesFromSnapshot(b *testing.B) {
	snap := largeSnapshot(5000, 2, 10)
	b.ReportAllocs()
	for b.Loop() {
		if got := ServicesFromSnapshot(snap); len(got) != 500 {
			b.Fatalf("%d services", len(got))
		}
	}
}
