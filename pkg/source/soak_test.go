package source

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/runner"
)

// SoakEnv sets the duration of TestSoak (make bench-soak: 10m). Unset, the
// test is skipped: it is a measurement, not part of CI.
const SoakEnv = "KPROXY_SOAK"

// TestSoak runs the API-server source (over a fake clientset), the cache and
// the runner against a backend that fails every sync, while EndpointSlices
// churn with node and zone names never seen before (autoscaled nodes coming
// and going) and a trigger time on every change. Heap (after a GC) and
// goroutines are sampled; the last third of the run must not hold more than
// the first third after warm-up (+25% heap, +5 goroutines). The curve is
// logged (and written to $KPROXY_SOAK_OUT when set) for docs/benchmarks.md.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv(SoakEnv))
	if err != nil || d <= 0 {
		t.Skipf("a soak run: set %s to its duration (make bench-soak runs 10m)", SoakEnv)
	}
	const (
		services = 200
		churn    = 2 * time.Millisecond // one slice update every churn
		samples  = 60
	)
	var objs []k8sruntime.Object
	for i := range services {
		objs = append(objs, soakService(i), soakSlice(i, 0))
	}
	objs = append(objs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-self"}})
	client := fake.NewClientset(objs...)

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(1)))
	defer cancel()
	var syncs, pendingTriggers int
	var mu sync.Mutex
	var c *cache.Cache
	r := runner.New(func(context.Context, bool) error {
		_, ch := c.Snapshot()
		mu.Lock()
		defer mu.Unlock()
		syncs++
		pendingTriggers = len(ch.TriggerTimes[v1.IPv4Protocol])
		return errors.New("the backend keeps failing") // never Ack
	}, runner.Options{MinInterval: 100 * time.Millisecond, MaxInterval: time.Second})
	c = cache.New(cache.Options{NodeName: "node-self", Notify: r.Trigger})

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := RunAPIServer(ctx, client, "node-self", 0, c); err != nil {
			t.Errorf("RunAPIServer: %v", err)
		}
	})
	wg.Go(func() { r.Run(ctx) })
	updates := 0
	wg.Go(func() {
		tick := time.NewTicker(churn)
		defer tick.Stop()
		for gen := 1; ; gen++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			es := soakSlice(gen%services, gen)
			if _, err := client.DiscoveryV1().EndpointSlices(es.Namespace).Update(ctx, es, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
				t.Errorf("update: %v", err)
				return
			}
			updates = gen
			if gen%1000 == 0 {
				client.ClearActions() // the fake clientset records every call
			}
		}
	})

	type sample struct {
		at         time.Duration
		heap       uint64
		goroutines int
	}
	var curve []sample
	start := time.Now()
	for i := 1; i <= samples; i++ {
		time.Sleep(time.Until(start.Add(d * time.Duration(i) / samples)))
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		curve = append(curve, sample{time.Since(start), ms.HeapAlloc, runtime.NumGoroutine()})
	}
	cancel()
	wg.Wait()

	var b strings.Builder
	fmt.Fprintf(&b, "# %d Services, one slice update every %v with new node and zone names, backend failing every sync\n", services, churn)
	fmt.Fprintf(&b, "# %d slice updates, %d syncs (all failed), %d trigger times reported by the last one\n# elapsed_s heap_MiB goroutines\n", updates, syncs, pendingTriggers)
	for _, s := range curve {
		fmt.Fprintf(&b, "%.0f %.2f %d\n", s.at.Seconds(), float64(s.heap)/(1<<20), s.goroutines)
	}
	t.Log("\n" + b.String())
	if out := os.Getenv("KPROXY_SOAK_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	third := len(curve) / 3
	avg := func(ss []sample) (heap float64, g float64) {
		for _, s := range ss {
			heap += float64(s.heap)
			g += float64(s.goroutines)
		}
		return heap / float64(len(ss)), g / float64(len(ss))
	}
	h1, g1 := avg(curve[third/2 : third]) // after warm-up
	h3, g3 := avg(curve[2*third:])
	t.Logf("heap %.2f → %.2f MiB, goroutines %.1f → %.1f (first third after warm-up → last third)", h1/(1<<20), h3/(1<<20), g1, g3)
	if h3 > h1*1.25 {
		t.Errorf("heap grew from %.2f to %.2f MiB", h1/(1<<20), h3/(1<<20))
	}
	if g3 > g1+5 {
		t.Errorf("goroutines grew from %.1f to %.1f", g1, g3)
	}
}

func soakService(i int) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "soak", Name: fmt.Sprintf("svc-%d", i)},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250),
			Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
}

// soakSlice is version gen of Service i's slice: 10 endpoints on nodes and
// in zones named after gen, so every version brings names never seen.
func soakSlice(i, gen int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "soak", Name: fmt.Sprintf("svc-%d-1", i),
			Labels:      map[string]string{discovery.LabelServiceName: fmt.Sprintf("svc-%d", i)},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Port: ptrTo(int32(8080))}},
	}
	for j := range 10 {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 1+i/250, i%250, 1+(gen+j)%250)},
			NodeName:  ptrTo(fmt.Sprintf("node-%d-%d", gen, j)),
			Zone:      ptrTo(fmt.Sprintf("zone-%d", gen)),
		})
	}
	return es
}

func ptrTo[T any](v T) *T { return &v }
