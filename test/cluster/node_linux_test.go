package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
)

// TestHostPathDirsCreated: every hostPath volume without a type in the
// proxies' DaemonSets (deploy/linux and kubeadm's kube-proxy) is a
// directory make cluster creates when the machine lacks it: the kubelet
// creates none of those, and runc cannot bind-mount a missing source
// (this machine's kernel has no modules and no /lib/modules).
func TestHostPathDirsCreated(t *testing.T) {
	ds, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "linux", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, m := range []string{string(ds), KubeProxyManifest()} {
		for _, o := range strict(t, m) {
			d, ok := o.(*appsv1.DaemonSet)
			if !ok {
				continue
			}
			for _, vol := range d.Spec.Template.Spec.Volumes {
				hp := vol.HostPath
				if hp == nil || (hp.Type != nil && *hp.Type != v1.HostPathUnset) {
					continue
				}
				checked++
				if !slices.Contains(createdDirs(), hp.Path) {
					t.Errorf("DaemonSet %s: hostPath %s (no type) is not in createdDirs %v", d.Name, hp.Path, createdDirs())
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no hostPath volume without a type found: the test checks nothing")
	}
}

// TestParseCgroupMounts: on a hybrid host the unified hierarchy is one of
// the roots make cluster creates and removes (runc makes each container's
// cgroup there too: make cluster-down left kproxy-cluster-* in
// /sys/fs/cgroup/unified), the pids hierarchy finds the processes; on a
// v2 host the unified hierarchy is everything.
func TestParseCgroupMounts(t *testing.T) {
	hybrid := `25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
28 25 0:25 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
29 25 0:26 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
`
	cg, err := parseCgroupMounts(strings.NewReader(hybrid), "x")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"}
	if !slices.Equal(cg.Roots, want) || cg.Kill != "/sys/fs/cgroup/pids" || cg.V2 {
		t.Errorf("hybrid: %+v, want roots %v, kill in /sys/fs/cgroup/pids, v1", cg, want)
	}
	v2 := "26 25 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
	if cg, err = parseCgroupMounts(strings.NewReader(v2), "x"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cg.Roots, []string{"/sys/fs/cgroup"}) || cg.Kill != "/sys/fs/cgroup" || !cg.V2 {
		t.Errorf("v2: %+v", cg)
	}
	if _, err := parseCgroupMounts(strings.NewReader("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), "x"); err == nil {
		t.Error("no cgroup mounted: no error")
	}
}

// TestInstallSelfIsTheClusterTool: the daemon Up starts is kproxy-cluster,
// whoever calls Up: make conformance's kproxy-conformance once copied
// itself there, and the "daemon" exited on kproxy-cluster's flags.
func TestInstallSelfIsTheClusterTool(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: filepath.Join(dir, "state")}
	if err := os.MkdirAll(o.path(BinDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := installSelf(o); err == nil {
		t.Errorf("installSelf from the test binary installed %s, want an error", got)
	}
	other := filepath.Join(dir, "kproxy-conformance")
	if err := os.WriteFile(other, []byte("other"), 0o755); err != nil {
		t.Fatal(err)
	}
	o.Tool = other
	if got, err := installSelf(o); err == nil {
		t.Errorf("installSelf with Tool %s installed %s, want an error", other, got)
	}
	tool := filepath.Join(dir, "bin", "kproxy-cluster")
	if err := os.MkdirAll(filepath.Dir(tool), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tool, []byte("the tool"), 0o755); err != nil {
		t.Fatal(err)
	}
	o.Tool = tool
	got, err := installSelf(o)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(got); err != nil || string(data) != "the tool" || filepath.Base(got) != "kproxy-cluster" {
		t.Errorf("installed %s: %q, %v", got, data, err)
	}
}
