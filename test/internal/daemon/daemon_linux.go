package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Daemon names a cluster's daemon: the program (Tool, the base name of
// its executable, run as "Tool ... -dir Dir ... run") and the files of its
// state directory Dir.
type Daemon struct {
	Tool string
	Dir  string
	// PIDFile, LogFile and StateFile are paths: the daemon's pid, its
	// output, and what it writes once the cluster is ready.
	PIDFile, LogFile, StateFile string
}

// Start starts self with args (which must end in "run" and hold -dir Dir)
// in its own session, so the terminal's signals do not reach it, in
// workdir, its output appended to LogFile, and records its pid. exited
// receives Wait's result.
func (d Daemon) Start(self string, args []string, workdir string) (cmd *exec.Cmd, exited <-chan error, err error) {
	logf, err := os.OpenFile(d.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = logf.Close() }()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = devnull.Close() }()
	cmd = exec.Command(self, args...)
	cmd.Dir = workdir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting the cluster daemon: %w", err)
	}
	if err := os.WriteFile(d.PIDFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return nil, nil, err
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return cmd, ch, nil
}

// Follow copies the daemon's log to out, each line indented, until the
// daemon has written StateFile; it fails when the daemon exits first, ctx
// ends or timeout passes.
func (d Daemon) Follow(ctx context.Context, out io.Writer, pid int, exited <-chan error, timeout time.Duration) error {
	f, err := os.Open(d.LogFile)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	copyNew := func() { _, _ = io.Copy(Prefixed{W: out, Prefix: "  "}, f) }
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		copyNew()
		if _, err := os.Stat(d.StateFile); err == nil {
			copyNew()
			return nil
		}
		select {
		case err := <-exited:
			copyNew()
			return fmt.Errorf("the cluster daemon (pid %d) exited before the cluster was ready (%v); its log is above", pid, err)
		case <-ctx.Done():
			return fmt.Errorf("interrupted while the cluster was starting: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("the cluster was not ready within %v; its log is above", timeout)
		case <-tick.C:
		}
	}
}

// PID returns the pid of the live daemon of Dir (from PIDFile), 0 if none
// runs.
func (d Daemon) PID() int {
	data, err := os.ReadFile(d.PIDFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 || !d.Is(pid) {
		return 0
	}
	return pid
}

// Is reports whether pid is a live (not zombie) "Tool ... -dir Dir ...
// run" process, so that a pid reused by another program is never
// signalled.
func (d Daemon) Is(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name: "pid (comm) S ...".
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) < 2 || filepath.Base(args[0]) != d.Tool || args[len(args)-1] != "run" {
		return false
	}
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-dir" && args[i+1] == d.Dir {
			return true
		}
	}
	return false
}

// Stop sends the daemon SIGTERM (it tears its cluster down) and waits up
// to grace for it to exit, then sends SIGKILL (its children die with it).
func (d Daemon) Stop(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling the cluster daemon (pid %d): %w", pid, err)
	}
	if d.waitGone(pid, grace) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing the cluster daemon (pid %d): %w", pid, err)
	}
	if !d.waitGone(pid, 10*time.Second) {
		return fmt.Errorf("the cluster daemon (pid %d) is still running after SIGKILL", pid)
	}
	return nil
}

func (d Daemon) waitGone(pid int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for d.Is(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
