package controlplane

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPrefixWriter(t *testing.T) {
	var buf bytes.Buffer
	pw := &prefixWriter{prefix: "etcd: ", w: &buf}
	for _, chunk := range []string{"one\ntw", "o\n", "", "three"} {
		if n, err := pw.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", chunk, n, err)
		}
	}
	if got, want := buf.String(), "etcd: one\netcd: two\n"; got != want {
		t.Errorf("before flush: %q, want %q", got, want)
	}
	pw.flush()
	if got, want := buf.String(), "etcd: one\netcd: two\netcd: three\n"; got != want {
		t.Errorf("after flush: %q, want %q", got, want)
	}
}

// lockedBuffer is an io.Writer safe for the process output goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestProcessStop(t *testing.T) {
	tests := []struct {
		mode     string
		wantLine string
		wantExit string // "" for a clean exit, else part of the exit error
		timeout  time.Duration
	}{
		{"sleep", "fake: fake server: waiting\n", "", time.Minute},                                 // exits on SIGTERM
		{"ignore-term", "fake: fake server: ignoring SIGTERM\n", "killed", 300 * time.Millisecond}, // needs SIGKILL
		{"exit", "fake: fake server: cannot start\n", "exit status 3", time.Minute},                // already gone
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			t.Setenv(envFake, tt.mode)
			logPath := filepath.Join(t.TempDir(), "fake.log")
			var out lockedBuffer
			p, err := startProcess("fake", []string{os.Args[0]}, logPath, &out)
			if err != nil {
				t.Fatal(err)
			}
			// Stop only once the child runs its fake: signal handlers are set.
			for i := 0; i < 500 && !strings.Contains(out.String(), "fake server"); i++ {
				time.Sleep(10 * time.Millisecond)
			}
			if tt.mode == "exit" {
				<-p.done // stopping a process that already exited
			}
			if err := p.stop(tt.timeout); err != nil {
				t.Fatalf("stop: %v", err)
			}
			done, exitErr := p.exited()
			if !done {
				t.Fatal("process still running after stop")
			}
			if tt.wantExit == "" && exitErr != nil || tt.wantExit != "" && (exitErr == nil || !strings.Contains(exitErr.Error(), tt.wantExit)) {
				t.Errorf("exit status %v, want %q", exitErr, tt.wantExit)
			}
			if got := out.String(); got != tt.wantLine {
				t.Errorf("output sink got %q, want %q", got, tt.wantLine)
			}
			if log, _ := os.ReadFile(logPath); !strings.Contains(string(log), "fake server") {
				t.Errorf("log file lacks the output: %q", log)
			}
			if err := p.stop(time.Second); err != nil {
				t.Errorf("second stop: %v", err)
			}
		})
	}
}

var errUnreachable = errors.New("test dialer: unreachable")

func unreachable(context.Context, string, string) (net.Conn, error) { return nil, errUnreachable }

// TestStartFailures runs Start with stand-ins for etcd that never get ready;
// the dialer reaches nothing, so no test traffic leaves this process.
func TestStartFailures(t *testing.T) {
	tests := []struct {
		name     string
		fake     string
		opts     func(*Options)
		wantText []string
	}{
		{name: "refuses the current namespace", opts: func(o *Options) { o.AllowCurrentNamespace = false },
			wantText: []string{"CommandPrefix is empty"}},
		{name: "server exits", fake: "exit",
			wantText: []string{"etcd exited before it was ready", "fake server: cannot start", "test dialer: unreachable"}},
		{name: "server never ready", fake: "sleep", opts: func(o *Options) { o.ReadyTimeout = 3 * time.Second }, // time for the fake to print at any load
			wantText: []string{"etcd not ready", "deadline exceeded", "fake server: waiting"}},
		{name: "missing binary", opts: func(o *Options) { o.Binaries.Etcd = filepath.Join(t.TempDir(), "nope") },
			wantText: []string{"starting etcd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.fake != "" {
				t.Setenv(envFake, tt.fake)
			}
			dir := t.TempDir()
			o := Options{
				Binaries:              Binaries{Etcd: os.Args[0], KubeAPIServer: os.Args[0]},
				AllowCurrentNamespace: true,
				Dial:                  unreachable,
				Dir:                   dir,
				StopTimeout:           time.Second,
			}
			if tt.opts != nil {
				tt.opts(&o)
			}
			cp, err := Start(context.Background(), o)
			if err == nil {
				_ = cp.Stop()
				t.Fatal("Start succeeded, want an error")
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
			if _, statErr := os.Stat(dir); statErr != nil {
				t.Errorf("a caller's Dir was removed: %v", statErr)
			}
		})
	}
}

func TestStartWritesFilesAndOwnsTempDir(t *testing.T) {
	t.Setenv(envFake, "exit")
	// With Dir empty, Start makes a temporary directory and removes it
	// again when it fails.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	_, err := Start(context.Background(), Options{
		Binaries:              Binaries{Etcd: os.Args[0], KubeAPIServer: os.Args[0]},
		AllowCurrentNamespace: true, Dial: unreachable,
	})
	if err == nil {
		t.Fatal("Start succeeded with a failing etcd")
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "kproxy-controlplane-*")); len(left) != 0 {
		t.Errorf("Start left its directory behind: %v", left)
	}
}
