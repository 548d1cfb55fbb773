package conformance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunGroupStopsChildren: an interrupted suite leaves none of its
// processes behind (ginkgo's e2e.test processes survived ginkgo before):
// a child that ignores SIGINT, like a busy test process, is gone after
// runGroup returns.
func TestRunGroupStopsChildren(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "sh", "-c", `sh -c 'trap "" INT; exec sleep 300' & echo $! > `+pidFile+`; wait`)
	done := make(chan error, 1)
	go func() { done <- runGroup(cmd) }()
	var pid int
	for i := 0; i < 100 && pid == 0; i++ {
		time.Sleep(50 * time.Millisecond)
		data, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	if pid == 0 {
		cancel()
		t.Fatal("the child did not start")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("runGroup did not return")
	}
	for i := 0; i < 50; i++ {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && strings.Contains(string(stat), ") Z ") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("the suite's child %d outlived it", pid)
}
