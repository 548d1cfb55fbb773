package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/netns"
)

// TestMakeCluster runs README's quick start through make itself: make
// cluster (kproxy from make images, applied with kubectl apply -k of the
// kubeadm overlay) must return with the cluster running; then kubectl
// create deployment, expose, get endpointslices, and a pod's curl through
// the Service's name (CoreDNS) and ClusterIP answered by the Deployment's
// pods on both nodes, and the NodePort from outside the cluster; the kproxy
// DaemonSet pods program the nodes and no kube-proxy runs. Then the daemon
// is killed with SIGKILL, as a crash would, and make cluster-down must
// still leave nothing: no process in the cluster's cgroup, no cgroup, no
// mount under the state directory, no namespace, no state directory.
func TestMakeCluster(t *testing.T) {
	root := requireCluster(t)
	base, err := os.MkdirTemp("", "kc")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "cluster") // short: the nodes' sockets live under it
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	mk := makeIn(root, dir)
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err != nil {
			return
		}
		if t.Failed() {
			for _, f := range []string{LogFile, "node1/kubelet.log", "node1/containerd.log"} {
				if data, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
					t.Logf("end of %s:\n%s", f, lastLines(string(data), 40))
				}
			}
		}
		if out, err := mk(5*time.Minute, "cluster-down"); err != nil {
			t.Errorf("cleanup: %v", err)
		} else {
			t.Logf("cleanup: %s", out)
		}
	})

	begin := time.Now()
	out, err := mk(15*time.Minute, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make cluster returned after %v:\n%s", time.Since(begin).Round(time.Second), out)
	for _, w := range []string{"KUBECONFIG=" + filepath.Join(dir, KubeconfigFile) + "\n", "kubectl expose deployment web", "make cluster-down CLUSTER_DIR=" + dir} {
		if !strings.Contains(out, w) {
			t.Errorf("make cluster did not print %q", w)
		}
	}
	st, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if daemonOf(dir).PID() != st.PID {
		t.Fatalf("the cluster daemon (pid %d) is not running after make cluster returned", st.PID)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(dir, BinDir, "kubectl"), args...)
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
	if out := kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kproxy", "-o", "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{\"\\n\"}{end}"); !strings.Contains(out, "node1 Running") || !strings.Contains(out, "node2 Running") {
		t.Errorf("kproxy pods: %q, want one Running on each node", out)
	}
	if out := kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-proxy", "-o", "name"); out != "" {
		t.Errorf("kube-proxy pods run: %q", out)
	}

	// The quick start.
	const agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	kubectl("create", "deployment", "web", "--image="+agnhost, "--replicas=4", "--", "/agnhost", "netexec", "--http-port=8080")
	kubectl("expose", "deployment", "web", "--port=80", "--target-port=8080", "--type=NodePort")
	kubectl("run", "client", "--image="+agnhost, "--restart=Never", "--command", "--", "sleep", "3600")
	kubectl("wait", "--for=condition=Available", "deployment/web", "--timeout=3m")
	kubectl("wait", "--for=condition=Ready", "pod/client", "--timeout=3m")
	slices := kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {end}")
	if n := len(strings.Fields(slices)); n != 4 {
		t.Errorf("the EndpointSlice controller lists %d endpoints (%q), want 4", n, slices)
	}
	// Twenty connections through the Service's name: CoreDNS answers, kproxy
	// spreads them; at least two pods answer.
	seen := map[string]bool{}
	deadline := time.Now().Add(time.Minute)
	for len(seen) < 2 {
		out := kubectl("exec", "client", "--", "sh", "-c", "for i in $(seq 20); do curl -s --max-time 2 http://web/hostname; echo; done")
		for _, h := range strings.Fields(out) {
			if strings.HasPrefix(h, "web-") {
				seen[h] = true
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("through the Service from pod client, %d pods answered (%v); last output:\n%s", len(seen), seen, out)
		}
	}
	t.Logf("pods answering through the ClusterIP: %v", seen)
	port := strings.TrimSpace(kubectl("get", "service", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	for _, n := range st.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+st.Namespaces["outside"], "--",
			"curl", "-s", "--max-time", "5", "--retry", "5", "--retry-all-errors", fmt.Sprintf("http://%s:%s/hostname", n.IP, port)).CombinedOutput()
		cancel()
		if err != nil || !strings.HasPrefix(string(out), "web-") {
			t.Errorf("NodePort %s:%s from outside: %v %q", n.IP, port, err, out)
		}
	}

	// A crash: the daemon dies with SIGKILL (its children with it; the
	// containers and shims are left), then make cluster-down.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for daemonOf(dir).PID() != 0 {
		time.Sleep(100 * time.Millisecond)
	}
	cg, err := detectCgroups(CgroupName(dir))
	if err != nil {
		t.Fatal(err)
	}
	if left := cg.pids(); len(left) == 0 {
		t.Error("no process left in the cluster's cgroup after the crash: the test does not test cleanup")
	}
	out, err = mk(5*time.Minute, "cluster-down")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make cluster-down after the crash: %s", out)
	checkGone(t, dir, st, cg)
}

// checkGone checks that nothing of the cluster of dir is left.
func checkGone(t *testing.T, dir string, st *State, cg *cgroups) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory %s still there (%v)", dir, err)
	}
	if left := cg.pids(); len(left) > 0 {
		t.Errorf("processes left in cgroup %s: %v", cg.Name, left)
	}
	for _, root := range cg.Roots {
		if _, err := os.Stat(filepath.Join(root, cg.Name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s still in %s (%v)", cg.Name, root, err)
		}
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), st.ID+"-") {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(unescapeMountPath(fields[4]), dir) {
			t.Errorf("mount left: %s", sc.Text())
		}
	}
	if running(st.PID) {
		t.Errorf("the daemon (pid %d) still runs", st.PID)
	}
}

func running(pid int) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z'
}

// requireCluster skips (fails under CI=true) unless kernel tests run as
// root with the tools, the binaries are built (make cluster-binaries) and
// make images' archive is there; it returns the repository root.
func requireCluster(t *testing.T) string {
	t.Helper()
	netns.Require(t, "iptables", "nft", "make", "curl", "nsenter", "unshare", "runc")
	root := repoRoot(t)
	fail := func(msg string) {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: " + msg)
		}
		t.Skip(msg)
	}
	if err := Prerequisites(root); err != nil {
		fail(err.Error())
	}
	return root
}

// makeIn returns a runner of make targets in root with CLUSTER_DIR=dir.
func makeIn(root, dir string) func(limit time.Duration, args ...string) (string, error) {
	return func(limit time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", append([]string{"-C", root, "--no-print-directory"}, append(args, "CLUSTER_DIR="+dir)...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
}
