package cache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// TestConcurrentSliceUpdatesNeverShrinkAPort runs informer-like goroutines
// that keep replacing the versions of a Service's EndpointSlices (every
// version holds the same number of ready endpoints, only their addresses
// move) while another goroutine keeps the Service dirty and a snapshot loop
// checks the published port. At no point may the port hold fewer endpoints
// than every version of its slices holds: an update is a swap, never a
// removal followed by an addition that a snapshot can see half done.
//
// It is bounded by an iteration count and a deadline, and stops at the first
// violation.
func TestConcurrentSliceUpdatesNeverShrinkAPort(t *testing.T) {
	const (
		perSlice = 200 // large slices make parsing (the old unlocked window) slow
		slices   = 2
		rounds   = 300
	)
	c := New(Options{NodeName: thisNode, Logger: ptr(discardLogger())})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.1"}, []string{"80"}))
	version := func(s, v int) *discovery.EndpointSlice {
		eps := make([]ep, perSlice)
		for i := range eps {
			// Versions use disjoint address ranges so that no endpoint is
			// carried over from the previous version of the same slice.
			eps[i] = ep(fmt.Sprintf("10.%d.%d.%d", 1+s, v%200, 1+i))
		}
		return slice(fmt.Sprintf("ns/a-%d", s), "a", discovery.AddressTypeIPv4, []string{"80"}, eps...)
	}
	cur := make([]*discovery.EndpointSlice, slices)
	for s := range cur {
		cur[s] = version(s, 0)
		c.OnEndpointSlice(nil, cur[s])
	}
	name := spn("ns/a", "", v1.ProtocolTCP)
	want := perSlice * slices
	if got := len(mustPort(t, mustSnap(c), v1.IPv4Protocol, name).ClusterEndpoints); got != want {
		t.Fatalf("initial endpoints %d, want %d", got, want)
	}

	deadline := time.Now().Add(20 * time.Second)
	var stop atomic.Bool
	var wg, informers sync.WaitGroup
	for s := range slices {
		wg.Add(1)
		informers.Add(1)
		go func() { // one informer per slice: its updates are ordered
			defer wg.Done()
			defer informers.Done()
			prev := cur[s]
			for v := 1; v <= rounds && !stop.Load() && time.Now().Before(deadline); v++ {
				next := version(s, v)
				c.OnEndpointSlice(prev, next)
				prev = next
			}
		}()
	}
	slicesDone := make(chan struct{})
	go func() { informers.Wait(); close(slicesDone) }()
	wg.Add(1)
	go func() { // Service events keep the Service dirty
		defer wg.Done()
		s := svc("ns/a", []string{"10.96.0.1"}, []string{"80"})
		for !stop.Load() && time.Now().Before(deadline) && !isClosed(slicesDone) {
			c.OnService(s, s)
			time.Sleep(10 * time.Microsecond)
		}
	}()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	checks, bad := 0, 0
	var first string
loop:
	for {
		select {
		case <-done:
			break loop
		default:
		}
		snap, _ := c.Snapshot()
		checks++
		p := snap.IPv4.Get(name)
		n := 0
		if p != nil {
			n = len(p.ClusterEndpoints)
		}
		if n < want {
			bad++
			if first == "" {
				first = fmt.Sprintf("generation %d: %d endpoints, want at least %d", snap.Generation, n, want)
			}
			stop.Store(true)
		}
	}
	if bad > 0 {
		t.Fatalf("a snapshot published a shrunken port (%d of %d snapshots); first: %s", bad, checks, first)
	}
	t.Logf("%d snapshots checked", checks)
}

func mustSnap(c *Cache) *proxy.Snapshot {
	snap, _ := c.Snapshot()
	return snap
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
