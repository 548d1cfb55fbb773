//go:build windows

package windows

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

// TestBackendWithoutHNS: a Backend on a host without HNS fails its syncs
// with a transient error (the runner retries with backoff) and still dry-runs.
func TestBackendWithoutHNS(t *testing.T) {
	h, err := hns.NewHNS()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Version(); err == nil {
		t.Skip("HNS is present")
	}
	b, err := New(Options{HNS: h, NetworkName: "cbr0"})
	if err != nil {
		t.Fatal(err)
	}
	s := wt.Snap([]string{"10.0.0.1"}, wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.RemoteEP("10.244.2.5", 8080))))
	if err := syncSnap(context.Background(), b, s, proxy.Changes{Full: true}); !hns.IsTransient(err) {
		t.Errorf("Sync: got %v, want a transient error", err)
	}
	offline, err := New(Options{NetworkName: "cbr0"})
	if err != nil {
		t.Fatal(err)
	}
	var out discard
	if err := offline.DryRun(&out, FullView(v1.IPv4Protocol, s)); err != nil {
		t.Errorf("offline dry run: %v", err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
