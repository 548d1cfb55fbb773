package nscluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestMakeCluster runs what README's quick start tells a newcomer to type,
// through make itself: make netns-cluster (which must return with the cluster
// still running), kubectl apply of the example Service with the kubectl
// wrapper, curl of the ClusterIP from a pod on each node (node1's kproxy in
// iptables mode, node2's in nftables mode) with make netns-shell, the NodePort
// of both nodes from outside, then make netns-cluster-down, after which no
// namespace, process or state file may be left.
func TestMakeCluster(t *testing.T) {
	root := requireCluster(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	mk := makeIn(root, dir)
	var st *State
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err != nil {
			return
		}
		if t.Failed() {
			for _, f := range []string{LogFile, LogDir + "/kproxy-node1.log", LogDir + "/kproxy-node2.log"} {
				if data, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
					t.Logf("end of %s:\n%s", f, lastLines(string(data), 40))
				}
			}
		}
		if out, err := mk(2*time.Minute, "netns-cluster-down"); err != nil {
			t.Errorf("cleanup: %v", err)
		} else {
			t.Logf("cleanup: %s", out)
		}
	})

	begin := time.Now()
	out, err := mk(10*time.Minute, "netns-cluster")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make netns-cluster returned after %v:\n%s", time.Since(begin).Round(time.Millisecond), out)
	for _, w := range []string{
		"KUBECONFIG=" + filepath.Join(dir, KubeconfigFile) + "\n",
		"kubectl apply -f " + ExampleManifest,
		"make netns-shell POD=client NSCLUSTER_DIR=" + dir,
		"curl http://10.96.100.10/",
		"make netns-cluster-down NSCLUSTER_DIR=" + dir,
	} {
		if !strings.Contains(out, w) {
			t.Errorf("make netns-cluster did not print %q", w)
		}
	}
	if st, err = ReadState(dir); err != nil {
		t.Fatal(err)
	}
	if daemonOf(dir).PID() != st.PID {
		t.Fatalf("the cluster daemon (pid %d) is not running after make netns-cluster returned", st.PID)
	}

	kubectl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(dir, BinDir, "kubectl"), args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "KUBECONFIG=") // the wrapper's default
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := kubectl("get", "nodes", "-o", "name"); out != "node/node1\nnode/node2\n" {
		t.Errorf("kubectl get nodes: %q, want node1 and node2", out)
	}
	applied := kubectl("apply", "-f", ExampleManifest)
	for _, w := range []string{"service/echo created", "endpointslice.discovery.k8s.io/echo-1 created"} {
		if !strings.Contains(applied, w) {
			t.Errorf("kubectl apply printed %q, want %q", applied, w)
		}
	}
	top := proxytest.Default()
	ex, err := LoadExample(root, top)
	if err != nil {
		t.Fatal(err)
	}

	// curl with 30 URLs makes 30 new connections (the echo server closes
	// each): through the ClusterIP every backend answers, and sees the
	// client pod's own address.
	for _, pod := range []string{ClientAlias, proxytest.Client2} {
		host, _, err := st.Host(pod)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := top.Host(host)
		node, _ := top.Node(h.Node)
		seen := curlUntil(t, mk, pod, strings.Repeat(ex.URL()+" ", 30), 30*time.Second, func(rs []echo.Reply) error {
			return answeredBy(rs, ex.Backends, h.IPv4)
		})
		t.Logf("from %s on %s (kproxy --proxy-mode %s): %v", host, node.Name, modeOf(st, node.Name), seen)
	}
	for _, n := range st.Nodes {
		url := fmt.Sprintf("http://%s:%d/", n.IPv4, ex.NodePort)
		seen := curlUntil(t, mk, proxytest.Outside, strings.Repeat(url+" ", 6), 30*time.Second, func(rs []echo.Reply) error {
			return answeredBy(rs, nil, netip.Addr{})
		})
		t.Logf("NodePort %s from outside: %v", url, seen)
	}

	out, err = mk(2*time.Minute, "netns-cluster-down")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make netns-cluster-down: %s", out)
	checkGone(t, dir, st)
}

// TestClusterDownAfterCrash: a daemon killed with SIGKILL takes every
// process of the cluster with it (parent-death signals), and make
// cluster-down still removes its namespaces and state.
func TestClusterDownAfterCrash(t *testing.T) {
	root := requireCluster(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	mk := makeIn(root, dir)
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err == nil {
			_, _ = mk(2*time.Minute, "netns-cluster-down")
		}
	})
	if _, err := mk(10*time.Minute, "netns-cluster"); err != nil {
		t.Fatal(err)
	}
	st, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, ns := range st.Namespaces {
			out, _ := exec.Command("ip", "netns", "pids", ns).Output()
			left = append(left, strings.Fields(string(out))...)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v still run in the cluster's namespaces 10 s after its daemon died", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := mk(2*time.Minute, "netns-cluster-down")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, fmt.Sprintf("deleted %d namespaces", len(st.Namespaces))) {
		t.Errorf("make netns-cluster-down after a crash printed %q, want it to delete the %d namespaces", out, len(st.Namespaces))
	}
	checkGone(t, dir, st)
}

// requireCluster skips (fails under CI=true) unless kernel tests run as
// root with the tools and the control-plane binaries built, and returns
// the repository root.
func requireCluster(t *testing.T) string {
	t.Helper()
	netns.Require(t, "iptables", "nft", "make", "curl")
	root := repoRoot(t)
	if _, err := controlplane.Ensure(context.Background(), controlplane.BuildOptions{RepoRoot: root, NoBuild: true}); err != nil {
		msg := fmt.Sprintf("%v (make test-integration builds them first)", err)
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: " + msg)
		}
		t.Skip(msg)
	}
	return root
}

// makeIn returns a runner of make targets in root with NSCLUSTER_DIR=dir.
func makeIn(root, dir string) func(limit time.Duration, args ...string) (string, error) {
	return func(limit time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", append([]string{"-C", root, "--no-print-directory"}, append(args, "NSCLUSTER_DIR="+dir)...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
}

// checkGone checks that nothing of a cluster is left: state directory,
// namespaces, the daemon and kproxy processes.
func checkGone(t *testing.T, dir string, st *State) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory %s still there (%v)", dir, err)
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), st.ID+"-") {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
	pids := []int{st.PID}
	for _, n := range st.Nodes {
		pids = append(pids, n.KproxyPID)
	}
	for _, pid := range pids {
		if running(pid) {
			t.Errorf("process %d of the cluster still runs", pid)
		}
	}
}

// curlUntil runs curl with urls in a host of the cluster (make netns-shell) until
// check accepts the replies or limit passes, and returns the backends seen.
func curlUntil(t *testing.T, mk func(time.Duration, ...string) (string, error), pod, urls string, limit time.Duration, check func([]echo.Reply) error) []string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out, err := mk(time.Minute, "netns-shell", "POD="+pod, "CMD=curl -s --max-time 2 "+strings.TrimSpace(urls))
		var rs []echo.Reply
		if err == nil {
			rs, err = replies(out)
		}
		if err == nil {
			err = check(rs)
		}
		if err == nil {
			var names []string
			for _, r := range rs {
				names = append(names, r.Name)
			}
			sort.Strings(names)
			return slices.Compact(names)
		}
		if time.Now().After(deadline) {
			t.Fatalf("curl from %s: %v", pod, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// replies parses the JSON bodies curl printed (one line each); make
// shell's own lines (none with CMD) would fail the parse.
func replies(out string) ([]echo.Reply, error) {
	var rs []echo.Reply
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r echo.Reply
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Name == "" {
			return nil, fmt.Errorf("not an echo reply: %q in\n%s", l, out)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// answeredBy checks that rs are answers from backends (any pod when nil),
// each backend at least once, seeing client as the source when valid.
func answeredBy(rs []echo.Reply, backends []string, client netip.Addr) error {
	seen := map[string]bool{}
	for _, r := range rs {
		if backends != nil && !slices.Contains(backends, r.Name) {
			return fmt.Errorf("answer from %s, not a backend of the Service (%v)", r.Name, backends)
		}
		if client.IsValid() {
			src, err := r.ClientAddr()
			if err != nil || src.Addr() != client {
				return fmt.Errorf("%s saw the client as %s, want %s (no masquerade from a pod)", r.Name, r.Client, client)
			}
		}
		seen[r.Name] = true
	}
	if len(rs) == 0 {
		return errors.New("no answer")
	}
	for _, b := range backends {
		if !seen[b] {
			return fmt.Errorf("%d answers, none from %s", len(rs), b)
		}
	}
	return nil
}

func modeOf(st *State, node string) string {
	for _, n := range st.Nodes {
		if n.Name == node {
			return n.Mode
		}
	}
	return ""
}

// running reports whether pid is a live process (not a zombie).
func running(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
