package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/netns"
)

// hostDirs are the machine's directories each node's mount namespace
// mounts its own over: libcni's cache (not configurable in containerd),
// the shims' sockets (a fixed path), and the kubelet's fixed paths (see
// NodePaths.VarLibKubelet). They must exist to be mounted on; make
// cluster creates them when missing and Down removes them if still empty.
var hostDirs = map[string]func(NodePaths) string{
	"/var/lib/cni":        func(p NodePaths) string { return p.CNICache },
	"/run/containerd":     func(p NodePaths) string { return p.RunContainerd },
	"/var/lib/kubelet":    func(p NodePaths) string { return p.VarLibKubelet },
	"/var/log/containers": func(p NodePaths) string { return p.VarLogContainers },
}

// hostPathDirs are the machine's directories the proxies' DaemonSets mount
// as hostPath volumes without a type (so the kubelet does not create
// them, and runc fails to mount a missing one): /lib/modules, for
// modprobe, is absent on machines whose kernel has no modules. make
// cluster creates them, empty, when missing, and Down removes them if
// still empty.
var hostPathDirs = []string{"/lib/modules"}

// createdDirs are the directories ensureHostDirs may create.
func createdDirs() []string {
	out := append([]string{}, hostPathDirs...)
	for h := range hostDirs {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// prepareNode writes a node's files: containerd's and the kubelet's
// configuration, the CNI network, the sysctl files, resolv.conf.
func prepareNode(l Layout, n Node, cg *cgroups, caFile string, kubeconfig []byte) error {
	p := l.Node(n.Name)
	for _, d := range []string{p.Dir, filepath.Dir(p.ContainerdConfig), p.ContainerdRoot, p.ContainerdState, p.RuncRoot, p.KubeletRoot,
		p.PodLogs, p.CNIConfDir, p.CNIState, p.CNICache, p.RunContainerd, p.VarLibKubelet, p.VarLogContainers, p.Sysctl} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{
		p.ContainerdConfig: ContainerdConfig(p, !OOMScoreSettable()),
		filepath.Join(p.CNIConfDir, "10-bridge.conflist"): CNIConfig(n, p),
		p.KubeletConfig:     KubeletConfig(n, p, "/"+cg.Name+"/"+n.Name, caFile),
		p.ResolvConf:        ResolvConf("192.168.50.254"),
		p.KubeletKubeconfig: string(kubeconfig),
	}
	for k, v := range KernelTunables {
		files[filepath.Join(p.Sysctl, strings.ReplaceAll(k, "/", "."))] = v + "\n"
	}
	for path, data := range files {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// createMountNS makes a node's mount namespace, a private copy of the
// machine's, bound to p.MountNS: its containerd, kubelet and containers
// share it, so the kubelet's volume mounts are the runtime's, and every
// mount made there disappears with it. Inside it: the sysctl files over the
// host-wide tunables (KernelTunables), the node's own /var/lib/cni and
// /run/containerd, and no /run/netns (so the namespace does not keep the
// machine's named network namespaces alive).
func createMountNS(ctx context.Context, p NodePaths) error {
	// unshare binds the namespace to a file that must sit on a private
	// mount: bind the node's directory onto itself, privately.
	if err := run(ctx, "mount", "--bind", p.Dir, p.Dir); err != nil {
		return err
	}
	if err := run(ctx, "mount", "--make-private", p.Dir); err != nil {
		return err
	}
	if err := os.WriteFile(p.MountNS, nil, 0o600); err != nil {
		return err
	}
	if err := run(ctx, "unshare", "--mount="+p.MountNS, "--propagation", "private", "true"); err != nil {
		return err
	}
	var script []string
	keys := make([]string, 0, len(KernelTunables))
	for k := range KernelTunables {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		script = append(script, fmt.Sprintf("mount --bind %s /proc/sys/%s", shellQuote(filepath.Join(p.Sysctl, strings.ReplaceAll(k, "/", "."))), k))
	}
	hosts := make([]string, 0, len(hostDirs))
	for h := range hostDirs {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		script = append(script, fmt.Sprintf("mount --bind %s %s", shellQuote(hostDirs[h](p)), h))
	}
	// Each named network namespace is a mount below /run/netns (and
	// /run/netns itself may be one).
	script = append(script,
		`awk '$5 ~ "^/run/netns/" {print $5}' /proc/self/mountinfo | while read -r m; do umount -l "$m"; done`,
		"if mountpoint -q /run/netns; then umount -l /run/netns; fi")
	return run(ctx, "nsenter", "--mount="+p.MountNS, "--", "sh", "-ec", strings.Join(script, "\n"))
}

// ensureHostDirs creates the machine's mount points of hostDirs that are
// missing, and records them in created (Down removes them when empty).
func ensureHostDirs(created string) error {
	var made []string
	for _, h := range createdDirs() {
		if _, err := os.Stat(h); errors.Is(err, fs.ErrNotExist) {
			if err := os.MkdirAll(h, 0o755); err != nil {
				return err
			}
			made = append(made, h)
		}
	}
	if len(made) == 0 {
		return nil
	}
	f, err := os.OpenFile(created, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = f.WriteString(strings.Join(made, "\n") + "\n")
	return err
}

// removeHostDirs removes the directories ensureHostDirs created, if empty.
func removeHostDirs(created string) {
	data, err := os.ReadFile(created)
	if err != nil {
		return
	}
	known := createdDirs()
	for _, d := range strings.Fields(string(data)) {
		if slices.Contains(known, d) {
			_ = syscall.Rmdir(d)
		}
	}
}

// unmountUnder detaches every mount of this (the machine's) mount namespace
// at or below dir, deepest first: the nodes' mount-namespace files and the
// private binds of their directories.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	_ = f.Close()
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// OOMScoreSettable reports whether this process may lower an
// oom_score_adj below zero, which needs CAP_SYS_RESOURCE in its bounding
// set. Some sandboxed machines (this project's development VMs) drop it:
// runc then cannot give a pod the score the kubelet asks for, nor kproxy
// itself the score it is configured with, unless both are kept at zero.
func OOMScoreSettable() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err != nil || v&(1<<capSysResource) != 0
		}
	}
	return true
}

// capSysResource is CAP_SYS_RESOURCE's bit.
const capSysResource = 24

// startNode starts a node's containerd, imports the images into it and
// starts its kubelet, each in the node's network and mount namespaces.
func startNode(ctx context.Context, c *netns.Cluster, l Layout, n Node, bins binaries, archives []imageArchive, logf func(string, ...any)) error {
	p := l.Node(n.Name)
	env := "PATH=" + filepath.Dir(bins.containerdShim) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cd, err := c.StartShared(n.Name, "containerd-"+n.Name, p.ContainerdLog, p.MountNS,
		"env", env, bins.containerd, "--config", p.ContainerdConfig)
	if err != nil {
		return err
	}
	if err := waitSocket(ctx, p.ContainerdSocket, cd, time.Minute); err != nil {
		return fmt.Errorf("containerd of %s: %w (log: %s)", n.Name, err, p.ContainerdLog)
	}
	begin := time.Now()
	for _, a := range archives {
		if err := run(ctx, bins.ctr, "--address", p.ContainerdSocket, "-n", "k8s.io", "images", "import", a.Path); err != nil {
			return fmt.Errorf("importing %s into %s: %w", a.Path, n.Name, err)
		}
		for _, tag := range a.Tags {
			if err := run(ctx, bins.ctr, "--address", p.ContainerdSocket, "-n", "k8s.io", "images", "tag", "--force", a.Ref, tag); err != nil {
				return fmt.Errorf("tagging %s as %s in %s: %w", a.Ref, tag, n.Name, err)
			}
		}
	}
	logf("%s: containerd up, %d images imported in %v", n.Name, len(archives), time.Since(begin).Round(100*time.Millisecond))
	if _, err := c.StartShared(n.Name, "kubelet-"+n.Name, p.KubeletLog, p.MountNS, append([]string{bins.kubelet}, KubeletArgs(n, p)...)...); err != nil {
		return err
	}
	return nil
}

// imageArchive is an OCI archive to import and the tags to add to it.
type imageArchive struct {
	Path string
	Ref  string
	Tags []string
}

// waitSocket waits until a unix socket accepts connections.
func waitSocket(ctx context.Context, path string, p *netns.Process, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		if conn, err := net.Dial("unix", path); err == nil {
			_ = conn.Close()
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("exited: %v\n%s", p.Err(), lastLines(p.Output(), 20))
		case <-ctx.Done():
			return fmt.Errorf("%s not accepting connections within %v", path, limit)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// run runs a short command and returns its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
