package cluster

import (
	"os"
	"path/filepath"
	"slices"
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
