package nftables_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/nftables"
)

// benchPorts builds n ClusterIP Services (one TCP port) with eps endpoints
// each, the shape of the cluster benchmark.
func benchPorts(b testing.TB, n, eps int) ([]*proxy.ServicePort, map[proxy.ServicePortName]*intent.Port) {
	ports := map[proxy.ServicePortName]*intent.Port{}
	var sps []*proxy.ServicePort
	for i := 0; i < n; i++ {
		name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, Port: "http", Protocol: v1.ProtocolTCP}
		sp := &proxy.ServicePort{Name: name, Family: v1.IPv4Protocol, ClusterIP: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Protocol: v1.ProtocolTCP, HasAnyEndpoints: true}
		for j := 0; j < eps; j++ {
			k := i*eps + j
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, proxy.Endpoint{IP: netip.AddrFrom4([4]byte{byte(11 + k>>24), byte(k >> 16), byte(k >> 8), byte(k)}), Port: 8080, Ready: true, Serving: true})
		}
		ports[name] = nfttest.Build(b, sp)
		sps = append(sps, sp)
	}
	return sps, ports
}

// BenchmarkRenderFull10k: a full render of 10,000 Services × 10
// endpoints and its nft -f text.
func BenchmarkRenderFull10k(b *testing.B) {
	rd := nfttest.Renderer(b, nfttest.Config())
	_, ports := benchPorts(b, 10000, 10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plan, _ := rd.Render(nftables.Input{Full: true, Ports: ports, Node: nfttest.Node}, nil)
		_ = plan.Tx.String()
	}
}

// BenchmarkRenderChange10k: one endpoint of one of 10,000 Services
// replaced, rendered against the record of the full render.
func BenchmarkRenderChange10k(b *testing.B) { benchRenderChange(b, 10000) }

// BenchmarkRenderChange: the same at 1,000, 10,000 and 100,000 Services:
// the cost must not grow with the number of Services.
func BenchmarkRenderChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchRenderChange(b, n) })
	}
}

func benchRenderChange(b *testing.B, n int) {
	rd := nfttest.Renderer(b, nfttest.Config())
	sps, ports := benchPorts(b, n, 10)
	_, a := rd.Render(nftables.Input{Full: true, Ports: ports, Node: nfttest.Node}, nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sp := *sps[n/2]
		sp.ClusterEndpoints = append([]proxy.Endpoint(nil), sp.ClusterEndpoints...)
		sp.ClusterEndpoints[0].Port = int32(9000 + i%100)
		p := nfttest.Build(b, &sp)
		plan, _ := rd.Render(nftables.Input{Ports: map[proxy.ServicePortName]*intent.Port{sp.Name: p}, Node: nfttest.Node}, a)
		_ = plan.Tx.String()
	}
}

// BenchmarkRecordHeap10k: the heap the renderer's record (Applied) of a
// full render of 10,000 Services × 10 endpoints holds: the live heap
// after a collection with the record kept, less the live heap before the
// render with the ports already built (reported as record-MB).
func BenchmarkRecordHeap10k(b *testing.B) {
	rd := nfttest.Renderer(b, nfttest.Config())
	_, ports := benchPorts(b, 10000, 10)
	var ms runtime.MemStats
	for i := 0; i < b.N; i++ {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		_, a := rd.Render(nftables.Input{Full: true, Ports: ports, Node: nfttest.Node}, nil)
		runtime.GC()
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapAlloc-before)/1e6, "record-MB")
		b.ReportMetric(float64(a.Ports()), "ports")
		runtime.KeepAlive(a)
	}
	runtime.KeepAlive(ports)
}

// BenchmarkFullSync10k: what a full sync of 10,000 Services × 10
// endpoints costs before the kernel, as System.Run does it: the render,
// the nft -f text of the chains and rules (Split's pre and post) and the
// elements encoded as one netlink batch (BenchmarkRenderFull10k renders
// the elements as text too, which a sync over netlink never does).
func BenchmarkFullSync10k(b *testing.B) {
	rd := nfttest.Renderer(b, nfttest.Config())
	_, ports := benchPorts(b, 10000, 10)
	b.ReportAllocs()
	for b.Loop() {
		plan, _ := rd.Render(nftables.Input{Full: true, Ports: ports, Node: nfttest.Node}, nil)
		pre, bulk, post, ok := plan.Tx.Split()
		if !ok {
			b.Fatal("the full render does not split")
		}
		_, _ = pre.Bytes(), post.Bytes()
		if _, err := nftables.EncodeBatch(plan.Tx.Family(), bulk, 1, nftables.MaxBulkElems); err != nil {
			b.Fatal(err)
		}
	}
}
