package app

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchConfigFile: the same bytes rewritten are no change; different
// bytes are reported once as ErrConfigChanged.
func TestWatchConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte("mode: iptables\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := watchConfigFile(ctx, path, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("mode: iptables\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ch:
		t.Fatalf("same content reported as a change: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := os.WriteFile(path, []byte("mode: nftables\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ch:
		if !errors.Is(err, ErrConfigChanged) {
			t.Errorf("got %v, want ErrConfigChanged", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("change not reported within 10 s")
	}
}
