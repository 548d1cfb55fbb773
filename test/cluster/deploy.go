package cluster

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// copyDeploy copies the repository's deploy/ (its manifests and
// kustomizations, not the Go tests) to dst, which is made anew.
func copyDeploy(src, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if strings.HasSuffix(p, ".go") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
}

// imagesLine matches the kproxy image of deploy/images/kustomization.yaml.
var imagesLine = regexp.MustCompile(`(?m)^(- name: kproxy\n  newName: )\S+\n  newTag: \S+$`)

// modeLine matches the mode of deploy/config/linux.yaml.
var modeLine = regexp.MustCompile(`(?m)^mode: \S+$`)

// conntrackEdit is appended to the copy's deploy/config/linux.yaml.
const conntrackEdit = `# make cluster: the nodes are network namespaces of one machine, where
# nf_conntrack_max is the machine's, read-only here: leave it alone.
conntrack:
  maxPerCore: 0
`

// oomEdit is appended too on a machine where no process may lower its
// oom_score_adj (OOMScoreSettable): kproxy --init-only would fail to set
// -999.
const oomEdit = `# make cluster: this machine's processes cannot lower their OOM score
# (no CAP_SYS_RESOURCE): keep kproxy's at zero.
oomScoreAdj: 0
`

// configureDeploy makes the edits docs/install.md asks of a user, in the
// copy: the kproxy image (deploy/images, what "kustomize edit set image"
// writes) and the mode (deploy/config/linux.yaml); and one this cluster
// needs, as kind does for kube-proxy: conntrack.maxPerCore 0, because its
// nodes are network namespaces of one machine, where nf_conntrack_max is
// the machine's and read-only (kproxy --init-only, like upstream's, fails
// when it cannot set it). With oomZero, oomScoreAdj 0 (oomEdit).
func configureDeploy(dir, imageRef, mode string, oomZero bool) error {
	i := strings.LastIndex(imageRef, ":")
	if i <= 0 || strings.Contains(imageRef[i:], "/") {
		return fmt.Errorf("image %q has no tag", imageRef)
	}
	name, tag := imageRef[:i], imageRef[i+1:]
	imgFile := filepath.Join(dir, "images", "kustomization.yaml")
	data, err := os.ReadFile(imgFile)
	if err != nil {
		return err
	}
	if !imagesLine.Match(data) {
		return fmt.Errorf("%s: no kproxy image entry (name, newName, newTag) to set", imgFile)
	}
	data = imagesLine.ReplaceAll(data, []byte("${1}"+name+"\n  newTag: "+tag))
	if err := os.WriteFile(imgFile, data, 0o644); err != nil {
		return err
	}
	cfgFile := filepath.Join(dir, "config", "linux.yaml")
	if data, err = os.ReadFile(cfgFile); err != nil {
		return err
	}
	if !modeLine.Match(data) {
		return fmt.Errorf("%s: no mode line to set", cfgFile)
	}
	data = modeLine.ReplaceAll(data, []byte("mode: "+mode))
	data = append(data, []byte(conntrackEdit)...)
	if oomZero {
		data = append(data, []byte(oomEdit)...)
	}
	return os.WriteFile(cfgFile, data, 0o644)
}

// configureDefault sets the API server and the pod CIDR in deploy/config,
// the two edits docs/install.md asks for outside kubeadm.
func configureDefault(dir string) error {
	edits := []struct{ file, from, to string }{
		{filepath.Join(dir, "config", "kubeconfig.conf"), `"https://control-plane.invalid:6443"`, `"https://` + ControlPlaneIP.String() + `:6443"`},
		{filepath.Join(dir, "config", "linux.yaml"), `clusterCIDR: "10.244.0.0/16"`, `clusterCIDR: "` + ClusterCIDR.String() + `"`},
	}
	for _, e := range edits {
		data, err := os.ReadFile(e.file)
		if err != nil {
			return err
		}
		if !bytes.Contains(data, []byte(e.from)) {
			return fmt.Errorf("%s: %s not found to edit", e.file, e.from)
		}
		if err := os.WriteFile(e.file, bytes.Replace(data, []byte(e.from), []byte(e.to), 1), 0o644); err != nil {
			return err
		}
	}
	return nil
}
