package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/test/cluster/images"
	"github.com/kproxy/kproxy/test/controlplane"
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
	// Proxy is ProxyKproxy (default), ProxyKubeProxy or ProxyNone; Mode
	// iptables (default) or nftables.
	Proxy string
	Mode  string
	// Overlay is the kustomization kproxy is applied with: "kubeadm"
	// (default: deploy/overlays/kubeadm, with the kube-proxy ConfigMap saved
	// as docs/install.md says) or "default" (deploy/, its files edited).
	Overlay string
	// KproxyImage is make images' archive. Default
	// <Root>/.build/images/kproxy-linux-amd64.oci.tar.
	KproxyImage string
	// StartTimeout bounds the daemon's start once everything is built
	// (default 10 minutes).
	StartTimeout time.Duration
	// MakeArgs are shown after every make command in the hints.
	MakeArgs string
	// Tool is the kproxy-cluster binary Up starts as the daemon. Default:
	// this program, which must then be kproxy-cluster (make conformance's
	// kproxy-conformance sets it).
	Tool string
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
	if o.Proxy == "" {
		o.Proxy = ProxyKproxy
	}
	if o.Mode == "" {
		o.Mode = "iptables"
	}
	if err := CheckProxy(o.Proxy, o.Mode); err != nil {
		return o, err
	}
	if o.Overlay == "" {
		o.Overlay = "kubeadm"
	}
	if o.Overlay != "kubeadm" && o.Overlay != "default" {
		return o, fmt.Errorf("OVERLAY=%q: want kubeadm or default", o.Overlay)
	}
	if o.KproxyImage == "" {
		o.KproxyImage = filepath.Join(o.Root, ".build", "images", "kproxy-linux-amd64.oci.tar")
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Minute
	}
	if o.MakeArgs == "" && o.Dir != DefaultDir(o.Root) {
		o.MakeArgs = "CLUSTER_DIR=" + o.Dir
	}
	return o, nil
}

func (o Options) layout() Layout { return Layout{Dir: o.Dir} }

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

// tools are the commands the cluster runs, and the Debian packages that
// have them.
var tools = map[string]string{
	"ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux", "mount": "mount", "mountpoint": "util-linux",
	"runc": "runc", "iptables": "iptables", "nft": "nftables",
}

// preflight checks what the cluster needs: root, the tools, the CNI
// plugins.
func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("make cluster creates network namespaces, cgroups and mounts: run it as root")
	}
	var missing []string
	pkgs := map[string]bool{}
	for t, pkg := range tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
			pkgs[pkg] = true
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(CNIBinDir, p))
			pkgs["containernetworking-plugins"] = true
		}
	}
	if len(missing) > 0 {
		var names []string
		for p := range pkgs {
			names = append(names, p)
		}
		return fmt.Errorf("make cluster needs %s (Debian: apt-get install %s)", strings.Join(missing, ", "), strings.Join(names, " "))
	}
	return nil
}

// Prerequisites reports what make cluster would need to build or install
// first in the repository at root: root and the tools (preflight), the
// control plane's and the cluster's binaries (make cluster-binaries), make
// images' kproxy archive. Tests call it to skip (or fail under CI=true)
// with the command that fixes it.
func Prerequisites(root string) error {
	if err := preflight(); err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := controlplane.Ensure(ctx, controlplane.BuildOptions{RepoRoot: root, NoBuild: true}); err != nil {
		return fmt.Errorf("%w (make cluster-binaries builds them)", err)
	}
	if _, err := controlplane.EnsureCluster(ctx, controlplane.BuildOptions{RepoRoot: root, NoBuild: true}); err != nil {
		return fmt.Errorf("%w (make cluster-binaries builds them)", err)
	}
	if _, err := os.Stat(filepath.Join(root, ".build", "images", "kproxy-linux-amd64.oci.tar")); err != nil {
		return fmt.Errorf("kproxy's image: %w (make images builds it)", err)
	}
	return nil
}

// binaries are the programs the daemon runs.
type binaries struct {
	cp                                  controlplane.Binaries
	cl                                  controlplane.ClusterBinaries
	kubelet, containerd, containerdShim string
	ctr                                 string
}

func ensureBinaries(ctx context.Context, o Options, noBuild bool, logf func(string, ...any)) (binaries, error) {
	cp, err := controlplane.Ensure(ctx, controlplane.BuildOptions{RepoRoot: o.Root, NoBuild: noBuild, Logf: logf})
	if err != nil {
		return binaries{}, err
	}
	cl, err := controlplane.EnsureCluster(ctx, controlplane.BuildOptions{RepoRoot: o.Root, NoBuild: noBuild, Logf: logf})
	if err != nil {
		return binaries{}, err
	}
	return binaries{cp: cp, cl: cl, kubelet: cl.Kubelet, containerd: cl.Containerd, containerdShim: cl.ContainerdShim, ctr: cl.Ctr}, nil
}

// imagesDir is where the test images are cached (it outlives the cluster).
func imagesDir(root string) string { return filepath.Join(root, ".build", "cluster-images") }

// buildImages writes (or finds) the images every node imports, and adds
// kproxy's from make images when kproxy is the proxy.
func buildImages(ctx context.Context, o Options, bins binaries, logf func(string, ...any)) ([]imageArchive, error) {
	pause := filepath.Join(imagesDir(o.Root), "kpt-pause")
	if _, err := netns.GoBuild(ctx, filepath.Dir(pause), "./test/cluster/cmd/kpt-pause"); err != nil {
		return nil, err
	}
	gomodcache, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	src := filepath.Join(strings.TrimSpace(string(gomodcache)), "k8s.io", "kubernetes@"+controlplane.KubernetesVersion, "test", "images", "agnhost")
	specs := images.Specs(images.Programs{
		Pause: pause, Agnhost: bins.cl.Agnhost, Regression: bins.cl.RegressionIssue74839,
		CoreDNS: bins.cl.CoreDNS, KubeProxy: bins.cp.KubeProxy, AgnhostSource: src,
	})
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	built, err := images.Build(ctx, images.Options{
		Dir: imagesDir(o.Root), DebCache: filepath.Join(o.Root, ".build", "images", "debs"), Epoch: epoch, Logf: logf,
	}, specs)
	if err != nil {
		return nil, err
	}
	var out []imageArchive
	for _, b := range built {
		out = append(out, imageArchive{Path: b.Path, Ref: b.Spec.Ref(), Tags: b.Spec.Refs[1:]})
	}
	if o.Proxy == ProxyKproxy || o.Proxy == ProxyNone {
		ref, err := imageRef(o.KproxyImage)
		if err != nil {
			return nil, fmt.Errorf("kproxy's image (make images): %w", err)
		}
		out = append(out, imageArchive{Path: o.KproxyImage, Ref: ref})
	}
	return out, nil
}

// Up starts a cluster in the background (make cluster) and returns once it
// is ready, after printing how to use it. If one already runs in Dir, it
// prints the hints again. On failure nothing is left behind.
func Up(ctx context.Context, o Options) (err error) {
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	if err := preflight(); err != nil {
		return err
	}
	if err := o.layout().CheckPaths(); err != nil {
		return err
	}
	if pid := daemonOf(o.Dir).PID(); pid > 0 {
		st, err := ReadState(o.Dir)
		if err != nil {
			return fmt.Errorf("a cluster daemon (pid %d) is starting or broken in %s: wait, or make cluster-down: %w", pid, o.Dir, err)
		}
		if st.Proxy != o.Proxy || st.Mode != o.Mode {
			return fmt.Errorf("a cluster with %s in %s mode runs in %s: make cluster-down first, or ask for that one", st.Proxy, st.Mode, o.show(o.Dir))
		}
		o.say("make cluster: already running in %s.\n", o.show(o.Dir))
		o.say("%s", Hints(st, o.hintOptions()))
		return nil
	}
	if _, err := os.Stat(o.Dir); err == nil {
		o.say("make cluster: removing the state of a cluster that is not running (%s)", o.show(o.Dir))
		if err := Down(ctx, o); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(o.path(BinDir), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.path(MarkerFile), []byte("state directory of make cluster; make cluster-down removes it\n"), 0o644); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			o.say("make cluster: failed; cleaning up")
			err = errors.Join(err, Down(context.Background(), o))
		}
	}()
	begin := time.Now()
	logf := func(f string, a ...any) { o.say("  "+f, a...) }
	o.say("make cluster: binaries (built from Go modules once, then cached)")
	bins, err := ensureBinaries(ctx, o, false, logf)
	if err != nil {
		return err
	}
	o.say("make cluster: images (Debian packages and the binaries, once, then cached in %s)", o.show(imagesDir(o.Root)))
	if _, err := buildImages(ctx, o, bins, logf); err != nil {
		return err
	}
	self, err := installSelf(o)
	if err != nil {
		return err
	}
	o.say("make cluster: starting the cluster daemon (%s, %s mode; log: %s)", o.Proxy, o.Mode, o.show(o.path(LogFile)))
	cmd, exited, err := daemonOf(o.Dir).Start(self, []string{"-dir", o.Dir, "-root", o.Root, "-proxy", o.Proxy, "-mode", o.Mode,
		"-overlay", o.Overlay, "-kproxy-image", o.KproxyImage, "run"}, o.Root)
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
	o.say("make cluster: up in %s\n", time.Since(begin).Round(100*time.Millisecond))
	o.say("%s", Hints(st, o.hintOptions()))
	return nil
}

func (o Options) hintOptions() HintOptions {
	return HintOptions{Show: o.show, MakeArgs: o.MakeArgs, BinDir: o.path(BinDir)}
}

// toolName is the daemon's program name (daemon.Daemon.Is looks for it).
const toolName = "kproxy-cluster"

// installSelf copies kproxy-cluster (Options.Tool, or this program) into
// the state directory: the daemon runs from there, so a rebuild of the
// original cannot hit a busy file. Any other program is refused: it
// would not know the daemon's command, and Down would not recognise it.
func installSelf(o Options) (string, error) {
	exe := o.Tool
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return "", err
		}
	}
	if filepath.Base(exe) != toolName {
		return "", fmt.Errorf("the cluster daemon is %s, not %s (set Options.Tool)", toolName, exe)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	dst := o.path(BinDir, toolName)
	return dst, daemon.WriteAtomic(dst, data, 0o755)
}

// Run is the daemon: it builds the cluster, writes StateFile, and runs
// until ctx ends (SIGTERM from Down), then tears everything down.
func Run(ctx context.Context, o Options) (err error) {
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	begin := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	defer func() {
		if err != nil {
			logf("cluster daemon: %v", err)
		}
	}()
	if err := preflight(); err != nil {
		return err
	}
	l := o.layout()
	bins, err := ensureBinaries(ctx, o, true, nil)
	if err != nil {
		return err
	}
	archives, err := buildImages(ctx, o, bins, logf)
	if err != nil {
		return err
	}

	// Every process of the cluster, this one first, lives below the
	// cluster's cgroup.
	cg, err := detectCgroups(CgroupName(o.Dir))
	if err != nil {
		return err
	}
	t := &teardown{o: o, cg: cg, logf: logf}
	defer func() { t.run() }()
	subs := [][]string{{"daemon"}}
	for _, n := range Nodes {
		subs = append(subs, []string{n.Name})
	}
	for _, s := range subs {
		if err := cg.create(s...); err != nil {
			return err
		}
	}
	if err := cg.join(os.Getpid(), "daemon"); err != nil {
		return err
	}
	logf("cluster daemon pid %d (%s, %s mode): cgroup %s, creating the network namespaces", os.Getpid(), o.Proxy, o.Mode, cg.Name)

	topo := proxytest.Default()
	topo.Pods = nil
	c, err := netns.Setup(ctx, netns.Options{Topology: topo, Logf: logf})
	if err != nil {
		return err
	}
	t.netns = c
	if err := os.WriteFile(o.path(IDFile), []byte(c.ID+"\n"), 0o644); err != nil {
		return err
	}
	cpNS, err := c.AddLANHost(ctx, ControlPlaneHost, ControlPlaneIP, ControlPlaneIPv6)
	if err != nil {
		return err
	}
	if err := cpNS.IP(ctx, podCIDRRoutes()...); err != nil {
		return err
	}
	for _, n := range Nodes {
		ns, err := c.MustNS(n.Name)
		if err != nil {
			return err
		}
		// Bridged pod-to-pod traffic (a Service's reply within one node)
		// must meet the proxy's NAT: the bridge passes it to iptables.
		if err := ns.Sysctl(map[string]string{"net.bridge.bridge-nf-call-iptables": "1", "net.bridge.bridge-nf-call-ip6tables": "1"}); err != nil {
			logf("%s: bridge netfilter sysctls: %v (same-node Service traffic may not be un-NATed)", n.Name, err)
		}
	}

	// The control plane.
	var users []controlplane.User
	for _, u := range ControlPlaneUsers() {
		users = append(users, controlplane.User{Name: u.Name, Groups: u.Groups})
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Binaries:               bins.cp,
		ListenIP:               ControlPlaneIP,
		CommandPrefix:          controlplane.NetnsExecPrefix(cpNS.Name),
		Dial:                   controlplane.NetnsDialer(cpNS.Name),
		ServiceClusterIPRange:  ServiceCIDR.String(),
		ServiceNodePortRange:   NodePortRange,
		AuthorizationModes:     "Node,RBAC",
		EndpointReconcilerType: "lease",
		Users:                  users,
		ExtraAPIServerArgs:     APIServerArgs(),
		Dir:                    l.ControlPlaneDir(),
	})
	if err != nil {
		return err
	}
	t.cp = cp
	logf("control plane ready at %s (Node,RBAC; lease endpoint reconciler)", cp.URL)
	admin, err := cp.Kubeconfig(controlplane.Admin)
	if err != nil {
		return err
	}
	if err := daemon.WriteAtomic(o.path(KubeconfigFile), admin, 0o600); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(l.Kubeconfig("x")), 0o755); err != nil {
		return err
	}
	for _, u := range users {
		kc, err := cp.UserKubeconfig(u.Name)
		if err != nil {
			return err
		}
		if err := daemon.WriteAtomic(l.Kubeconfig(kubeconfigName(u.Name)), kc, 0o600); err != nil {
			return err
		}
	}
	if err := writeKubectl(o, bins.cp.Kubectl, cpNS.Name); err != nil {
		return err
	}
	kubectl := newKubectl(bins.cp.Kubectl, cpNS.Name, o.path(KubeconfigFile))
	rc, err := cp.RESTConfig(controlplane.Admin)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}

	// The controllers.
	if err := os.MkdirAll(l.Logs(), 0o755); err != nil {
		return err
	}
	if _, err := c.Start(ControlPlaneHost, "kube-controller-manager", filepath.Join(l.Logs(), "kube-controller-manager.log"),
		append([]string{bins.cl.KubeControllerManager}, ControllerManagerArgs(l, cp.CAFile, cp.SAKeyFile)...)...); err != nil {
		return err
	}
	if _, err := c.Start(ControlPlaneHost, "kube-scheduler", filepath.Join(l.Logs(), "kube-scheduler.log"),
		append([]string{bins.cl.KubeScheduler}, SchedulerArgs(l)...)...); err != nil {
		return err
	}
	logf("kube-controller-manager and kube-scheduler started (logs in %s)", o.show(l.Logs()))

	// The nodes: containerd, the images, the kubelet.
	if err := ensureHostDirs(o.path("created-host-dirs")); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(Nodes))
	for i, n := range Nodes {
		nodeKC, err := cp.UserKubeconfig("system:node:" + n.Name)
		if err != nil {
			return err
		}
		if err := prepareNode(l, n, cg, cp.CAFile, nodeKC); err != nil {
			return err
		}
		if err := createMountNS(ctx, l.Node(n.Name)); err != nil {
			return fmt.Errorf("%s: mount namespace: %w", n.Name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = startNode(ctx, c, l, n, bins, archives, logf)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := setPodCIDRs(ctx, cs, 2*time.Minute); err != nil {
		return err
	}
	if err := waitNodesReady(ctx, cs, 3*time.Minute); err != nil {
		return fmt.Errorf("nodes Ready: %w", err)
	}
	logf("nodes %s Ready", nodeNames())

	// The add-ons: the cluster DNS, kube-proxy's ConfigMap (kubeadm's), the proxy.
	if err := os.MkdirAll(l.Manifests(), 0o755); err != nil {
		return err
	}
	addons := map[string]string{
		"coredns.yaml":              CoreDNSManifest(),
		"kube-proxy-configmap.yaml": KubeProxyConfigMap(o.Mode, cp.URL),
		"kube-proxy.yaml":           KubeProxyManifest(),
	}
	for f, m := range addons {
		if err := os.WriteFile(filepath.Join(l.Manifests(), f), []byte(m), 0o644); err != nil {
			return err
		}
	}
	for _, f := range []string{"coredns.yaml", "kube-proxy-configmap.yaml"} {
		if _, err := kubectl(ctx, o.Dir, "", "apply", "-f", filepath.Join(l.Manifests(), f)); err != nil {
			return err
		}
	}
	proxySelector := "k8s-app=" + o.Proxy
	switch o.Proxy {
	case ProxyKubeProxy:
		if _, err := kubectl(ctx, o.Dir, "", "apply", "-f", filepath.Join(l.Manifests(), "kube-proxy.yaml")); err != nil {
			return err
		}
		logf("kube-proxy v1.37.2 (%s) applied as kubeadm's DaemonSet", o.Mode)
	case ProxyKproxy:
		if err := deployKproxy(ctx, o, l, kubectl, archives, logf); err != nil {
			return err
		}
	}
	if o.Proxy == ProxyNone {
		logf("no Service proxy (PROXY=none): ClusterIPs answer once one is installed; CoreDNS is not waited for (it reaches the API server through one)")
	} else {
		if err := waitPodsReady(ctx, cs, "kube-system", proxySelector, 0, 4*time.Minute); err != nil {
			return fmt.Errorf("%s pods Ready: %w", o.Proxy, err)
		}
		logf("%s Ready on every node", o.Proxy)
		if err := waitPodsReady(ctx, cs, "kube-system", "k8s-app=kube-dns", 2, 3*time.Minute); err != nil {
			return fmt.Errorf("CoreDNS Ready: %w", err)
		}
		logf("CoreDNS Ready behind kube-dns (%s)", DNSIP)
	}

	st := &State{
		PID: os.Getpid(), ID: c.ID, Namespaces: map[string]string{}, Cgroup: cg.Name,
		APIServer: cp.URL, Kubeconfig: o.path(KubeconfigFile), Kubectl: bins.cp.Kubectl,
		Proxy: o.Proxy, Mode: o.Mode, Overlay: o.Overlay, Nodes: Nodes,
	}
	for _, h := range c.Hosts() {
		st.Namespaces[h] = c.NS(h).Name
	}
	st.Ready = time.Now()
	if err := WriteState(o.Dir, st); err != nil {
		return err
	}
	logf("ready in %v", time.Since(begin).Round(100*time.Millisecond))
	<-ctx.Done()
	logf("cluster daemon: asked to stop")
	return nil
}

// deployKproxy applies kproxy the way docs/install.md tells a user: a copy
// of deploy/ with the image and mode set in its files, then kubectl apply
// -k of the kubeadm overlay (after saving the cluster's kube-proxy
// ConfigMap into it) or of deploy/ itself (its API server and pod CIDR
// edited in).
func deployKproxy(ctx context.Context, o Options, l Layout, kubectl kubectlFunc, archives []imageArchive, logf func(string, ...any)) error {
	ref := ""
	for _, a := range archives {
		if a.Path == o.KproxyImage {
			ref = a.Ref
		}
	}
	if err := copyDeploy(filepath.Join(o.Root, "deploy"), l.Deploy()); err != nil {
		return err
	}
	if err := configureDeploy(l.Deploy(), ref, o.Mode, !OOMScoreSettable()); err != nil {
		return err
	}
	target := l.Deploy()
	if o.Overlay == "kubeadm" {
		if err := saveKubeProxyConfigMap(ctx, l.Deploy(), o.path(BinDir)); err != nil {
			return err
		}
		target = filepath.Join(l.Deploy(), "overlays", "kubeadm")
	} else if err := configureDefault(l.Deploy()); err != nil {
		return err
	}
	if _, err := kubectl(ctx, o.Dir, "", "apply", "-k", target); err != nil {
		return err
	}
	logf("kproxy (%s, image %s) applied: kubectl apply -k %s", o.Mode, ref, o.show(target))
	return nil
}

// writeKubectl writes <dir>/bin/kubectl: kubectl v1.37.2 in the control
// plane's network namespace, the only place the API server is reachable,
// with the cluster's admin kubeconfig unless KUBECONFIG is set.
func writeKubectl(o Options, kubectl, cpNS string) error {
	script := "#!/bin/sh\n" +
		"# kubectl of make cluster: kubectl " + controlplane.KubernetesVersion + " (built from Go modules) run in the\n" +
		"# cluster's control-plane network namespace, the only place the API server\n" +
		"# is reachable (nsenter: root only). KUBECONFIG defaults to the cluster's.\n" +
		": \"${KUBECONFIG:=" + o.path(KubeconfigFile) + "}\"\n" +
		"export KUBECONFIG\n" +
		"exec nsenter --net=/run/netns/" + cpNS + " -- " + shellQuote(kubectl) + " \"$@\"\n"
	return daemon.WriteAtomic(o.path(BinDir, "kubectl"), []byte(script), 0o755)
}

func nodeNames() string {
	var n []string
	for _, x := range Nodes {
		n = append(n, x.Name)
	}
	return strings.Join(n, ", ")
}

// teardown stops what the daemon started, in the order that leaves nothing
// behind: the processes (netns.Cluster stops the daemons it started; then
// every process left in the cluster's cgroup: containers, shims), the
// control plane, the mounts, the namespaces, the cgroups.
type teardown struct {
	o     Options
	cg    *cgroups
	netns *netns.Cluster
	cp    *controlplane.ControlPlane
	logf  func(string, ...any)
}

func (t *teardown) run() {
	t.logf("stopping: every process of the cluster, the mounts, the namespaces, the cgroups")
	// Everything below the cluster's cgroup but this daemon: the control
	// plane, the kubelets, containerds and their shims, the containers.
	// Nothing of it needs a graceful stop: the cluster is thrown away.
	if n, err := t.cg.killAll(30 * time.Second); err != nil {
		t.logf("killing the cluster's processes: %v", err)
	} else if n > 0 {
		t.logf("killed %d processes of the cluster", n)
	}
	if t.cp != nil {
		if err := t.cp.Stop(); err != nil {
			t.logf("stopping the control plane: %v", err)
		}
	}
	if t.netns != nil {
		if err := t.netns.Close(); err != nil {
			t.logf("removing the namespaces: %v", err)
		}
	}
	if err := unmountUnder(t.o.Dir); err != nil {
		t.logf("unmounting: %v", err)
	}
	// Leave the cluster's cgroup, then remove it.
	for _, root := range t.cg.Roots {
		_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	}
	if err := t.cg.remove(); err != nil {
		t.logf("removing the cgroups: %v", err)
	}
	removeHostDirs(t.o.path("created-host-dirs"))
	t.logf("stopped")
}

// Down stops the daemon of Dir (SIGTERM: it tears the cluster down;
// SIGKILL after two minutes), then removes whatever is left, also after a
// crash: every process in the cluster's cgroup, the mounts under Dir, the
// cluster's network namespaces, its cgroups, the machine's directories it
// created, and Dir. Without a cluster it says so and succeeds.
func Down(ctx context.Context, o Options) (err error) {
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	if _, err := os.Stat(o.Dir); errors.Is(err, os.ErrNotExist) {
		o.say("make cluster-down: no cluster in %s", o.show(o.Dir))
		return nil
	}
	if _, err := os.Stat(o.path(MarkerFile)); err != nil {
		return fmt.Errorf("%s was not made by make cluster (no %s): not removing it", o.Dir, MarkerFile)
	}
	if os.Geteuid() != 0 {
		return errors.New("make cluster-down: run it as root")
	}
	if pid := daemonOf(o.Dir).PID(); pid > 0 {
		o.say("make cluster-down: stopping the cluster daemon (pid %d)", pid)
		if err := daemonOf(o.Dir).Stop(pid, 2*time.Minute); err != nil {
			return err
		}
	}
	var errs []error
	if cg, err := detectCgroups(CgroupName(o.Dir)); err == nil {
		n, err := cg.killAll(time.Minute)
		if n > 0 {
			o.say("make cluster-down: killed %d processes left in cgroup %s", n, cg.Name)
		}
		errs = append(errs, err)
		defer func() {
			if err := cg.remove(); err != nil {
				errs = append(errs, err)
			}
		}()
	}
	errs = append(errs, unmountUnder(o.Dir))
	id, _ := os.ReadFile(o.path(IDFile))
	if s := strings.TrimSpace(string(id)); s != "" {
		removed, err := netns.RemoveCluster(ctx, s)
		errs = append(errs, err)
		if len(removed) > 0 {
			o.say("make cluster-down: deleted %d namespaces the daemon left", len(removed))
		}
	}
	removeHostDirs(o.path("created-host-dirs"))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.RemoveAll(o.Dir); err != nil {
		return err
	}
	o.say("make cluster-down: cluster removed (processes, mounts, namespaces, cgroups and %s)", o.show(o.Dir))
	return nil
}

// Kubectl replaces this process with the kubectl wrapper of Dir.
func Kubectl(o Options, args []string) error {
	var err error
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	w := o.path(BinDir, "kubectl")
	if _, err := os.Stat(w); err != nil {
		return fmt.Errorf("%w in %s (start one with make cluster)", ErrNoCluster, o.Dir)
	}
	return syscall.Exec("/bin/sh", append([]string{"sh", w}, args...), os.Environ())
}

// Shell replaces this process with a shell (or argv) in a node's network
// namespace (make node-shell NODE=...), with the cluster's kubectl in PATH.
func Shell(o Options, host string, argv []string) error {
	var err error
	if o, err = o.withDefaults(); err != nil {
		return err
	}
	st, err := ReadState(o.Dir)
	if err != nil {
		return err
	}
	if host == "" {
		host = Nodes[0].Name
	}
	ns, ok := st.Namespaces[host]
	if !ok {
		return fmt.Errorf("no host %q in the cluster (want one of %s)", host, strings.Join(st.hosts(), ", "))
	}
	if len(argv) == 0 {
		argv = []string{"bash", "-i"}
	}
	env := append(os.Environ(), "KUBECONFIG="+st.Kubeconfig, "PATH="+o.path(BinDir)+":"+os.Getenv("PATH"), "KPROXY_CLUSTER_HOST="+host)
	full := append([]string{"nsenter", "--net=/run/netns/" + ns, "--"}, argv...)
	path, err := exec.LookPath("nsenter")
	if err != nil {
		return err
	}
	return syscall.Exec(path, full, env)
}

// daemonOf names the cluster daemon of state directory dir.
func daemonOf(dir string) daemon.Daemon {
	return daemon.Daemon{Tool: toolName, Dir: dir, PIDFile: filepath.Join(dir, PIDFile),
		LogFile: filepath.Join(dir, LogFile), StateFile: filepath.Join(dir, StateFile)}
}
