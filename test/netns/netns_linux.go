package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace the harness creates:
// "kpt-<pid>-<random>-<host>". The pid is the creating process's, so Sweep can
// tell leftovers of dead runs from namespaces of a run still in progress.
const Prefix = "kpt-"

// runDir is where "ip netns" keeps named namespaces.
const runDir = "/run/netns"

// ErrInitialNamespace is returned (wrapped) when an operation would touch the
// machine's own network namespace.
var ErrInitialNamespace = errors.New("refusing to touch the initial network namespace")

// NS is a named network namespace created by the harness.
type NS struct {
	// Name is the "ip netns" name.
	Name string
	// Path is the bind mount of the namespace (/run/netns/<Name>).
	Path string
}

// nsID identifies a namespace by the device and inode of its nsfs file.
type nsID struct{ dev, ino uint64 }

func statNS(path string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nsID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// initNetIno is the fixed inode number of the initial network namespace on
// kernels that have one (PROC_NET_INIT_INO, Linux 6.x); dynamically numbered
// namespaces start at 0xF0000000, so no other namespace can carry it.
const initNetIno = 0xEFFFFFF9

// protectedNamespaces returns the namespaces the harness must never enter or
// configure: this process's own and PID 1's (the machine's, or the
// container's). PID 1's is skipped when it cannot be read (a sandbox may hide
// it); this process's must be readable. checkNotProtected also refuses the
// initial namespace by its fixed inode number.
//
// The set is read once, before any thread of this process enters another
// namespace (every setns is preceded by a guard, which waits for this), so a
// goroutine locked on the main thread inside a harness namespace cannot make
// /proc/self point elsewhere.
var protectedNamespaces = sync.OnceValues(func() (map[nsID]string, error) {
	out := map[nsID]string{}
	self, err := statNS("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("identify protected namespace: %w", err)
	}
	out[self] = "/proc/self/ns/net"
	if id, err := statNS("/proc/1/ns/net"); err == nil {
		out[id] = "/proc/1/ns/net"
	}
	return out, nil
})

// guard fails unless n is a harness namespace distinct from every protected one.
func (n *NS) guard() error {
	if n == nil || !strings.HasPrefix(n.Name, Prefix) || n.Path != filepath.Join(runDir, n.Name) {
		return fmt.Errorf("netns %v: not a harness namespace (name must start with %q): %w", n, Prefix, ErrInitialNamespace)
	}
	return checkNotProtected(n.Path)
}

// checkNotProtected fails if path is (a handle of) a protected namespace.
func checkNotProtected(path string) error {
	id, err := statNS(path)
	if err != nil {
		return err
	}
	prot, err := protectedNamespaces()
	if err != nil {
		return err
	}
	if p, bad := prot[id]; bad {
		return fmt.Errorf("netns %s is the same namespace as %s: %w", path, p, ErrInitialNamespace)
	}
	if id.ino == initNetIno {
		return fmt.Errorf("netns %s is the initial network namespace (inode %#x): %w", path, id.ino, ErrInitialNamespace)
	}
	return nil
}

// String returns the namespace name.
func (n *NS) String() string {
	if n == nil {
		return "<nil>"
	}
	return n.Name
}

// create makes a new named namespace.
func create(ctx context.Context, name string) (*NS, error) {
	if !strings.HasPrefix(name, Prefix) || strings.ContainsAny(name, "/ ") {
		return nil, fmt.Errorf("netns name %q: must start with %q and hold no '/' or space", name, Prefix)
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %w: %s", name, err, bytes.TrimSpace(out))
	}
	n := &NS{Name: name, Path: filepath.Join(runDir, name)}
	if err := n.guard(); err != nil {
		return nil, err
	}
	return n, nil
}

// Open returns the harness namespace called name, created earlier by this
// or another process (make netns-cluster's daemon, for a shell or kubectl run
// inside it), after the checks every operation makes: a harness name, an
// existing namespace, neither this process's nor PID 1's.
func Open(name string) (*NS, error) {
	if strings.ContainsAny(name, "/ ") {
		return nil, fmt.Errorf("netns name %q: must hold no '/' or space: %w", name, ErrInitialNamespace)
	}
	n := &NS{Name: name, Path: filepath.Join(runDir, name)}
	if err := n.guard(); err != nil {
		return nil, err
	}
	return n, nil
}

// Command returns a command that runs name inside the namespace ("ip netns
// exec"), for callers that need its standard streams or want to exec it (an
// interactive shell). It checks the namespace as Exec does.
func (n *NS) Command(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	if err := n.guard(); err != nil {
		return nil, err
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...), nil
}

// remove deletes the namespace after killing every process left in it
// (processes the harness started; Close stops them first, gracefully). If
// the name is (wrongly) a handle of a protected namespace, nothing is killed:
// only the name is unmounted, which leaves the namespace itself untouched.
func (n *NS) remove(ctx context.Context) error {
	if !strings.HasPrefix(n.Name, Prefix) {
		return fmt.Errorf("netns %s: not a harness namespace", n.Name)
	}
	var errs []error
	if err := checkNotProtected(n.Path); err == nil {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "pids", n.Name).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
					if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
						errs = append(errs, fmt.Errorf("kill pid %d left in netns %s: %w", pid, n.Name, err))
					}
				}
			}
		}
	}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
		if _, statErr := os.Stat(n.Path); !os.IsNotExist(statErr) {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", n.Name, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

// Exec runs a command inside the namespace ("ip netns exec") and returns its
// combined output; the error includes the output.
func (n *NS) Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	if err := n.guard(); err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("netns %s: %s %s: %w: %s", n.Name, name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// ExecInput is Exec with stdin.
func (n *NS) ExecInput(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	if err := n.guard(); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("netns %s: %s %s: %w: %s", n.Name, name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// IP runs "ip" commands inside the namespace, one per line, in one batch
// ("ip -n NAME -batch -"). Lines omit the leading "ip".
func (n *NS) IP(ctx context.Context, lines ...string) error {
	if err := n.guard(); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "ip", "-n", n.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netns %s: ip -batch: %w: %s", n.Name, err, bytes.TrimSpace(out))
	}
	return nil
}

// Do runs fn on an OS thread that has entered the namespace. Sockets fn
// creates belong to the namespace for their whole life and may be used from
// any goroutine afterwards; fn must not start goroutines that create sockets.
//
// The thread returns to its original namespace afterwards; if it cannot, it
// stays locked and the Go runtime discards it, so no other goroutine ever
// runs in the wrong namespace.
func (n *NS) Do(fn func() error) error {
	if err := n.guard(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored, err := n.doLocked(fn)
		if restored {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// doLocked must run on a locked thread; restored tells whether the thread is
// back in its original namespace.
func (n *NS) doLocked(fn func() error) (restored bool, err error) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return true, fmt.Errorf("open current netns: %w", err)
	}
	defer func() { _ = orig.Close() }()
	target, err := os.Open(n.Path)
	if err != nil {
		return true, fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	defer func() { _ = target.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return true, fmt.Errorf("enter netns %s: %w", n.Name, err)
	}
	defer func() {
		restored = unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil
		if !restored && err == nil {
			err = fmt.Errorf("netns %s: could not return to the original namespace", n.Name)
		}
	}()
	// Belt and braces: the thread must now be in a harness namespace.
	if err := checkNotProtected("/proc/thread-self/ns/net"); err != nil {
		return false, err
	}
	return false, fn()
}

// Sysctl writes sysctl values (keys in dotted form, "net.ipv4.ip_forward")
// inside the namespace. Only net.* keys are namespaced, so only those are
// accepted.
func (n *NS) Sysctl(kv map[string]string) error {
	return n.Do(func() error {
		for k, v := range kv {
			if !strings.HasPrefix(k, "net.") {
				return fmt.Errorf("sysctl %s: only net.* keys are per namespace", k)
			}
			p := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return fmt.Errorf("netns %s: sysctl %s=%s: %w", n.Name, k, v, err)
			}
		}
		return nil
	})
}

// ReadSysctl reads one net.* sysctl inside the namespace.
func (n *NS) ReadSysctl(key string) (string, error) {
	var val string
	err := n.Do(func() error {
		if !strings.HasPrefix(key, "net.") {
			return fmt.Errorf("sysctl %s: only net.* keys are per namespace", key)
		}
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
		val = strings.TrimSpace(string(b))
		return err
	})
	return val, err
}

// leftoverName matches harness namespace names and captures the creator pid.
var leftoverName = regexp.MustCompile(`^` + Prefix + `(\d+)-`)

// Sweep deletes harness namespaces whose creating process is gone (leftovers
// of crashed or killed runs), killing any process still inside them. It
// returns the names it deleted. Namespaces of live processes are left alone,
// so concurrent test binaries do not disturb each other.
func Sweep(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(runDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("sweep: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		m := leftoverName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || processAlive(pid) {
			continue
		}
		n := &NS{Name: e.Name(), Path: filepath.Join(runDir, e.Name())}
		if err := n.remove(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n.Name)
	}
	return removed, errors.Join(errs...)
}

// clusterID matches a Cluster's ID: the prefix, the creator's pid, a random part.
var clusterID = regexp.MustCompile(`^` + Prefix + `\d+-[0-9a-f]+$`)

// RemoveCluster deletes the namespaces of one Cluster (named "<id>-<host>")
// that its creating process left behind, killing any process still inside
// them, and returns the names it deleted. Unlike Sweep it does not look at
// the creator: the caller must have stopped it (make netns-cluster-down, after the
// daemon that owned the Cluster exited).
func RemoveCluster(ctx context.Context, id string) ([]string, error) {
	if !clusterID.MatchString(id) {
		return nil, fmt.Errorf("netns: %q is not a cluster ID (%s<pid>-<hex>)", id, Prefix)
	}
	entries, err := os.ReadDir(runDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("netns: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), id+"-") {
			continue
		}
		n := &NS{Name: e.Name(), Path: filepath.Join(runDir, e.Name())}
		if err := n.remove(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n.Name)
	}
	return removed, errors.Join(errs...)
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
