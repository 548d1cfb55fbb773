package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
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
	// new endpoint reached the kernel before the run's end (and its grace).
	sent, seen, failed int
	// rate is the achieved update rate (per second).
	rate float64
	// p50, p99 and max of write → kernel (nft monitor) over the seen
	// updates; unseen ones count as the grace limit in the percentiles.
	p50, p99, max time.Duration
	// cpu is the proxy's CPU use over the run, in cores.
	cpu float64
}

// benchAddr matches an endpoint address of the bench (10.128.0.0/9) in nft
// monitor's output: kproxy's set elements, upstream's endpoint chain names
// and DNAT rules all spell it in dotted quad.
// (after "__" in upstream's chain names, so not a word boundary).
var benchAddr = regexp.MustCompile(`(?:^|[^\d.])(10\.(?:1(?:2[89]|[3-9]\d)|2[0-5]\d)\.\d{1,3}\.\d{1,3})(?:[^\d.]|$)`)

// monitorAddrs returns the bench addresses an nft monitor line adds (none
// for a deletion).
func monitorAddrs(line string) []string {
	if !strings.HasPrefix(line, "add ") {
		return nil
	}
	var out []string
	for _, m := range benchAddr.FindAllStringSubmatch(line, -1) {
		out = append(out, m[1])
	}
	return out
}

// churn replaces, rate times a second for the given duration, one endpoint
// of a loaded Service with an address never used before, as a rolling
// restart of many Deployments makes the EndpointSlice controller do: each
// update is a JSON patch of one slice (its first endpoint's address and
// the trigger-time annotation), spread over the Services so that no two are
// in flight on one slice. An `nft monitor` in host's namespace stamps the
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
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	mon, err := ns.Command(mctx, "nft", "monitor")
	if err != nil {
		b.Fatal(err)
	}
	out, err := mon.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := mon.Start(); err != nil {
		b.Fatalf("nft monitor on %s: %v", host, err)
	}
	defer func() { stop(); _ = mon.Wait() }()

	var mu sync.Mutex
	sentAt := map[string]time.Time{}
	latency := map[string]time.Duration{}
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			now := time.Now()
			addrs := monitorAddrs(sc.Text())
			if len(addrs) == 0 {
				continue
			}
			mu.Lock()
			for _, a := range addrs {
				if t, ok := sentAt[a]; ok {
					if _, done := latency[a]; !done {
						latency[a] = now.Sub(t)
					}
				}
			}
			mu.Unlock()
		}
	}()
	// nft monitor prints nothing when it is ready: give it a moment.
	time.Sleep(500 * time.Millisecond)

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
				mu.Lock()
				sentAt[j.addr] = now
				mu.Unlock()
				if _, err := api.Patch(ctx, benchService(j.svc).Name+"-ipv4", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
					mu.Lock()
					delete(sentAt, j.addr)
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
		// Services far apart, none twice (total ≤ n), the changes' one
		// (n/2) left out.
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
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		mu.Lock()
		pending := len(sentAt) - len(latency)
		mu.Unlock()
		if pending == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	<-monitorDone

	mu.Lock()
	defer mu.Unlock()
	var ds []time.Duration
	for a := range sentAt {
		l, ok := latency[a]
		if !ok {
			l = grace
		}
		ds = append(ds, l)
	}
	r := churnResult{sent: len(sentAt), seen: len(latency), failed: len(failed),
		rate: float64(len(sentAt)+len(failed)) / took.Seconds(), cpu: (cpu1 - cpu0).Seconds() / took.Seconds()}
	if len(failed) > 0 {
		b.Logf("churn: %d of %d updates failed, first: %v", len(failed), total, failed[0])
	}
	if len(ds) > 0 {
		r.p50, r.p99, r.max = median(ds), percentile(ds, 0.99), percentile(ds, 1)
	}
	return r
}

func (r churnResult) String() string {
	return fmt.Sprintf("%d updates at %.1f/s (%d failed), %d in the kernel: write → kernel p50 %v, p99 %v, max %v; proxy CPU %.2f cores",
		r.sent, r.rate, r.failed, r.seen, round(r.p50), round(r.p99), round(r.max), r.cpu)
}

func TestMonitorAddrs(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		// kproxy: an element of an endpoint map.
		{"add element ip kproxy ep-0001-cluster { 0 : 10.128.39.17 . 8080 }", []string{"10.128.39.17"}},
		// upstream nftables: an endpoint chain and its DNAT rule.
		{"add chain ip kube-proxy endpoint-AB12CD34-bench/svc-00001/tcp/http__10.255.3.4/8080", []string{"10.255.3.4"}},
		{"add rule ip kube-proxy endpoint-AB12CD34-bench/svc-00001/tcp/http__10.200.0.9/8080 meta l4proto tcp dnat to 10.200.0.9:8080", []string{"10.200.0.9", "10.200.0.9"}},
		// A deletion, and addresses outside the bench's range.
		{"delete element ip kproxy ep-0001-cluster { 0 : 10.128.39.17 . 8080 }", nil},
		{"add element ip kproxy cluster-ips { 10.96.0.10 }", nil},
		{"add element ip kproxy x { 10.127.0.1, 10.2.128.1 }", nil},
	} {
		if got := monitorAddrs(tc.line); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%q: %v, want %v", tc.line, got, tc.want)
		}
	}
}
