package nscluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDownLeavesForeignDirectories: make netns-cluster-down removes only a
// directory make netns-cluster made (with MarkerFile), and succeeds when there
// is none. Needs no root: both cases return before any namespace work.
func TestDownLeavesForeignDirectories(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "state")
	var out bytes.Buffer
	if err := Down(context.Background(), Options{Root: root, Dir: dir, Out: &out}); err != nil || !strings.Contains(out.String(), "no cluster") {
		t.Errorf("Down without a directory: %v, %q; want success saying there is no cluster", err, out.String())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(dir, "precious")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Down(context.Background(), Options{Root: root, Dir: dir, Out: &out}); err == nil || !strings.Contains(err.Error(), MarkerFile) {
		t.Errorf("Down of a directory without %s: %v, want a refusal", MarkerFile, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("Down removed a directory it did not make: %v", err)
	}
}

// TestIsDaemon: only a live "kproxy-nscluster -dir DIR ... run" counts, so
// Down never signals a reused pid.
func TestIsDaemon(t *testing.T) {
	if daemonOf("/x").Is(os.Getpid()) {
		t.Error("the test binary taken for a cluster daemon")
	}
	if daemonOf("/x").Is(1 << 30) {
		t.Error("a pid that cannot exist taken for a cluster daemon")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, PIDFile), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pid := daemonOf(dir).PID(); pid != 0 {
		t.Errorf("the daemon's pid with pid 1 recorded = %d, want 0", pid)
	}
}
