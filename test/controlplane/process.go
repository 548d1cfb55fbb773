package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// process is one running server.
type process struct {
	name string
	pid  int
	done chan struct{} // closed when the process has exited and its output is flushed
	err  error         // exit status; read only after done is closed
	log  *os.File
}

// startProcess runs argv with its output in logPath (appended) and, when
// extra is set, also in extra with each line prefixed by name.
//
// The process is started and waited for from one goroutine locked to its OS
// thread: on Linux the child gets SIGKILL when the thread that started it
// exits (see sysProcAttr), and a locked thread lives exactly as long as the
// child, so a test binary that dies never leaves servers behind.
func startProcess(name string, argv []string, logPath string, extra io.Writer) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s log: %w", name, err)
	}
	var out io.Writer = logFile
	var pw *prefixWriter
	if extra != nil {
		pw = &prefixWriter{prefix: name + ": ", w: extra}
		out = io.MultiWriter(logFile, pw)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()

	p := &process{name: name, done: make(chan struct{}), log: logFile}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.pid = cmd.Process.Pid
		started <- nil
		p.err = cmd.Wait()
		if pw != nil {
			pw.flush()
		}
		_ = logFile.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, argv[0], err)
	}
	return p, nil
}

// exited reports whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop asks the process to exit (SIGTERM where signals exist), kills it after
// timeout, and waits for it. A process that already exited is not an error;
// its exit status is ignored because servers exit non-zero on SIGTERM.
func (p *process) stop(timeout time.Duration) error {
	if done, _ := p.exited(); done {
		return nil
	}
	proc, err := os.FindProcess(p.pid)
	if err != nil {
		return fmt.Errorf("finding %s (pid %d): %w", p.name, p.pid, err)
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		// Windows has no SIGTERM: go straight to killing.
		_ = proc.Kill()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s (pid %d) after %s: %w", p.name, p.pid, timeout, err)
	}
	<-p.done
	return nil
}

// prefixWriter writes complete lines to w, each prefixed. The log file is
// the record; this is a convenience copy, so a failing sink is dropped rather
// than failing the server's output.
type prefixWriter struct {
	prefix string
	mu     sync.Mutex // guards w and buf (exec.Cmd may write from two goroutines)
	w      io.Writer
	buf    []byte
}

func (pw *prefixWriter) Write(b []byte) (int, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	pw.buf = append(pw.buf, b...)
	for {
		i := bytes.IndexByte(pw.buf, '\n')
		if i < 0 {
			break
		}
		line := pw.buf[:i+1]
		if _, err := io.WriteString(pw.w, pw.prefix+string(line)); err != nil {
			pw.w, pw.buf = io.Discard, nil
			break
		}
		pw.buf = pw.buf[i+1:]
	}
	return len(b), nil
}

func (pw *prefixWriter) flush() {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.buf) > 0 {
		_, _ = io.WriteString(pw.w, pw.prefix+string(pw.buf)+"\n")
		pw.buf = nil
	}
}

// logTail returns the last n bytes of a log file, for error messages.
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - n
	if off < 0 {
		off = 0
	}
	b := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	return string(b)
}
