package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// spawner starts child processes from one dedicated OS thread. Children get
// SIGKILL when their parent thread dies (Pdeathsig), and a Go program's
// threads may die early (a goroutine that exits while locked takes its thread
// with it), so every child is started from a thread that lives exactly as
// long as the spawner: when the harness closes, the spawner's thread exits and
// the kernel kills any child still running, even if the test binary crashed.
type spawner struct {
	reqs chan func()
	done chan struct{}
	once sync.Once
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		defer close(s.done)
		for f := range s.reqs {
			f()
		}
	}()
	return s
}

// start starts cmd from the spawner thread with Pdeathsig set.
func (s *spawner) start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr.Setpgid = true
	errc := make(chan error, 1)
	select {
	case s.reqs <- func() { errc <- cmd.Start() }:
	case <-s.done:
		return errors.New("netns: harness closed")
	}
	return <-errc
}

func (s *spawner) stop() {
	s.once.Do(func() { close(s.reqs) })
	<-s.done
}

// Process is a long-running program the harness started inside a namespace.
type Process struct {
	Name string
	NS   *NS
	cmd  *exec.Cmd
	out  *tailBuffer
	log  *os.File
	done chan struct{}
	err  error // valid after done is closed
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err returns the exit error once Done is closed (nil while running).
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Output returns the last output lines of the process (stdout and stderr, up
// to 1 MiB).
func (p *Process) Output() string { return p.out.String() }

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s (pid %d): %w", p.Name, p.Pid(), err)
	}
	return nil
}

// SignalGroup sends sig to the process's whole process group: the process
// and every child it started (the harness starts each process in a group
// of its own). That is what a container runtime's kill does to a
// container (every process of its cgroup), and what a process's children
// do not survive.
func (p *Process) SignalGroup(sig syscall.Signal) error {
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s's process group %d: %w", p.Name, p.Pid(), err)
	}
	return nil
}

// KillGroup sends SIGKILL to the process group, waits for the process to
// exit and for every other process of the group to be gone (bounded: it
// fails naming the survivors after 10 s).
func (p *Process) KillGroup() error {
	if err := p.SignalGroup(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := GroupMembers(p.Pid())
		if len(left) == 0 {
			return signalled(p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's process group %d: processes %v still running 10 s after SIGKILL", p.Name, p.Pid(), left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// GroupMembers lists the live (not zombie) processes of process group pgid.
func GroupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// Stop sends SIGTERM and waits up to grace for the exit, then SIGKILLs. It
// returns the exit error unless the process ended because of our signal.
func (p *Process) Stop(grace time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		return p.Kill()
	}
	return signalled(p.err)
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return signalled(p.err)
}

// signalled drops the error of a process that died from SIGTERM/SIGKILL.
func signalled(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() &&
			(ws.Signal() == syscall.SIGTERM || ws.Signal() == syscall.SIGKILL) {
			return nil
		}
	}
	return err
}

// WaitOutput waits until the process prints a line containing substr, the
// process exits, or ctx ends.
func (p *Process) WaitOutput(ctx context.Context, substr string) error {
	ch := p.out.watch(substr)
	select {
	case <-ch:
		return nil
	case <-p.done:
		if strings.Contains(p.out.String(), substr) {
			return nil
		}
		return fmt.Errorf("%s exited (%v) before printing %q; output:\n%s", p.Name, p.err, substr, p.Output())
	case <-ctx.Done():
		return fmt.Errorf("%s did not print %q: %w; output:\n%s", p.Name, substr, ctx.Err(), p.Output())
	}
}

// startProcess starts argv inside ns via "ip netns exec". When logPath is set
// the output also goes to that file.
func startProcess(sp *spawner, ns *NS, name, logPath string, argv ...string) (*Process, error) {
	return startPrefixed(sp, ns, name, logPath, []string{"ip", "netns", "exec", ns.Name}, argv...)
}

// startPrefixed starts prefix followed by argv; prefix must enter ns and
// exec argv.
func startPrefixed(sp *spawner, ns *NS, name, logPath string, prefix []string, argv ...string) (*Process, error) {
	if err := ns.guard(); err != nil {
		return nil, err
	}
	p := &Process{Name: name, NS: ns, out: newTailBuffer(1 << 20), done: make(chan struct{})}
	var w io.Writer = p.out
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		p.log = f
		w = io.MultiWriter(p.out, f)
	}
	full := append(append([]string{}, prefix...), argv...)
	p.cmd = exec.Command(full[0], full[1:]...)
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	// A child that outlives the process (killed alone) may hold the
	// output pipe open: the exit is reported all the same.
	p.cmd.WaitDelay = 5 * time.Second
	if err := sp.start(p.cmd); err != nil {
		if p.log != nil {
			_ = p.log.Close()
		}
		return nil, fmt.Errorf("start %s in netns %s: %w", name, ns.Name, err)
	}
	copied := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = w.Write(append(sc.Bytes(), '\n'))
		}
		_, _ = io.Copy(io.Discard, pr)
		close(copied)
	}()
	go func() {
		p.err = p.cmd.Wait()
		_ = pw.Close()
		<-copied
		if p.log != nil {
			_ = p.log.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// tailBuffer keeps the last max bytes written and lets callers wait for a
// substring to appear.
type tailBuffer struct {
	mu       sync.Mutex
	buf      []byte
	max      int
	watchers map[string][]chan struct{}
}

func newTailBuffer(max int) *tailBuffer {
	return &tailBuffer{max: max, watchers: map[string][]chan struct{}{}}
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-b.max:]...)
	}
	for s, chs := range b.watchers {
		if strings.Contains(string(p), s) {
			for _, ch := range chs {
				close(ch)
			}
			delete(b.watchers, s)
		}
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// watch returns a channel closed once substr has been written (at once if it
// already was).
func (b *tailBuffer) watch(substr string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	if strings.Contains(string(b.buf), substr) {
		close(ch)
		return ch
	}
	b.watchers[substr] = append(b.watchers[substr], ch)
	return ch
}
