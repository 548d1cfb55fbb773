package linux

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	"github.com/kproxy/kproxy/test/proxytest"
)

// systemNFTBackend returns an nftables backend on the real nft tool and
// kernel of the calling thread's namespace.
func systemNFTBackend(t testing.TB, fam v1.IPFamily) *NFTBackend {
	t.Helper()
	n, err := nftables.NewSystem(nftables.Family(fam))
	if err != nil {
		t.Fatal(err)
	}
	cfg := facts.DefaultConfig(fam)
	cfg.ClusterCIDRs = proxytest.Default().ClusterCIDRs()
	b, err := NewNFT(NFTOptions{Rules: cfg, NFT: n, Conntrack: netlinkConntrack{}, Host: &FakeHost{}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkKernelNFTSync is BenchmarkKernelSync for the nftables mode: in a
// throwaway namespace, for each size (-kernel-bench-sizes), the first full
// sync from an empty ruleset, the median of 5 one-endpoint-change syncs
// (an endpoint replaced: elements only), the median of 5 endpoint
// additions and removals (the count changes: the verdict elements too) and
// a periodic full resync over the live table. Run with -benchtime 1x.
func BenchmarkKernelNFTSync(b *testing.B) {
	for _, n := range kernelBenchSizes(b) {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				inNetns(b, func() { benchNFTOnce(b, n) })
			}
		})
	}
}

func benchNFTOnce(b *testing.B, n int) {
	ctx := context.Background()
	snap, ports := benchSnapshot(n, 10)
	be := systemNFTBackend(b, v1.IPv4Protocol)
	if os.Getenv("KPROXY_NFT_NO_NETLINK") != "" {
		// For comparison: every transaction through nft -f.
		be.m.opts.NFT.(*nftables.System).SetNetlink(false)
	}
	runtime.GC()
	start := time.Now()
	if err := syncSnap(ctx, be, snap, proxy.Changes{Full: true}); err != nil {
		b.Fatal(err)
	}
	full := time.Since(start)
	stats := be.Last().Stats

	name := snap.IPv4.Sorted()[n/2].Name
	orig := ports[name]
	sync := func(sp *proxy.ServicePort) time.Duration {
		ports[name] = sp
		start := time.Now()
		if err := syncSnap(ctx, be, snapOfPorts(ports), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{name: {}}}); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		if be.Last().Full {
			b.Fatal("an endpoint change made a full sync")
		}
		return took
	}
	var changes, counts []time.Duration
	for i := range 5 {
		sp := *orig
		sp.ClusterEndpoints = slices.Clone(orig.ClusterEndpoints)
		sp.ClusterEndpoints[0].Port = int32(9000 + i)
		changes = append(changes, sync(&sp))
	}
	for i := range 5 {
		sp := *orig
		sp.ClusterEndpoints = slices.Clone(orig.ClusterEndpoints)
		if i%2 == 0 {
			ep := sp.ClusterEndpoints[0]
			ep.Port = 7000
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
		} else {
			sp.ClusterEndpoints = sp.ClusterEndpoints[1:]
		}
		counts = append(counts, sync(&sp))
	}
	start = time.Now()
	if err := syncSnap(ctx, be, snapOfPorts(ports), proxy.Changes{Full: true}); err != nil {
		b.Fatal(err)
	}
	resync := time.Since(start)

	b.ReportMetric(full.Seconds(), "full-s")
	b.ReportMetric(float64(median(changes).Microseconds())/1000, "change-ms")
	b.ReportMetric(float64(median(counts).Microseconds())/1000, "count-change-ms")
	b.ReportMetric(resync.Seconds(), "resync-s")
	b.ReportMetric(float64(stats.Elements), "elements")
	b.ReportMetric(float64(stats.Chains), "chains")
}

// timedNFT times the Run calls of an nft seam.
type timedNFT struct {
	nftables.Interface
	runs []time.Duration
}

func (t *timedNFT) Run(ctx context.Context, tx *nftables.Tx) error {
	start := time.Now()
	err := t.Interface.Run(ctx, tx)
	t.runs = append(t.runs, time.Since(start))
	return err
}

func TestNFTSyncBreakdown(t *testing.T) {
	if os.Getenv("KPROXY_NFT_BREAKDOWN") == "" {
		t.Skip("timing probe: KPROXY_NFT_BREAKDOWN=1")
	}
	inNetns(t, func() {
		ctx := context.Background()
		snap, ports := benchSnapshot(10000, 10)
		be := systemNFTBackend(t, v1.IPv4Protocol)
		tn := &timedNFT{Interface: be.m.opts.NFT}
		be.m.opts.NFT = tn
		if err := syncSnap(ctx, be, snap, proxy.Changes{Full: true}); err != nil {
			t.Fatal(err)
		}
		name := snap.IPv4.Sorted()[5000].Name
		orig := ports[name]
		var syncs []time.Duration
		for i := range 20 {
			sp := *orig
			sp.ClusterEndpoints = slices.Clone(orig.ClusterEndpoints)
			sp.ClusterEndpoints[0].Port = int32(9000 + i)
			ports[name] = &sp
			start := time.Now()
			if err := syncSnap(ctx, be, snapOfPorts(ports), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{name: {}}}); err != nil {
				t.Fatal(err)
			}
			syncs = append(syncs, time.Since(start))
		}
		t.Logf("full run %v; change syncs %v; nft runs %v", tn.runs[0], syncs, tn.runs[1:])
	})
}
