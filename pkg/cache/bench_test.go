package cache

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// cluster makes n Services with one TCP port and e endpoints each, spread over 100 nodes.
func cluster(n, e int) ([]*v1.Service, []*discovery.EndpointSlice) {
	svcs := make([]*v1.Service, 0, n)
	sls := make([]*discovery.EndpointSlice, 0, n)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc-%d", i)
		svcs = append(svcs, svc("ns/"+name, []string{fmt.Sprintf("10.%d.%d.%d", 96+i/(250*256), (i/250)%256, i%250+1)}, []string{"http:80"}))
		var eps []ep
		for j := 0; j < e; j++ {
			k := i*e + j
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d@node%d", 1+k/65000, (k/250)%256, k%250+1, k%100)))
		}
		sls = append(sls, slice("ns/"+name+"-abc", name, discovery.AddressTypeIPv4, []string{"http:8080"}, eps...))
	}
	return svcs, sls
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// loaded returns a cache that took svcs and sls and published (and had
// acknowledged) its first snapshot.
func loaded(svcs []*v1.Service, sls []*discovery.EndpointSlice) *Cache {
	c := New(Options{NodeName: "node1", Logger: ptr(discardLogger())})
	for _, s := range svcs {
		c.OnService(nil, s)
	}
	for _, s := range sls {
		c.OnEndpointSlice(nil, s)
	}
	snap, _ := c.Snapshot()
	c.Ack(snap)
	return c
}

// held is the heap a cache holds (its parsed objects and the published
// snapshot) for n Services × e endpoints.
func held(n, e int) uint64 {
	svcs, sls := cluster(n, e)
	before := heapInUse()
	c := loaded(svcs, sls)
	h := heapInUse() - before
	runtime.KeepAlive(c)
	runtime.KeepAlive(svcs) // the informers' objects are not the cache's
	runtime.KeepAlive(sls)
	return h
}

// BenchmarkHeld10kServices reports the heap the cache holds for 10,000
// Services × 10 endpoints, and what one more endpoint costs (B/endpoint:
// the difference with 10,000 × 20, per endpoint).
func BenchmarkHeld10kServices(b *testing.B) {
	var h10, h20 uint64
	for b.Loop() {
		h10, h20 = held(10000, 10), held(10000, 20)
	}
	b.ReportMetric(float64(h10)/(1<<20), "MiB-held")
	b.ReportMetric(float64(int64(h20)-int64(h10))/(10000*10), "B/endpoint")
}

// BenchmarkFullSnapshot measures computing the whole desired state from scratch.
func BenchmarkFullSnapshot(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, sls := cluster(n, 10)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				Build("node1", nil, svcs, sls)
			}
		})
	}
}

// BenchmarkOneEndpointChange measures the cost of a snapshot after one
// EndpointSlice change in a large cluster: only one Service is recomputed.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, sls := cluster(n, 10)
			c := loaded(svcs, sls)
			old := sls[n/2]
			alt := old.DeepCopy()
			alt.Endpoints = alt.Endpoints[1:]
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.OnEndpointSlice(old, alt)
				snap, _ := c.Snapshot()
				c.Ack(snap)
				old, alt = alt, old
			}
		})
	}
}

// BenchmarkIngest10k: the initial lists' objects handed to the cache, one
// by one, as the informers deliver them (Services, then slices).
func BenchmarkIngest10k(b *testing.B) {
	svcs, sls := cluster(10000, 10)
	b.ReportAllocs()
	for b.Loop() {
		c := New(Options{NodeName: "node1", Logger: ptr(discardLogger())})
		for _, s := range svcs {
			c.OnService(nil, s)
		}
		for _, s := range sls {
			c.OnEndpointSlice(nil, s)
		}
	}
}
