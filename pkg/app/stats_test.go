package app

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/healthcheck"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// randomService is Service i of the stats test: a random type, traffic
// policies and load-balancing annotation.
func randomService(rnd *rand.Rand, i int) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d", i)},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  fmt.Sprintf("10.96.0.%d", i+1),
			ClusterIPs: []string{fmt.Sprintf("10.96.0.%d", i+1)},
			Ports:      []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	if rnd.IntN(2) == 0 {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = int32(30000 + i)
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: fmt.Sprintf("192.0.2.%d", i+1)}}
		if rnd.IntN(2) == 0 {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = int32(32000 + i)
		}
	}
	if rnd.IntN(3) == 0 {
		local := v1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &local
	}
	if rnd.IntN(3) == 0 {
		s.Annotations = map[string]string{"kproxy.io/load-balancing": []string{"round-robin", "source-hash", "random"}[rnd.IntN(3)]}
	}
	return s
}

// randomSlice is Service i's slice: 0 to 3 endpoints on node1 or node2,
// ready or not.
func randomSlice(rnd *rand.Rand, i int) *discovery.EndpointSlice {
	name, port, proto := "p", int32(8080), v1.ProtocolTCP
	sl := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d-x", i), Labels: map[string]string{discovery.LabelServiceName: fmt.Sprintf("s%d", i)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for j := range rnd.IntN(4) {
		ready := rnd.IntN(4) != 0
		node := []string{"node1", "node2"}[rnd.IntN(2)]
		sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i, j+1)},
			Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return sl
}

func portsOf(m map[proxy.ServicePortName]*proxy.ServicePort) []*proxy.ServicePort {
	var out []*proxy.ServicePort
	for _, p := range m {
		out = append(out, p)
	}
	return out
}

// TestFamilyStatsFollowTheChanges: the counts kept from the changed ports
// only (metrics and health check node ports) equal a count of every port,
// after each of many random changes (a Service or slice added, changed or
// deleted), also when some changes are not acknowledged at once.
func TestFamilyStatsFollowTheChanges(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 25))
	c := cache.New(cache.Options{NodeName: "node1", Notify: func() {}})
	c.OnNode(nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}})
	const n = 30
	svcs := make([]*v1.Service, n)
	sls := make([]*discovery.EndpointSlice, n)
	var st familyStats
	for step := range 400 {
		i := rnd.IntN(n)
		switch op := rnd.IntN(5); {
		case op < 2:
			next := randomService(rnd, i)
			c.OnService(svcs[i], next)
			svcs[i] = next
		case op < 4:
			next := randomSlice(rnd, i)
			c.OnEndpointSlice(sls[i], next)
			sls[i] = next
		case svcs[i] != nil && op == 4:
			c.OnService(svcs[i], nil)
			svcs[i] = nil
		}
		if rnd.IntN(3) == 0 {
			continue // the change waits for the next sync, as after a failed one
		}
		snap, ch := c.Snapshot()
		before := map[types.NamespacedName]map[proxy.ServicePortName]*proxy.ServicePort{}
		for svc, ports := range st.health {
			before[svc] = maps.Clone(ports)
		}
		touched, all := st.update(snap.IPv4, ch)
		c.Ack(snap)

		var fresh familyStats
		fresh.update(snap.IPv4, proxy.Changes{Full: true})
		internal, external := metrics.CountNoLocalEndpoints(snap.IPv4)
		if st.noLocalInternal != internal || st.noLocalExternal != external || fresh.noLocalInternal != internal || fresh.noLocalExternal != external {
			t.Fatalf("step %d: no local endpoints: kept %d/%d, counted %d/%d", step, st.noLocalInternal, st.noLocalExternal, internal, external)
		}
		for a, k := range fresh.byAlgorithm {
			if st.byAlgorithm[a] != k {
				t.Fatalf("step %d: algorithm %q: kept %d, counted %d", step, a, st.byAlgorithm[a], k)
			}
		}
		want := healthcheck.ServicesFromSnapshot(&proxy.Snapshot{IPv4: snap.IPv4, IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)})
		stats := [2]familyStats{st}
		if got := servicesHealth(&stats, nil); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: health check services: kept %v, counted %v", step, got, want)
		}
		// A Service whose health changed is among the touched ones.
		if !all {
			for svc, h := range want {
				if old := healthcheck.ServicesFromPorts(portsOf(before[svc])); !reflect.DeepEqual(old[svc], h) {
					if _, ok := touched[svc]; !ok {
						t.Fatalf("step %d: %s's health changed (%v → %v) but it is not touched", step, svc, old[svc], h)
					}
				}
			}
			for svc := range before {
				if _, still := want[svc]; !still {
					if _, ok := touched[svc]; !ok {
						t.Fatalf("step %d: %s lost its health check node port but is not touched", step, svc)
					}
				}
			}
		}
	}
}
