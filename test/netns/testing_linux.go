package netns

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// KernelTestsEnv is the environment variable that enables the kernel tests
// (make test-kernel sets it to 1). They are opt-in so that "go test ./..."
// does not run them concurrently with every other package: they are slower
// and some check latencies.
const KernelTestsEnv = "KPROXY_KERNEL_TESTS"

// KernelTestsEnabled reports whether KernelTestsEnv is set to 1.
func KernelTestsEnabled() bool { return os.Getenv(KernelTestsEnv) == "1" }

// Require skips the test unless kernel tests are enabled (KernelTestsEnv)
// and it can build namespaces: root, and the tools named (plus "ip") in
// PATH. When enabled under CI=true, a missing privilege or tool fails the
// test instead, so CI never passes by skipping.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if !KernelTestsEnabled() {
		t.Skipf("kernel test: run it with make test-kernel (or %s=1 go test ...) as root", KernelTestsEnv)
	}
	if os.Geteuid() != 0 {
		skipOrFail(t, "kernel test needs root to create network namespaces (run: sudo go test ..., or make test-kernel as root)")
	}
	var missing []string
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		skipOrFail(t, "kernel test needs "+strings.Join(missing, ", ")+
			" in PATH (Debian/Ubuntu: apt-get install iproute2 iptables conntrack)")
	}
}

func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", msg)
	}
	t.Skip(msg)
}

// New builds a Cluster for a test (after Require) and removes it when the
// test ends, whatever the outcome. On failure it logs the output of every
// process it started.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	Require(t)
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Setup(ctx, opts)
	if err != nil {
		t.Fatalf("netns setup: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.mu.Lock()
			procs := append([]*Process(nil), c.procs...)
			c.mu.Unlock()
			for _, p := range procs {
				if out := p.Output(); out != "" {
					t.Logf("output of %s (netns %s):\n%s", p.Name, p.NS.Name, tail(out, 80))
				}
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("netns cleanup: %v", err)
		}
	})
	return c
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// Binaries are the programs a kernel test package runs in its namespaces,
// built once by MainWithBinaries.
type Binaries struct {
	// Echo is the kpt-echo server and client.
	Echo string
	// Main is the package under test (kproxy), or "" with MainErr set when
	// it did not build (tests that need it report that).
	Main    string
	MainErr error
}

// MainWithBinaries is a kernel test package's TestMain body: as root with
// kernel tests enabled, it builds kpt-echo and pkg (with -race when race, so
// that a data race makes the process exit and the test fail) into a
// temporary directory, hands them to set, runs the tests and removes the
// directory. Otherwise every test skips on its own and it only runs them.
// It returns the exit code.
func MainWithBinaries(m *testing.M, pkg string, race bool, set func(Binaries)) int {
	if os.Geteuid() != 0 || !KernelTestsEnabled() {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kpt-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// Bounded, but not tightly: on a loaded 2-core machine a cold -race
	// build of kproxy took more than 5 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var b Binaries
	if b.Echo, err = BuildEcho(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var flags []string
	if race {
		flags = append(flags, "-race")
	}
	b.Main, b.MainErr = GoBuild(ctx, dir, pkg, flags...)
	set(b)
	return m.Run()
}
