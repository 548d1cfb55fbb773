package app

import (
	"context"
	"fmt"
	"net"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/healthcheck"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/metrics"
)

// nopBackend programs nothing: the benchmark measures kproxy's own stages.
type nopBackend struct{ changed int }

func (b *nopBackend) Sync(_ context.Context, v *intent.View) error {
	b.changed += v.NumChanged()
	return nil
}

// benchCluster fills c with n Services of one TCP port and 10 endpoints on
// 100 nodes, every tenth a LoadBalancer with externalTrafficPolicy Local
// (a health check node port) among the first 10,000, and returns the
// slices.
func benchCluster(c *cache.Cache, n int) []*discovery.EndpointSlice {
	name, port, proto := "http", int32(8080), v1.ProtocolTCP
	ready := true
	sls := make([]*discovery.EndpointSlice, n)
	for i := range n {
		ip := fmt.Sprintf("10.%d.%d.%d", 96+i/(250*256), (i/250)%256, i%250+1)
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d", i)},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
		if i%10 == 0 && i < 10000 {
			svc.Spec.Type = v1.ServiceTypeLoadBalancer
			svc.Spec.Ports[0].NodePort = int32(30000 + i/10)
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			svc.Spec.HealthCheckNodePort = int32(31000 + i/10)
		}
		c.OnService(nil, svc)
		sl := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d-x", i),
			Labels: map[string]string{discovery.LabelServiceName: svc.Name}}, AddressType: discovery.AddressTypeIPv4,
			Ports: []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}}}
		for j := range 10 {
			k := i*10 + j
			node := fmt.Sprintf("node%d", k%100)
			sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 1+k/65000, (k/250)%256, k%250+1)},
				Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node})
		}
		c.OnEndpointSlice(nil, sl)
		sls[i] = sl
	}
	return sls
}

// BenchmarkPartialSync: one EndpointSlice change, then a sync, through
// every stage of kproxy's own (cache, snapshot, intent view, unsupported
// and quarantine reports, metrics, health check node ports) with a
// backend that programs nothing (platform/linux/nftables'
// BenchmarkRenderChange measures the renderer). The cost must not grow
// with the number of Services.
func BenchmarkPartialSync(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			logger := klog.Background().V(10) // nothing logged
			c := cache.New(cache.Options{NodeName: "node1", Notify: func() {}})
			sls := benchCluster(c, n)
			be := &nopBackend{}
			hc := healthcheck.NewServiceServers(healthcheck.ServiceOptions{Listen: fakeListen})
			defer hc.Close()
			s := &syncer{cache: c, backends: Backends{{Family: v1.IPv4Protocol, Backend: be}}, log: logger,
				clock: clock.RealClock{}, metrics: metrics.New(metrics.Options{Mode: "nftables"}),
				health: healthcheck.NewProxyHealth(0, clock.RealClock{}), services: hc,
				reporter: newReporter(logger, nil, "node1", newServiceUIDs()), classify: func(error) metrics.Cause { return "" }}
			ctx := context.Background()
			if _, err := s.sync(ctx, true); err != nil {
				b.Fatal(err)
			}
			old := sls[n/2+1] // a ClusterIP Service
			alt := old.DeepCopy()
			alt.Endpoints = alt.Endpoints[1:]
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				c.OnEndpointSlice(old, alt)
				if _, err := s.sync(ctx, false); err != nil {
					b.Fatal(err)
				}
				old, alt = alt, old
			}
			b.StopTimer()
			if be.changed < b.N {
				b.Fatalf("%d ports changed in %d syncs", be.changed, b.N)
			}
		})
	}
}

var _ intent.Backend = (*nopBackend)(nil)

// idleListener accepts nothing until closed.
type idleListener struct {
	addr   net.Addr
	closed chan struct{}
}

func (l *idleListener) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *idleListener) Close() error {
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}
func (l *idleListener) Addr() net.Addr { return l.addr }

// fakeListen opens idle listeners: health check node ports without sockets.
func fakeListen(network, address string) (net.Listener, error) {
	addr, err := net.ResolveTCPAddr(network, address)
	if err != nil {
		return nil, err
	}
	return &idleListener{addr: addr, closed: make(chan struct{})}, nil
}
