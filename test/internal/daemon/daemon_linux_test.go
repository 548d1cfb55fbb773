package daemon

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A daemon started with Start is followed until it writes its state file,
// recognised by Is and PID only with its tool, directory and "run", and
// stopped by Stop.
func TestDaemonLifecycle(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	d := Daemon{Tool: "sh", Dir: dir, PIDFile: filepath.Join(dir, "pid"), LogFile: filepath.Join(dir, "log"), StateFile: filepath.Join(dir, "state")}
	// $1 is -dir, $2 the directory: the script says hello, writes the
	// state file and waits to be signalled.
	script := `echo hello; echo ready > "$2/state"; sleep 20`
	cmd, exited, err := d.Start(sh, []string{"-c", script, "sh", "-dir", dir, "run"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := d.Follow(context.Background(), &out, cmd.Process.Pid, exited, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "  hello") {
		t.Errorf("Follow copied %q, want the daemon's log indented", out.String())
	}
	if got := d.PID(); got != cmd.Process.Pid {
		t.Errorf("PID = %d, want %d", got, cmd.Process.Pid)
	}
	other := d
	other.Dir = dir + "-other"
	if other.Is(cmd.Process.Pid) {
		t.Error("a daemon of another directory taken for this one")
	}
	if d.Is(os.Getpid()) {
		t.Error("the test binary taken for the daemon")
	}
	if err := d.Stop(cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d.PID() != 0 {
		t.Error("PID after Stop, want 0")
	}
}

// A daemon that exits before it is ready fails Follow, with its log.
func TestFollowReportsAnEarlyExit(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	d := Daemon{Tool: "sh", Dir: dir, PIDFile: filepath.Join(dir, "pid"), LogFile: filepath.Join(dir, "log"), StateFile: filepath.Join(dir, "state")}
	cmd, exited, err := d.Start(sh, []string{"-c", "echo broken; exit 3", "sh", "-dir", dir, "run"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = d.Follow(context.Background(), &out, cmd.Process.Pid, exited, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited before the cluster was ready") || !strings.Contains(out.String(), "broken") {
		t.Errorf("Follow = %v, log %q; want the early exit and the log", err, out.String())
	}
}

func TestPrefixedAndWriteJSON(t *testing.T) {
	var b bytes.Buffer
	p := Prefixed{W: &b, Prefix: "> "}
	_, _ = p.Write([]byte("a\nb\n"))
	_, _ = p.Write([]byte("c"))
	if got := b.String(); got != "> a\n> b\n> c" {
		t.Errorf("Prefixed wrote %q", got)
	}
	path := filepath.Join(t.TempDir(), "state.json")
	if err := WriteJSON(path, map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || string(data) != "{\n  \"x\": 1\n}\n" {
		t.Errorf("WriteJSON wrote %q, %v", data, err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".state.json.*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
