package nscluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/integration"
	"github.com/kproxy/kproxy/test/internal/daemon"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// Options configure every command.
type Options struct {
	// Dir is the state directory (absolute). Default DefaultDir(Root).
	Dir string
	// Root is kproxy's repository root. Required.
	Root string
	// Out receives what the command prints (default os.Stdout).
	Out io.Writer
	// StartTimeout bounds the daemon's start, once the binaries are built
	// (default 3 minutes).
	StartTimeout time.Duration
	// MakeArgs are shown after every make command in the hints (Up sets
	// NSCLUSTER_DIR=<dir> itself when Dir is not the default).
	MakeArgs string
}

func (o Options) withDefaults() (Options, error) {
	if o.Root == "" {
		return o, errors.New("cluster: Options.Root is required")
	}
	if o.Dir == "" {
		o.Dir = DefaultDir(o.Root)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return o, err
	}
	o.Dir = dir
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 3 * time.Minute
	}
	if o.MakeArgs == "" && o.Dir != DefaultDir(o.Root) {
		o.MakeArgs = "NSCLUSTER_DIR=" + o.Dir
	}
	return o, nil
}

func (o Options) path(elem ...string) string {
	return filepath.Join(append([]string{o.Dir}, elem...)...)
}

// show renders a path relative to the repository root when it is under it.
func (o Options) show(p string) string {
	if rel, err := filepath.Rel(o.Root, p); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return p
}

func (o Options) say(format string, args ...any) { fmt.Fprintf(o.Out, format+"\n", args...) }

// preflight checks what every command that builds or enters namespaces
// needs: root, and the tools.
func preflight(tools ...string) error {
	if os.Geteuid() != 0 {
		return errors.New("make netns-cluster creates network namespaces: run it as root (sudo make netns-cluster)")
	}
	var missing []string
	for _, t := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("make netns-cluster needs %s in PATH (Debian/Ubuntu: apt-get install iproute2 iptables nftables)", strings.Join(missing, ", "))
	}
	return nil
}

// Up starts a cluster in the background (make netns-cluster) and returns once it
// runs, after printing the hints. If one already runs in Dir, it prints its
// hints again. On failure nothing is left behind.
func Up(ctx context.Context, o Options) (err error) {
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	if err := preflight("iptables", "nft"); err != nil {
		return err
	}
	top := proxytest.Default()
	ex, err := LoadExample(o.Root, top)
	if err != nil {
		return err
	}
	if pid := daemonOf(o.Dir).PID(); pid > 0 {
		st, err := ReadState(o.Dir)
		if err != nil {
			return fmt.Errorf("a cluster daemon (pid %d) is starting or broken in %s: wait, or make netns-cluster-down: %w", pid, o.Dir, err)
		}
		o.say("make netns-cluster: already running in %s.\n", o.show(o.Dir))
		o.say("%s", Hints(st, ex, o.hintOptions()))
		return nil
	}
	// A directory left by a crashed daemon is removed first.
	if _, err := os.Stat(o.Dir); err == nil {
		o.say("make netns-cluster: removing the state of a cluster that is not running (%s)", o.show(o.Dir))
		if err := Down(ctx, o); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.path(BinDir), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.path(MarkerFile), []byte("state directory of make netns-cluster; make netns-cluster-down removes it\n"), 0o644); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			o.say("make netns-cluster: failed; cleaning up")
			err = errors.Join(err, Down(context.Background(), o))
		}
	}()

	begin := time.Now()
	o.say("make netns-cluster: building kproxy and kpt-echo into %s", o.show(o.path(BinDir)))
	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	_, err = netns.GoBuild(bctx, o.path(BinDir), e2e.KProxyPackage)
	if err == nil {
		_, err = netns.BuildEcho(bctx, o.path(BinDir))
	}
	cancel()
	if err != nil {
		return err
	}
	o.say("make netns-cluster: control-plane binaries and kubectl (built from Go modules once, then cached)")
	if _, err := controlplane.Ensure(ctx, controlplane.BuildOptions{RepoRoot: o.Root, Logf: func(f string, a ...any) {
		o.say("  "+f, a...)
	}}); err != nil {
		return err
	}
	self, err := installSelf(o)
	if err != nil {
		return err
	}
	if err := writeScripts(o, self); err != nil {
		return err
	}

	o.say("make netns-cluster: starting the cluster daemon (log: %s)", o.show(o.path(LogFile)))
	cmd, exited, err := daemonOf(o.Dir).Start(self, []string{"-dir", o.Dir, "-root", o.Root, "run"}, o.Root)
	if err != nil {
		return err
	}
	if err := daemonOf(o.Dir).Follow(ctx, o.Out, cmd.Process.Pid, exited, o.StartTimeout); err != nil {
		return err
	}
	st, err := ReadState(o.Dir)
	if err != nil {
		return err
	}
	o.say("make netns-cluster: up in %s\n", time.Since(begin).Round(100*time.Millisecond))
	o.say("%s", Hints(st, ex, o.hintOptions()))
	return nil
}

func (o Options) hintOptions() HintOptions {
	return HintOptions{Show: o.show, MakeArgs: o.MakeArgs, BinDir: o.path(BinDir)}
}

// installSelf copies this program into the state directory: the daemon
// runs from there (a rebuild of the original cannot hit a busy text file),
// and the kubectl wrapper calls it.
func installSelf(o Options) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	dst := o.path(BinDir, "kproxy-nscluster")
	data, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	if err := daemon.WriteAtomic(dst, data, 0o755); err != nil {
		return "", fmt.Errorf("installing %s: %w", dst, err)
	}
	return dst, nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// writeScripts writes the kubectl wrapper and make netns-shell's bash startup file.
func writeScripts(o Options, self string) error {
	kubectl := "#!/bin/sh\n" +
		"# kubectl of make netns-cluster: kubectl v1.37.2 (built from Go modules) run inside\n" +
		"# the cluster's control-plane network namespace, the only place the API\n" +
		"# server is reachable. KUBECONFIG defaults to the cluster's admin kubeconfig.\n" +
		"exec " + shellQuote(self) + " -dir " + shellQuote(o.Dir) + " -root " + shellQuote(o.Root) + " kubectl \"$@\"\n"
	if err := daemon.WriteAtomic(o.path(BinDir, "kubectl"), []byte(kubectl), 0o755); err != nil {
		return err
	}
	rc := "# bash startup file of make netns-shell\n" +
		"[ -f /etc/bash.bashrc ] && . /etc/bash.bashrc\n" +
		"[ -f ~/.bashrc ] && . ~/.bashrc\n" +
		"PS1='[$KPROXY_CLUSTER_HOST \\W]\\$ '\n" +
		"echo \"In the network namespace of $KPROXY_CLUSTER_HOST (make netns-cluster); exit leaves it.\"\n"
	return daemon.WriteAtomic(o.path(ShellRC), []byte(rc), 0o644)
}

// Run is the daemon: it builds the cluster, writes StateFile, and runs
// until ctx ends (SIGTERM from Down), then tears everything down. Out gets
// its log.
func Run(ctx context.Context, o Options) (err error) {
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	defer func() {
		if err != nil {
			logf("cluster daemon: %v", err)
		}
	}()
	if err := preflight("iptables", "nft"); err != nil {
		return err
	}
	bins, err := controlplane.Ensure(ctx, controlplane.BuildOptions{RepoRoot: o.Root, NoBuild: true})
	if err != nil {
		return err
	}
	logf("cluster daemon pid %d: creating the network namespaces", os.Getpid())
	c, err := netns.Setup(ctx, netns.Options{EchoBinary: o.path(BinDir, "kpt-echo"), Logf: logf})
	if err != nil {
		return err
	}
	var env *integration.Env
	var procs []*netns.Process
	defer func() {
		logf("stopping: kproxy, the control plane, the namespaces")
		for _, p := range procs {
			if err := p.Stop(5 * time.Second); err != nil {
				logf("stopping %s: %v", p.Name, err)
			}
		}
		if env != nil {
			if err := env.Close(); err != nil {
				logf("stopping the control plane: %v", err)
			}
		}
		if err := c.Close(); err != nil {
			logf("removing the namespaces: %v", err)
		}
		logf("stopped")
	}()
	if err := os.WriteFile(o.path(IDFile), []byte(c.ID+"\n"), 0o644); err != nil {
		return err
	}
	env, err = integration.Start(ctx, integration.Options{
		Cluster: c, Binaries: bins, DeployDir: filepath.Join(o.Root, "deploy", "rbac"), Dir: o.Dir, Logf: logf,
	})
	if err != nil {
		return err
	}
	kc, err := env.ControlPlane.Kubeconfig(controlplane.Admin)
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.path(KubeconfigFile), kc, 0o600); err != nil {
		return err
	}
	if err := os.MkdirAll(o.path(LogDir), 0o755); err != nil {
		return err
	}
	st := &State{
		PID: os.Getpid(), ID: c.ID, Namespaces: map[string]string{},
		APIServer: env.ControlPlane.URL, Kubeconfig: o.path(KubeconfigFile), Kubectl: bins.Kubectl,
		EchoPort: proxytest.EchoPort,
	}
	for _, h := range c.Hosts() {
		st.Namespaces[h] = c.NS(h).Name
	}
	for _, spec := range Nodes {
		p := env.Proxy(o.path(BinDir, "kproxy"), spec.Name, "")
		p.Mode, p.Config = spec.Mode, proxytest.Config{ClusterCIDR: true}
		log := o.path(LogDir, "kproxy-"+spec.Name+".log")
		proc, err := c.Start(spec.Name, "kproxy-"+spec.Name, log, append([]string{p.Binary}, p.Argv()...)...)
		if err != nil {
			return err
		}
		procs = append(procs, proc)
		n, _ := c.Topology.Node(spec.Name)
		node := Node{Name: spec.Name, IPv4: n.IPv4.String(), Mode: spec.Mode, KproxyPID: proc.Pid(), KproxyLog: log}
		for _, pod := range c.Topology.PodsOn(spec.Name) {
			node.Pods = append(node.Pods, pod.Name)
		}
		st.Nodes = append(st.Nodes, node)
		logf("kproxy --proxy-mode %s started in %s (pid %d, log %s)", spec.Mode, spec.Name, proc.Pid(), o.show(log))
	}
	for i, spec := range Nodes {
		if err := waitHealthy(ctx, env, spec.Name, procs[i], 90*time.Second); err != nil {
			return err
		}
		logf("kproxy in %s: synced and healthy (/healthz 200)", spec.Name)
	}
	st.Ready = time.Now()
	logf("ready")
	if err := WriteState(o.Dir, st); err != nil {
		return err
	}

	// Run until told to stop; a kproxy that exits is reported, the rest
	// keeps running so that its log can be read.
	for i := range procs {
		go func(p *netns.Process) {
			select {
			case <-p.Done():
				if ctx.Err() == nil {
					logf("%s exited: %v (log: %s)", p.Name, p.Err(), o.show(st.Nodes[i].KproxyLog))
				}
			case <-ctx.Done():
			}
		}(procs[i])
	}
	<-ctx.Done()
	logf("cluster daemon: asked to stop")
	return nil
}

// waitHealthy waits until kproxy's /healthz in host answers 200: its first
// sync is done and its Node is known.
func waitHealthy(ctx context.Context, env *integration.Env, host string, p *netns.Process, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last string
	for {
		code, body, err := env.Health(ctx, host, "/healthz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("status %d %.200s (%v)", code, body, err)
		select {
		case <-p.Done():
			return fmt.Errorf("kproxy in %s exited before it was healthy: %v\n%s", host, p.Err(), e2e.LastLines(e2e.WithoutDumps(p.Output()), 30))
		case <-ctx.Done():
			return fmt.Errorf("kproxy in %s not healthy within %v: last /healthz %s\n%s", host, limit, last, e2e.LastLines(e2e.WithoutDumps(p.Output()), 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Down stops the daemon of Dir (SIGTERM; SIGKILL after a minute), deletes
// the cluster's namespaces that are left (all of them after a SIGKILL or a
// crash) and removes Dir. Without a cluster it says so and succeeds.
func Down(ctx context.Context, o Options) (err error) {
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	if _, err := os.Stat(o.Dir); errors.Is(err, os.ErrNotExist) {
		o.say("make netns-cluster-down: no cluster in %s", o.show(o.Dir))
		return nil
	}
	if _, err := os.Stat(o.path(MarkerFile)); err != nil {
		return fmt.Errorf("%s was not made by make netns-cluster (no %s): not removing it", o.Dir, MarkerFile)
	}
	if err := preflight(); err != nil {
		return err
	}
	if pid := daemonOf(o.Dir).PID(); pid > 0 {
		o.say("make netns-cluster-down: stopping the cluster daemon (pid %d)", pid)
		if err := daemonOf(o.Dir).Stop(pid, time.Minute); err != nil {
			return err
		}
	}
	id, _ := os.ReadFile(o.path(IDFile))
	if s := strings.TrimSpace(string(id)); s != "" {
		removed, err := netns.RemoveCluster(ctx, s)
		if err != nil {
			return err
		}
		if len(removed) > 0 {
			o.say("make netns-cluster-down: deleted %d namespaces the daemon left", len(removed))
		}
	} else if _, err := netns.Sweep(ctx); err != nil {
		// The daemon died before it recorded its namespaces: they are a dead
		// run's, which Sweep removes.
		return err
	}
	if err := os.RemoveAll(o.Dir); err != nil {
		return err
	}
	o.say("make netns-cluster-down: cluster removed (namespaces, processes and %s)", o.show(o.Dir))
	return nil
}

// Shell replaces this process with a command inside a host's namespace
// (make netns-shell POD=host): an interactive bash when argv is empty. The
// environment gets KPROXY_CLUSTER_HOST, the state directory's bin first in
// PATH and the cluster's KUBECONFIG unless one is set.
func Shell(o Options, host string, argv []string) error {
	var err error
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	st, err := readRunning(o)
	if err != nil {
		return err
	}
	if host == "" {
		host = ClientAlias
	}
	h, ns, err := st.Host(host)
	if err != nil {
		return err
	}
	if len(argv) == 0 {
		argv = []string{"bash", "--rcfile", o.path(ShellRC), "-i"}
	}
	return execIn(ns, argv, append(clusterEnv(o, st), "KPROXY_CLUSTER_HOST="+h))
}

// Kubectl replaces this process with kubectl in the control-plane
// namespace (the kubectl wrapper in <dir>/bin).
func Kubectl(o Options, args []string) error {
	var err error
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	st, err := readRunning(o)
	if err != nil {
		return err
	}
	_, ns, err := st.Host(ControlPlaneHost)
	if err != nil {
		return err
	}
	return execIn(ns, append([]string{st.Kubectl}, args...), clusterEnv(o, st))
}

func readRunning(o Options) (*State, error) {
	st, err := ReadState(o.Dir)
	if err != nil {
		return nil, err
	}
	if daemonOf(o.Dir).PID() == 0 {
		return nil, fmt.Errorf("%w: the daemon of %s (pid %d) is gone; make netns-cluster-down, then make netns-cluster", ErrNoCluster, o.Dir, st.PID)
	}
	return st, nil
}

// clusterEnv is the environment of a shell or kubectl run in the cluster.
func clusterEnv(o Options, st *State) []string {
	env := os.Environ()
	set := func(k, v string, override bool) {
		for i, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				if override || kv == k+"=" {
					env[i] = k + "=" + v
				}
				return
			}
		}
		env = append(env, k+"="+v)
	}
	set("KUBECONFIG", st.Kubeconfig, false)
	// kubectl's discovery cache stays in the state directory.
	set("KUBECACHEDIR", o.path("kube-cache"), false)
	set("PATH", o.path(BinDir)+string(os.PathListSeparator)+os.Getenv("PATH"), true)
	return env
}

// execIn replaces this process with argv inside the harness namespace ns.
func execIn(ns string, argv, env []string) error {
	n, err := netns.Open(ns)
	if err != nil {
		return err
	}
	cmd, err := n.Command(context.Background(), argv[0], argv[1:]...)
	if err != nil {
		return err
	}
	if cmd.Err != nil {
		return cmd.Err
	}
	return syscall.Exec(cmd.Path, cmd.Args, env)
}

// daemonOf names the cluster daemon of state directory dir.
func daemonOf(dir string) daemon.Daemon {
	return daemon.Daemon{Tool: "kproxy-nscluster", Dir: dir, PIDFile: filepath.Join(dir, PIDFile),
		LogFile: filepath.Join(dir, LogFile), StateFile: filepath.Join(dir, StateFile)}
}
