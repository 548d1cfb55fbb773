package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/hack/image/oci"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// ImageEnv names the OCI archive TestImage runs (make test-image sets it to
// make images' output). Unset, the test runs make images itself.
const ImageEnv = "KPROXY_IMAGE"

// imageCases are the behaviour-table cases TestImage runs through the image.
var imageCases = map[string]bool{"clusterip": true, "nodeport": true, "no-endpoints": true}

// TestImage runs the Linux image make images builds, as the DaemonSet runs
// it, with runc inside node1's network namespace: an init container
// (kproxy --init-only, privileged: the conntrack sysctls and route_localnet)
// then the kproxy container with the capabilities NET_ADMIN and NET_RAW
// only, no_new_privs, /proc/sys read-only, the host's /run/xtables.lock and
// /lib/modules (read-only) mounted, and the manifests directory mounted
// where kproxy reads it. The container's rootfs is only the image's: kproxy
// is the image's binary (checked by inode) and every iptables or nft it
// runs is the image's. Then the ClusterIP, NodePort and no-endpoints rows of
// the behaviour table, with real traffic, in the test's flavour and mode
// (make test-image: iptables-nft, iptables-legacy, nftables).
func TestImage(t *testing.T) {
	requireKernel(t)
	runc, err := exec.LookPath("runc")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: the image test needs runc (apt-get install runc): %v", err)
		}
		t.Skipf("the image test needs runc (apt-get install runc): %v", err)
	}
	begin := time.Now()
	archive := imageArchive(t)
	rootfs, cfg, man := unpackImage(t, archive)
	t.Logf("image %s (%s) unpacked in %v", archive, man.Digest, time.Since(begin).Round(time.Millisecond))
	checked := time.Now()
	checkWithSkopeo(t, archive, man)
	t.Logf("skopeo check: %v", time.Since(checked).Round(time.Millisecond))
	if strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/kproxy" {
		t.Fatalf("the image's entrypoint is %q", cfg.Config.Entrypoint)
	}

	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	def := proxytest.DefaultConfig()
	var objects []any
	for _, c := range tb.CasesFor(def) {
		if imageCases[c.Name] {
			objects = append(objects, proxytest.ObjectList(nil, c.Services, c.Slices)...)
		}
	}
	var rows []proxytest.Row
	for _, r := range tb.RowsFor(def) {
		if imageCases[r.Case.Name] {
			rows = append(rows, r)
		}
	}
	if len(rows) < 10 {
		t.Fatalf("only %d rows of %v", len(rows), imageCases)
	}

	rc := &runcLauncher{t: t, runc: runc, root: t.TempDir(), rootfs: rootfs, env: cfg.Config.Env}
	e := newEnv(t, envOptions{config: def, objects: objects, before: func(e *env) {
		rc.netns = e.c.NS(proxytest.Node1).Path
		rc.manifests = e.dir
		e.p.Launch = rc.launch
		t.Cleanup(rc.cleanup)
	}})
	t.Logf("kproxy programmed node1 from the image in %v", time.Since(begin).Round(time.Millisecond))

	// The process is the image's kproxy, not the harness's build.
	pid := rc.pid(e.ctx(10 * time.Second))
	var exe, img syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/exe", pid), &exe); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(rootfs, "usr/local/bin/kproxy"), &img); err != nil {
		t.Fatal(err)
	}
	if exe.Dev != img.Dev || exe.Ino != img.Ino {
		t.Errorf("the container's process %d does not run the image's /usr/local/bin/kproxy", pid)
	}
	// The image's own tools, inside the container, see kproxy's rules.
	if nftMode() {
		out := rc.exec(e.ctx(20*time.Second), "nft", "list", "chain", "ip", "kproxy", "services")
		if !strings.Contains(out, "vmap @frontends") {
			t.Errorf("the image's nft does not show kproxy's services chain:\n%s", out)
		}
	} else {
		out := rc.exec(e.ctx(20*time.Second), "iptables-"+flavour()+"-save", "-t", "nat")
		if !strings.Contains(out, ":KPROXY-SERVICES") {
			t.Errorf("the image's iptables-%s-save shows no KPROXY chain:\n%s", flavour(), LastLines(out, 20))
		}
	}

	start := time.Now()
	results := e.c.RunRows(e.ctx(90*time.Second), rows, netns.RowOptions{})
	t.Logf("%d rows in %v", len(rows), time.Since(start).Round(time.Millisecond))
	for _, res := range results {
		t.Run(res.Row.Name, func(t *testing.T) {
			if res.Err != nil {
				t.Errorf("%s\n  semantic: %s", res.Err, res.Row.Case.Semantic)
			}
		})
	}
	if err := e.p.Stop(10 * time.Second); err != nil {
		t.Errorf("stopping the kproxy container: %v", err)
	}
}

// imageArchive returns $KPROXY_IMAGE, or builds the image with make images.
func imageArchive(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(ImageEnv); p != "" {
		return p
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "make", "-C", repo, "--no-print-directory", "images").CombinedOutput()
	if err != nil {
		t.Fatalf("make images: %v\n%s", err, out)
	}
	t.Logf("make images:\n%s", LastLines(string(out), 2))
	return filepath.Join(repo, ".build", "images", "kproxy-linux-amd64.oci.tar")
}

// unpackImage reads the archive (every digest checked) and unpacks its
// layers into a fresh root filesystem.
func unpackImage(t *testing.T, archive string) (string, oci.Config, oci.Descriptor) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	man, cfg, layers, err := oci.ReadArchive(f)
	if err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		if err := oci.ExtractLayer(l, cfg.RootFS.DiffIDs[i], rootfs); err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
	}
	return rootfs, cfg, man
}

// checkWithSkopeo has a reader other than this repository's own read the
// archive: skopeo must find the image by its tag (the ref.name annotation)
// and report the manifest's digest. skopeo is optional outside CI.
func checkWithSkopeo(t *testing.T, archive string, man oci.Descriptor) {
	t.Helper()
	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: the image test needs skopeo (apt-get install skopeo): %v", err)
		}
		t.Logf("no skopeo (apt-get install skopeo): the archive is read by hack/image/oci only")
		return
	}
	ref := man.Annotations[oci.AnnotationRefName]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, skopeo, "inspect", "oci-archive:"+archive+":"+ref).Output()
	if err != nil {
		t.Fatalf("skopeo inspect oci-archive:%s:%s: %v", archive, ref, err)
	}
	var got struct{ Digest string }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("skopeo inspect: %v\n%s", err, out)
	}
	if got.Digest != man.Digest {
		t.Errorf("skopeo reads digest %s, the index says %s", got.Digest, man.Digest)
	}
}

// runcLauncher starts kproxy's runs as runc containers of the image in
// node1's network namespace, each after an init container, as the
// DaemonSet's pod does.
type runcLauncher struct {
	t                *testing.T
	runc, root       string
	rootfs           string
	env              []string
	netns, manifests string
	runs             int
	id               string
	ids              []string
}

func (r *runcLauncher) cmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, r.runc, append([]string{"--root", r.root}, args...)...)
}

func (r *runcLauncher) launch(args []string) ([]string, error) {
	r.runs++
	base := fmt.Sprintf("kpt-%d-%d", os.Getpid(), r.runs)
	// The init container: privileged as the DaemonSet's (but modprobe,
	// which would load modules into the machine's kernel), to completion.
	initID := base + "-init"
	initArgs := []string{"/usr/local/bin/kproxy", "--init-only"}
	if !haveSysResource() {
		// Lowering the OOM score (to -999) needs CAP_SYS_RESOURCE, which
		// the kubelet's privileged init container has and this machine's
		// root does not: keep the score at 0 instead.
		if r.runs == 1 {
			r.t.Logf("this machine's root has no CAP_SYS_RESOURCE: the init container runs with --oom-score-adj=0")
		}
		initArgs = append(initArgs, "--oom-score-adj=0")
	}
	initBundle, err := r.bundle(initID, append(initArgs, args...), true)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.ids = append(r.ids, initID)
	if out, err := r.cmd(ctx, "run", "--bundle", initBundle, initID).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("init container (kproxy --init-only): %w\n%s", err, out)
	}
	r.id = base
	r.ids = append(r.ids, base)
	bundle, err := r.bundle(base, append([]string{"/usr/local/bin/kproxy"}, args...), false)
	if err != nil {
		return nil, err
	}
	// The harness starts the command with "ip netns exec", which mounts a
	// sysfs of node1's namespace over /sys in a mount namespace of its own,
	// hiding the cgroup mounts runc needs: runc runs back in this test's
	// mount namespace (the network namespace is config.json's anyway).
	return []string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", os.Getpid()), "--",
		r.runc, "--root", r.root, "run", "--bundle", bundle, base}, nil
}

// bundle writes a runc bundle (config.json) for one container of the image.
func (r *runcLauncher) bundle(id string, args []string, privileged bool) (string, error) {
	dir := filepath.Join(r.root, "bundles", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	caps := []string{"CAP_NET_ADMIN", "CAP_NET_RAW"}
	readonly := []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"}
	if privileged {
		caps = append(caps, "CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE")
		if haveSysResource() {
			caps = append(caps, "CAP_SYS_RESOURCE")
		}
		readonly = nil
	}
	bind := func(src, dst string, ro bool) map[string]any {
		opts := []string{"rbind", "nosuid", "nodev"}
		if ro {
			opts = append(opts, "ro")
		}
		return map[string]any{"destination": dst, "type": "bind", "source": src, "options": opts}
	}
	// The DaemonSet's hostPath /run/xtables.lock is FileOrCreate.
	lock := "/run/xtables.lock"
	if f, err := os.OpenFile(lock, os.O_CREATE|os.O_RDONLY, 0o600); err == nil {
		_ = f.Close()
	} else {
		return "", err
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"root":       map[string]any{"path": r.rootfs, "readonly": false},
		"hostname":   proxytest.Node1,
		"process": map[string]any{
			"terminal":        false,
			"user":            map[string]any{"uid": 0, "gid": 0},
			"args":            args,
			"env":             r.env,
			"cwd":             "/",
			"noNewPrivileges": !privileged,
			"capabilities": map[string]any{
				"bounding": caps, "effective": caps, "permitted": caps,
			},
		},
		"mounts": []any{
			map[string]any{"destination": "/proc", "type": "proc", "source": "proc"},
			map[string]any{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			map[string]any{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777"}},
			bind(lock, lock, false),
			bind(r.manifests, r.manifests, true),
		},
		"linux": map[string]any{
			"namespaces": []any{
				map[string]any{"type": "pid"},
				map[string]any{"type": "ipc"},
				map[string]any{"type": "uts"},
				map[string]any{"type": "mount"},
				map[string]any{"type": "network", "path": r.netns},
			},
			"maskedPaths":   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			"readonlyPaths": readonly,
		},
	}
	// /lib/modules, when the machine has it (a container or VM without
	// modules of its own may not: then nothing is mounted there).
	if _, err := os.Stat("/lib/modules"); err == nil {
		spec["mounts"] = append(spec["mounts"].([]any), bind("/lib/modules", "/lib/modules", true))
	} else if r.runs == 1 && !privileged {
		r.t.Logf("this machine has no /lib/modules: not mounted (%v)", err)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
}

// haveSysResource reports whether CAP_SYS_RESOURCE (24) is in this
// process's bounding set, hence grantable to a container.
func haveSysResource() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<24) != 0
		}
	}
	return false
}

// pid returns the host PID of the running kproxy container's process.
func (r *runcLauncher) pid(ctx context.Context) int {
	r.t.Helper()
	var last string
	for ctx.Err() == nil {
		out, err := r.cmd(ctx, "state", r.id).Output()
		var st struct {
			Status string `json:"status"`
			Pid    int    `json:"pid"`
		}
		if err == nil && json.Unmarshal(out, &st) == nil && st.Status == "running" && st.Pid > 0 {
			return st.Pid
		}
		last = fmt.Sprintf("%s %v", out, err)
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Fatalf("runc state %s: %s", r.id, last)
	return 0
}

// exec runs a command of the image inside the running kproxy container.
func (r *runcLauncher) exec(ctx context.Context, argv ...string) string {
	r.t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := r.cmd(ctx, append([]string{"exec", r.id}, argv...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		r.t.Fatalf("runc exec %s %v: %v\n%s", r.id, argv, err, stderr.String())
	}
	return stdout.String()
}

// cleanup removes every container of the test, running or not.
func (r *runcLauncher) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, id := range r.ids {
		if out, err := r.cmd(ctx, "delete", "--force", id).CombinedOutput(); err != nil && !strings.Contains(string(out), "does not exist") {
			r.t.Errorf("runc delete %s: %v\n%s", id, err, out)
		}
	}
	if out, err := r.cmd(ctx, "list", "-q").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		r.t.Errorf("containers left: %s", out)
	}
}
