package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/cluster"
	"github.com/kproxy/kproxy/test/controlplane"
)

// Options configure Execute.
type Options struct {
	// Root is the repository root; ClusterDir make cluster's state
	// directory (default <Root>/.build/cluster).
	Root, ClusterDir string
	// Proxy and Mode select the cluster (cluster.ProxyKproxy or
	// cluster.ProxyKubeProxy; iptables or nftables).
	Proxy, Mode string
	// Focus narrows the suite (default DefaultFocus). ExtraSkips are
	// skipped on top of UpstreamSkips and MachineSkips.
	Focus      string
	ExtraSkips []Skip
	// Nodes is ginkgo's parallelism (default 4).
	Nodes int
	// ReportDir receives the reports (default
	// <Root>/.build/conformance/<proxy>-<mode>).
	ReportDir string
	// Fresh makes a new cluster even if one with this proxy and mode runs.
	Fresh bool
	// Timeout bounds the suite (default 6h).
	Timeout time.Duration
	// KproxyImage is passed to make cluster (default: make images' archive).
	KproxyImage string
	// Out receives the progress and the suite's output.
	Out io.Writer
	// Command is how the run was asked for, for the summary.
	Command string
	// ClusterTool is the kproxy-cluster binary that runs the cluster
	// (default <Root>/.build/kproxy-cluster, make cluster-tool's).
	ClusterTool string
	// Down takes the cluster down when the run ends, whatever its result
	// (make test-cluster).
	Down bool
	// RequirePassed fails a run in which no test passed (a focus that
	// selects nothing).
	RequirePassed bool
}

func (o *Options) defaults() {
	if o.ClusterDir == "" {
		o.ClusterDir = cluster.DefaultDir(o.Root)
	}
	if o.Focus == "" {
		o.Focus = DefaultFocus
	}
	if o.Nodes <= 0 {
		o.Nodes = 4
	}
	if o.ReportDir == "" {
		o.ReportDir = filepath.Join(o.Root, ".build", "conformance", o.Proxy+"-"+o.Mode)
	}
	if o.Timeout <= 0 {
		o.Timeout = 6 * time.Hour
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.ClusterTool == "" {
		o.ClusterTool = filepath.Join(o.Root, ".build", "kproxy-cluster")
	}
}

// ErrFailures is returned (wrapped) when the suite ran and tests failed.
var ErrFailures = errors.New("tests failed")

// ErrEvidence is returned (wrapped) when the run does not prove which
// proxy programmed the nodes (CheckEvidence).
var ErrEvidence = errors.New("the proof of which proxy ran fails")

// Execute makes sure make cluster's cluster runs with the proxy and mode
// asked for (a running one with others is taken down first), runs the
// suite against it, and writes into ReportDir: junit_01.xml (the suite's),
// e2e.log (its output), summary.md (Summary), evidence.txt and the proxy
// pods' logs. It returns the results; ErrFailures when a test failed.
func Execute(ctx context.Context, o Options) (_ Results, err error) {
	o.defaults()
	if err := cluster.CheckProxy(o.Proxy, o.Mode); err != nil {
		return Results{}, err
	}
	if o.Proxy == cluster.ProxyNone {
		return Results{}, errors.New("PROXY=none: the suite needs a Service proxy (kproxy or kube-proxy)")
	}
	say := func(format string, args ...any) { fmt.Fprintf(o.Out, "make conformance: "+format+"\n", args...) }
	// The commit the run starts from: the tree may change during the suite
	// (a run's summary once named the commit made while it ran).
	commit, _ := exec.CommandContext(ctx, "git", "-C", o.Root, "describe", "--always", "--dirty").Output()
	co := cluster.Options{Dir: o.ClusterDir, Root: o.Root, Out: o.Out, Proxy: o.Proxy, Mode: o.Mode, KproxyImage: o.KproxyImage, Tool: o.ClusterTool}
	st, err := cluster.ReadState(o.ClusterDir)
	reuse := err == nil && !o.Fresh && st.Proxy == o.Proxy && st.Mode == o.Mode
	if !reuse {
		if _, statErr := os.Stat(o.ClusterDir); statErr == nil {
			say("taking down the cluster in %s first", o.ClusterDir)
			if err := cluster.Down(ctx, co); err != nil {
				return Results{}, err
			}
		}
		say("make cluster PROXY=%s MODE=%s", o.Proxy, o.Mode)
	}
	if o.Down {
		defer func() {
			// The run's context may have ended: the cluster still goes.
			if downErr := cluster.Down(context.WithoutCancel(ctx), co); downErr != nil {
				err = errors.Join(err, fmt.Errorf("make cluster-down: %w", downErr))
			}
		}()
	}
	if err := cluster.Up(ctx, co); err != nil {
		return Results{}, err
	}
	if st, err = cluster.ReadState(o.ClusterDir); err != nil {
		return Results{}, err
	}
	bins, err := controlplane.EnsureConformance(ctx, controlplane.BuildOptions{RepoRoot: o.Root,
		Logf: func(f string, a ...any) { say(f, a...) }})
	if err != nil {
		return Results{}, err
	}
	if err := os.RemoveAll(o.ReportDir); err != nil {
		return Results{}, err
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return Results{}, err
	}
	skips := append(append(append([]Skip{}, UpstreamSkips...), MachineSkips...), o.ExtraSkips...)
	r := Run{
		E2ETest: bins.E2ETest, Ginkgo: bins.Ginkgo, Kubeconfig: st.Kubeconfig,
		Focus: o.Focus, Skip: SkipRegexp(skips), Nodes: o.Nodes, ReportDir: o.ReportDir,
		Timeout: o.Timeout, NumNodes: len(st.Nodes),
	}
	ev := &evidence{st: st, kubectl: filepath.Join(o.ClusterDir, cluster.BinDir, "kubectl")}
	before := ev.collect(ctx)
	started := time.Now()
	say("running upstream's e2e suite (%d parallel), output in %s", o.Nodes, filepath.Join(o.ReportDir, "e2e.log"))
	suiteErr := runSuite(ctx, st, r, filepath.Join(o.ReportDir, "e2e.log"), o.Out)
	after := ev.collect(ctx)
	ev.saveLogs(ctx, o.ReportDir, o.Proxy)
	var nodes []string
	for _, n := range st.Nodes {
		nodes = append(nodes, n.Name)
	}
	evidenceErr := CheckEvidence(o.Proxy, nodes, before, after)
	evidenceText := "before the suite:\n" + before.String() + "\nafter the suite:\n" + after.String()
	if evidenceErr != nil {
		evidenceText += "\nTHE PROOF FAILS:\n" + evidenceErr.Error() + "\n"
	} else {
		evidenceText += fmt.Sprintf("\nchecked: one %s pod on each node all along, no other proxy, every node synced during the suite\n", o.Proxy)
	}
	if err := os.WriteFile(filepath.Join(o.ReportDir, "evidence.txt"), []byte(evidenceText), 0o644); err != nil {
		return Results{}, err
	}
	f, err := os.Open(filepath.Join(o.ReportDir, "junit_01.xml"))
	if err != nil {
		return Results{}, errors.Join(fmt.Errorf("the suite wrote no JUnit report: %w", err), suiteErr)
	}
	res, err := ReadJUnit(f)
	_ = f.Close()
	if err != nil {
		return Results{}, err
	}
	h := Header{
		Proxy: o.Proxy, Mode: o.Mode, Commit: strings.TrimSpace(string(commit)), Command: o.Command,
		Started: started, Focus: r.Focus, Skip: r.Skip, Skips: skips, Evidence: evidenceText,
	}
	if err := os.WriteFile(filepath.Join(o.ReportDir, "summary.md"), []byte(Summary(h, res)), 0o644); err != nil {
		return res, err
	}
	c := res.Counts()
	say("%s %s: %d passed, %d failed, %d skipped by the test, in %v; summary: %s",
		o.Proxy, o.Mode, c["passed"], c["failed"], c["skipped"], time.Since(started).Round(time.Second), filepath.Join(o.ReportDir, "summary.md"))
	for _, t := range res.Tests {
		if t.State == "failed" {
			say("FAILED %s", t.Name)
		}
	}
	var errs []error
	if evidenceErr != nil {
		say("the proof of which proxy ran fails (evidence.txt):\n%v", evidenceErr)
		errs = append(errs, fmt.Errorf("%s %s: %w: %w", o.Proxy, o.Mode, ErrEvidence, evidenceErr))
	}
	switch {
	case c["failed"] > 0:
		errs = append(errs, fmt.Errorf("%s %s: %d %w", o.Proxy, o.Mode, c["failed"], ErrFailures))
	case suiteErr != nil && c["passed"] == 0:
		errs = append(errs, suiteErr)
	case c["passed"] == 0 && o.RequirePassed:
		errs = append(errs, fmt.Errorf("%s %s: no test passed (focus %q)", o.Proxy, o.Mode, r.Focus))
	}
	return res, errors.Join(errs...)
}

// runSuite runs ginkgo in the control plane's network namespace (where
// the API server and the nodes are reachable), its output into logPath and
// out.
func runSuite(ctx context.Context, st *cluster.State, r Run, logPath string, out io.Writer) error {
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	ns := st.Namespaces[cluster.ControlPlaneHost]
	argv := append([]string{"--net=/run/netns/" + ns, "--"}, r.Argv()...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.Dir = r.ReportDir
	// e2e.test runs kubectl (some tests): the cluster's, from PATH.
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(st.Kubectl)+":"+os.Getenv("PATH"), "KUBECONFIG="+st.Kubeconfig, "KUBE_SSH_USER=")
	cmd.Stdout = io.MultiWriter(log, out)
	cmd.Stderr = cmd.Stdout
	fmt.Fprintf(log, "nsenter %s\n", strings.Join(argv, " "))
	return runGroup(cmd)
}

// runGroup runs cmd in a process group of its own and, when its context
// ends, signals the whole group: ginkgo's parallel e2e.test processes
// outlived an interrupted run when only ginkgo was killed.
func runGroup(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// SIGINT: ginkgo interrupts its processes and writes its reports.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	}
	cmd.WaitDelay = time.Minute
	err := cmd.Run()
	if cmd.Process != nil {
		// Whatever of the group is left once ginkgo has returned.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	return err
}

// evidence reads which proxy programs the nodes: the proxy pods (name,
// node, image, restarts) of both kinds, and each node's last-sync
// timestamp metric (read on the node, at 127.0.0.1:10249).
type evidence struct {
	st      *cluster.State
	kubectl string
}

func (e *evidence) collect(ctx context.Context) Evidence {
	ev := Evidence{Syncs: map[string][]Sync{}}
	out, err := exec.CommandContext(ctx, "sh", e.kubectl, "-n", "kube-system", "get", "pods", "-l", PodSelector, "-o", PodColumns).Output()
	if err != nil {
		ev.Problems = append(ev.Problems, fmt.Sprintf("kubectl get pods: %v", err))
	} else if ev.Pods, err = ParsePods(string(out)); err != nil {
		ev.Problems = append(ev.Problems, err.Error())
	}
	for _, n := range e.st.Nodes {
		ns := e.st.Namespaces[n.Name]
		out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+ns, "--", "curl", "-s", "--max-time", "5", "http://127.0.0.1:10249/metrics").Output()
		if err != nil {
			ev.Problems = append(ev.Problems, fmt.Sprintf("%s: metrics: %v", n.Name, err))
			continue
		}
		ev.Syncs[n.Name] = ParseSyncs(string(out))
	}
	return ev
}

// saveLogs writes each proxy pod's log into dir.
func (e *evidence) saveLogs(ctx context.Context, dir, proxy string) {
	out, err := exec.CommandContext(ctx, "sh", e.kubectl, "-n", "kube-system", "get", "pods", "-l", "k8s-app="+proxy, "-o", "name").Output()
	if err != nil {
		return
	}
	for _, pod := range strings.Fields(string(out)) {
		logs, _ := exec.CommandContext(ctx, "sh", e.kubectl, "-n", "kube-system", "logs", pod, "--all-containers").CombinedOutput()
		_ = os.WriteFile(filepath.Join(dir, strings.TrimPrefix(pod, "pod/")+".log"), logs, 0o644)
	}
}
