package integration

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var (
	benchChurnRate    = flag.Int("cluster-bench-churn-rate", 0, "EndpointSlice updates per second of BenchmarkCluster's churn run, after its changes (0: no churn run)")
	benchChurnSeconds = flag.Int("cluster-bench-churn-seconds", 60, "length of the churn run, in seconds")
	benchChurnWriters = flag.Int("cluster-bench-churn-writers", 8, "parallel writers of the churn run's updates")
)

// churnResult is what a churn run measured.
type churnResult struct {
	// sent counts the updates the API server accepted; seen those whose
	// new endpoint reached the kernel before the run's end (and its grace);
	// overruns the notification bursts the watch's socket dropped.
	sent, seen, failed, overruns int
	// rate is the achieved update rate (per second).
	rate float64
	// p50, p99 and max of write → kernel (nft monitor) over the seen
	// updates; unseen ones count as the grace limit in the percentiles.
	p50, p99, max time.Duration
	// cpu is the proxy's CPU use over the run, in cores.
	cpu float64
}

// benchAddr matches an endpoint address of the bench (10.128.0.0/9) spelt
// in dotted quad, as upstream's endpoint chain names hold it (after "__",
// so not at a word boundary).
var benchAddr = regexp.MustCompile(`(?:^|[^\d.])(10\.(?:1(?:2[89]|[3-9]\d)|2[0-5]\d)\.\d{1,3}\.\d{1,3})(?:[^\d.]|$)`)

// churn replaces, rate times a second for the given duration, one endpoint
// of a loaded Service with an address never used before, as a rolling
// restart of many Deployments makes the EndpointSlice controller do: each
// update is a JSON patch of one slice (its first endpoint's address and
// the trigger-time annotation), spread over the Services so that no two are
// in flight on one slice. A kernelWatch in host's namespace stamps the
// moment each new address reaches the kernel; the latency of an update is
// from just before its write to that moment, API round trip included (as
// the network programming latency counts it). The proxy's CPU is read from
// /proc over the run.
func (w *benchWorld) churn(ctx context.Context, host string, pid, rate int, d time.Duration) churnResult {
	b := w.b
	ns, err := w.Cluster.MustNS(host)
	if err != nil {
		b.Fatal(err)
	}
	kw, err := watchKernel(ns)
	if err != nil {
		b.Fatalf("watching nf_tables on %s: %v", host, err)
	}
	defer kw.stop()

	cpu0, err := ProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	total := rate * int(d/time.Second)
	type job struct {
		svc  int
		addr string
	}
	jobs := make(chan job, total)
	var mu sync.Mutex
	var failed []error
	var wg sync.WaitGroup
	api := w.Admin.DiscoveryV1().EndpointSlices(benchNamespace)
	for range max(*benchChurnWriters, 1) {
		wg.Go(func() {
			for j := range jobs {
				now := time.Now()
				patch, _ := json.Marshal([]map[string]any{
					{"op": "replace", "path": "/endpoints/0/addresses/0", "value": j.addr},
					{"op": "add", "path": "/metadata/annotations/" + strings.ReplaceAll(v1.EndpointsLastChangeTriggerTime, "/", "~1"),
						"value": now.UTC().Format(time.RFC3339Nano)},
				})
				addr := netip.MustParseAddr(j.addr)
				kw.await(addr, now)
				if _, err := api.Patch(ctx, benchService(j.svc).Name+"-ipv4", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
					kw.forget(addr)
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}
		})
	}
	// The pacer: update k is due at begin + k/rate; a late writer pool
	// shows as a lower achieved rate, never as a burst.
	begin := time.Now()
	interval := time.Second / time.Duration(rate)
	for k := range total {
		if wait := time.Until(begin.Add(time.Duration(k) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		w.changed++
		// Services far apart, none twice while total ≤ n, the changes'
		// one (n/2) left out.
		svc := (k * 7919) % w.n
		if svc == w.n/2 {
			svc = (svc + 1) % w.n
		}
		jobs <- job{svc: svc, addr: benchEndpoint(w.n*w.eps + w.changed)}
	}
	close(jobs)
	wg.Wait()
	took := time.Since(begin)
	cpu1, err := ProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	// What was sent has a grace of 10 s to reach the kernel.
	const grace = 10 * time.Second
	for deadline := time.Now().Add(grace); time.Now().Before(deadline) && kw.pending() > 0; {
		time.Sleep(100 * time.Millisecond)
	}
	kw.stop()

	var ds []time.Duration
	for a := range kw.sent {
		l, ok := kw.seen[a]
		if !ok {
			l = grace
		}
		ds = append(ds, l)
	}
	r := churnResult{sent: len(kw.sent), seen: len(kw.seen), failed: len(failed), overruns: int(kw.overruns.Load()),
		rate: float64(len(kw.sent)+len(failed)) / took.Seconds(), cpu: (cpu1 - cpu0).Seconds() / took.Seconds()}
	if len(failed) > 0 {
		b.Logf("churn: %d of %d updates failed, first: %v", len(failed), total, failed[0])
	}
	if len(ds) > 0 {
		r.p50, r.p99, r.max = median(ds), percentile(ds, 0.99), percentile(ds, 1)
	}
	return r
}

func (r churnResult) String() string {
	return fmt.Sprintf("%d updates at %.1f/s (%d failed), %d in the kernel (watch overruns %d): write → kernel p50 %v, p99 %v, max %v; proxy CPU %.2f cores",
		r.sent, r.rate, r.failed, r.seen, r.overruns, round(r.p50), round(r.p99), round(r.max), r.cpu)
}
