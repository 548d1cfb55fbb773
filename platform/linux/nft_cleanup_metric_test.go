package linux

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
)

// countingNFTMetrics counts CleanupFailed calls (safe across goroutines:
// the take-over runs in its own).
type countingNFTMetrics struct {
	noNFTMetrics
	cleanupFailed atomic.Int32
}

func (m *countingNFTMetrics) CleanupFailed() { m.cleanupFailed.Add(1) }

// TestNFTTakeOverFailureCounted: a failed take-over (removing what
// kube-proxy or the iptables mode left) after a full sync counts one
// cleanup failure, a successful one none.
func TestNFTTakeOverFailureCounted(t *testing.T) {
	m := &countingNFTMetrics{}
	var fail atomic.Bool
	fail.Store(true)
	done := make(chan struct{}, 4)
	b, err := NewNFT(NFTOptions{
		Rules: facts.DefaultConfig(v1.IPv4Protocol), NFT: nftmodel.NewFake(knftables.IPv4Family, nftables.TableName),
		Conntrack: &FakeConntrack{}, Host: &FakeHost{}, Metrics: m, Logger: logr.Discard(),
		TakeOver: func(context.Context) error {
			defer func() { done <- struct{}{} }()
			if fail.Load() {
				return errors.New("kube-proxy's table is busy")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	snap := &proxy.Snapshot{}
	waitTakeOver := func() {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the take-over did not run")
		}
	}
	// counted waits until the counter reaches want (it is bumped just
	// after TakeOver returns), then checks it stays there.
	counted := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.cleanupFailed.Load() < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		if n := m.cleanupFailed.Load(); n != want {
			t.Errorf("cleanup failures %d, want %d", n, want)
		}
	}
	if err := syncSnap(context.Background(), b, snap, proxy.Changes{Full: true}); err != nil {
		t.Fatal(err)
	}
	waitTakeOver()
	counted(1)

	// The failed take-over is retried after the next full sync once the
	// backend has marked it undone.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b.mu.Lock()
		undone := !b.m.tookOver.Load()
		b.mu.Unlock()
		if undone || time.Now().After(deadline) {
			break
		}
	}
	fail.Store(false)
	if err := syncSnap(context.Background(), b, snap, proxy.Changes{Full: true}); err != nil {
		t.Fatal(err)
	}
	waitTakeOver() // retried after the next full sync, and succeeds
	counted(1)
}
