package linux

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

var benchSizes = flag.String("kernel-bench-sizes", "1000,5000,10000", "comma-separated Service counts for BenchmarkKernelSync")

// benchSnapshot builds n ClusterIP Services (one TCP port each) with eps
// endpoints each, the shape of the upstream benchmark.
func benchSnapshot(n, eps int) (*proxy.Snapshot, map[proxy.ServicePortName]*proxy.ServicePort) {
	ports := make(map[proxy.ServicePortName]*proxy.ServicePort, n)
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
		ports[name] = sp
	}
	return snapOfPorts(ports), ports
}

func snapOfPorts(ports map[proxy.ServicePortName]*proxy.ServicePort) *proxy.Snapshot {
	return &proxy.Snapshot{IPv4: proxy.NewFamilyView(v1.IPv4Protocol, ports), IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// kernelBenchSizes parses -kernel-bench-sizes.
func kernelBenchSizes(b *testing.B) []int {
	var sizes []int
	for _, s := range strings.Split(*benchSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			b.Fatalf("-kernel-bench-sizes: %v", err)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// BenchmarkKernelSync measures real syncs in a throwaway namespace, for each
// flavour and size (-kernel-bench-sizes): the first full sync from empty
// tables (start to programmed), the median of 5 one-endpoint-change syncs,
// and a periodic full resync. Run with -benchtime 1x.
func BenchmarkKernelSync(b *testing.B) {
	sizes := kernelBenchSizes(b)
	for _, f := range flavours {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/services=%d", f, n), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					inNetns(b, func() { benchOnce(b, f, n) })
				}
			})
		}
	}
}

func benchOnce(b *testing.B, f Flavour, n int) {
	ctx := context.Background()
	snap, ports := benchSnapshot(n, 10)
	be := systemBackend(b, v1.IPv4Protocol, f, func(o *Options) { o.KeepUpstream = true })
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	start := time.Now()
	if err := syncSnap(ctx, be, snap, proxy.Changes{Full: true}); err != nil {
		b.Fatal(err)
	}
	full := time.Since(start)
	stats := be.Last().Stats

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	var name proxy.ServicePortName
	for k := range ports {
		name = k
		break
	}
	orig := ports[name]
	var changes []time.Duration
	for i := 0; i < 5; i++ {
		sp := *orig
		sp.ClusterEndpoints = slices.Clone(orig.ClusterEndpoints)
		sp.ClusterEndpoints[0].Port = int32(9000 + i)
		ports[name] = &sp
		start := time.Now()
		if err := syncSnap(ctx, be, snapOfPorts(ports), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{name: {}}}); err != nil {
			b.Fatal(err)
		}
		changes = append(changes, time.Since(start))
		if be.Last().Full {
			b.Fatal("an endpoint change made a full sync")
		}
	}
	start = time.Now()
	if err := syncSnap(ctx, be, snapOfPorts(ports), proxy.Changes{Full: true}); err != nil {
		b.Fatal(err)
	}
	resync := time.Since(start)

	b.ReportMetric(full.Seconds(), "full-s")
	b.ReportMetric(float64(median(changes).Microseconds())/1000, "change-ms")
	b.ReportMetric(resync.Seconds(), "resync-s")
	b.ReportMetric(float64(stats.Rules), "rules")
	b.ReportMetric(float64(stats.Chains), "chains")
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "retained-MiB")
}
