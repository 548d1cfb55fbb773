package windows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

// l2bridgeNet is the harness's L2Bridge network (named as newBackend expects).
var l2bridgeNet = hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}

// syncWithin runs one sync and fails the test if it does not return in
// limit (a wedged backend); it returns the sync's error.
func (h *harness) syncWithin(limit time.Duration, s *proxy.Snapshot, ch proxy.Changes) error {
	h.t.Helper()
	done := make(chan error, 1)
	go func() { done <- syncSnap(context.Background(), h.b, s, ch) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		h.t.Fatalf("sync did not return within %s: the backend is wedged on a hung HNS call", limit)
		return nil
	}
}

// A hung HNS call fails the sync as HNS being unavailable instead of wedging
// the backend; while it hangs no further call is made; once HNS answers, the
// next sync lists again and programs everything.
func TestBackendHungHNSCallTimesOut(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern, func(o *Options) { o.CallTimeout = 20 * time.Millisecond })
	release := h.f.Hang(hns.OpListLoadBalancers)
	defer release()

	err := h.syncWithin(10*time.Second, webAndDNS(), proxy.Changes{Full: true})
	var he *hns.Error
	if !errors.As(err, &he) || he.Code != hns.CodeTimeout || !hns.IsTransient(err) || he.Op != hns.OpListLoadBalancers {
		t.Fatalf("sync with a hung ListLoadBalancers: got %v, want a transient timeout of %s", err, hns.OpListLoadBalancers)
	}

	// Still hung: the next sync fails at once, without calling HNS again.
	h.f.ResetCalls()
	err = h.syncWithin(10*time.Second, webAndDNS(), proxy.Changes{Full: true})
	if !hns.IsTransient(err) {
		t.Fatalf("second sync while HNS hangs: got %v, want a transient error", err)
	}
	if n := h.f.TotalCalls(); n != 0 {
		t.Errorf("second sync while HNS hangs made %d HNS calls, want 0", n)
	}

	release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = h.syncWithin(10*time.Second, webAndDNS(), proxy.Changes{Full: true})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // the abandoned call's goroutine has not noticed yet
	}
	if err != nil {
		t.Fatalf("sync after HNS answered again: %v", err)
	}
	wt.MustEqual(t, "after HNS answered", h.f.Dump(), webAndDNSDump)
}
