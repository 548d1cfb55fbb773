package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/pkg/config"
)

const (
	// kubeadmOverlay is the kubeadm overlay, kubeadmCleanup its rollback.
	kubeadmOverlay = "overlays/kubeadm"
	kubeadmCleanup = "overlays/kubeadm/cleanup"
	// kubeadmValuesDir is the component that reads the operator's copies of
	// the kube-proxy ConfigMap.
	kubeadmValuesDir = "overlays/kubeadm/kube-proxy"
	// kubeadmSaveMarker precedes the commands of docs/install.md that save
	// the kube-proxy ConfigMap for the overlay.
	kubeadmSaveMarker = "<!-- kubeadm overlay: save -->\n```sh\n"
)

// kubeadmCopies are the files those commands write into kubeadmValuesDir.
var kubeadmCopies = map[string]bool{"config.yaml": true, "kubeconfig.yaml": true}

// kubeadmKubeconfig is the kubeconfig.conf of kubeadm's kube-proxy
// ConfigMap (cmd/kubeadm/app/phases/addons/proxy/manifests.go) for a
// control plane endpoint, as kubectl's jsonpath prints it (no final newline).
const kubeadmKubeconfig = `apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    server: https://cp.example.test:6443
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token`

// fakeKubectl answers the two reads of the kube-proxy ConfigMap the
// commands make, from the files $FAKE_CONFIG and $FAKE_KUBECONFIG, as
// kubectl's jsonpath prints a value (no final newline); anything else fails.
const fakeKubectl = `#!/bin/sh
case "$*" in
"-n kube-system get configmap kube-proxy -o jsonpath={.data.config\.conf}") printf '%s' "$(cat "$FAKE_CONFIG")" ;;
"-n kube-system get configmap kube-proxy -o jsonpath={.data.kubeconfig\.conf}") printf '%s' "$(cat "$FAKE_KUBECONFIG")" ;;
*) echo "fake kubectl: unexpected arguments: $*" >&2; exit 1 ;;
esac
`

// TestKubeadmOverlay runs the commands of docs/install.md that save a
// kubeadm cluster's kube-proxy ConfigMap (against a fake kubectl serving
// kubeadm's generated kubeconfig.conf and config.conf, the latter with a
// dual-stack clusterCIDR and, in one case, a network name), in a copy of
// deploy/, then renders deploy/overlays/kubeadm and its cleanup with the
// kustomize library and checks that:
//   - the output is deploy/'s (deploy/cleanup's), line for line, but for
//     the API server in the kubeconfig, clusterCIDR in both OSes'
//     configurations, winkernel.networkName and the ConfigMap's hashed
//     name; the saved copies are not in it;
//   - kproxy, started as each DaemonSet starts it, reads those values;
//   - the files the commands write are the component's resources and are
//     what its .gitignore lists.
func TestKubeadmOverlay(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run the documented commands with")
	}
	doc := readDoc(t, installDoc)
	_, rest, ok := strings.Cut(doc, kubeadmSaveMarker)
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("%s: no sh block after %q", installDoc, strings.TrimSpace(kubeadmSaveMarker))
	}
	kubeadm := readDoc(t, kubeadmConfig)
	const kubeadmCIDR, cidr = "clusterCIDR: 10.244.0.0/16\n", "10.100.0.0/16,fd00:100::/56"
	if strings.Count(kubeadm, kubeadmCIDR) != 1 || strings.Count(kubeadm, "  networkName: \"\"\n") != 1 {
		t.Fatalf("%s: not kubeadm's clusterCIDR and winkernel.networkName lines", kubeadmConfig)
	}
	kubeadm = strings.Replace(kubeadm, kubeadmCIDR, "clusterCIDR: "+cidr+"\n", 1)

	for _, network := range []string{"", "Calico"} {
		t.Run("network="+network, func(t *testing.T) {
			conf := strings.TrimSuffix(kubeadm, "\n")
			if network != "" {
				conf = strings.Replace(conf, "  networkName: \"\"\n", "  networkName: "+network+"\n", 1)
			}
			root := t.TempDir()
			copyDeploy(t, filepath.Join(root, "deploy"))
			bin := filepath.Join(root, "bin")
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			files := map[string]string{
				filepath.Join(bin, "kubectl"):      fakeKubectl,
				filepath.Join(root, "config.conf"): conf,
				filepath.Join(root, "kubeconfig"):  kubeadmKubeconfig,
			}
			for path, data := range files {
				if err := os.WriteFile(path, []byte(data), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			before := dirFiles(t, filepath.Join(root, "deploy", kubeadmValuesDir))
			cmd := exec.Command(sh, "-euc", block)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
				"FAKE_CONFIG="+filepath.Join(root, "config.conf"), "FAKE_KUBECONFIG="+filepath.Join(root, "kubeconfig"))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("the documented commands failed: %v\n%s\n%s", err, block, out)
			}
			var written []string
			for _, f := range dirFiles(t, filepath.Join(root, "deploy", kubeadmValuesDir)) {
				if !slicesContains(before, f) {
					written = append(written, f)
				}
			}
			checkKubeadmCopies(t, written)

			deploy := filepath.Join(root, "deploy")
			wantDiff := map[string]string{
				`server: "https://control-plane.invalid:6443"`: `server: "https://cp.example.test:6443"`,
				`clusterCIDR: "10.244.0.0/16"`:                 `clusterCIDR: "` + cidr + `"`,
				`networkName: ""`:                              `networkName: "` + network + `"`,
			}
			compareRenders(t, deploy, ".", kubeadmOverlay, wantDiff)
			compareRenders(t, deploy, "cleanup", kubeadmCleanup, wantDiff)

			r := renderDir(t, filepath.Join(deploy, kubeadmOverlay))
			lin := startOptions(t, r, r.daemonSet(t, linuxDaemonSet))
			win := startOptions(t, r, r.daemonSet(t, windowsDaemonSet))
			for _, o := range []*config.Options{lin, win} {
				if got := o.Config.ClusterCIDR; got != cidr {
					t.Errorf("mode %s: clusterCIDR %q, want %q (kube-proxy's)", o.ProxyMode(), got, cidr)
				}
			}
			if got := win.Winkernel().NetworkName; got != network {
				t.Errorf("kproxy-windows: network %q, want %q (kube-proxy's)", got, network)
			}
			for _, cm := range r.configMaps {
				kc, err := clientcmd.Load([]byte(cm.Data[kubeconfigName]))
				if err != nil {
					t.Fatalf("the rendered %s: %v", kubeconfigName, err)
				}
				ctx := kc.Contexts[kc.CurrentContext]
				if ctx == nil || kc.Clusters[ctx.Cluster] == nil || kc.Clusters[ctx.Cluster].Server != "https://cp.example.test:6443" {
					t.Errorf("the rendered %s does not name kube-proxy's API server:\n%s", kubeconfigName, cm.Data[kubeconfigName])
				}
			}
			cleanup := renderDir(t, filepath.Join(deploy, kubeadmCleanup))
			ds := cleanup.daemonSet(t, "kproxy-cleanup-windows")
			if got := containerOptions(t, cleanup, ds, &ds.Spec.Template.Spec.InitContainers[0]).Winkernel().NetworkName; got != network {
				t.Errorf("kproxy-cleanup-windows: network %q, want %q (as kproxy-windows)", got, network)
			}

			if kubectl, err := exec.LookPath("kubectl"); err == nil {
				// The machine's kubectl (not the fake) renders it the same.
				for _, dir := range []string{kubeadmOverlay, kubeadmCleanup} {
					out, err := exec.Command(kubectl, "kustomize", filepath.Join(deploy, dir)).Output()
					if err != nil {
						t.Fatalf("kubectl kustomize %s: %v", dir, err)
					}
					got, err := decodeAll(out)
					if err != nil {
						t.Fatalf("kubectl kustomize %s: %v", dir, err)
					}
					_, want := render(t, filepath.Join(deploy, dir))
					if !reflect.DeepEqual(sortObjects(got), sortObjects(want)) {
						t.Errorf("kubectl kustomize %s differs from the kustomize library's rendering:\n%s", dir, out)
					}
				}
			}
		})
	}
}

// checkKubeadmCopies: the files the documented commands wrote are exactly
// the component's resources, and its .gitignore lists exactly them (they
// are cluster data).
func checkKubeadmCopies(t *testing.T, written []string) {
	t.Helper()
	var want []string
	for f := range kubeadmCopies {
		want = append(want, f)
	}
	sort.Strings(want)
	sort.Strings(written)
	if !reflect.DeepEqual(written, want) {
		t.Errorf("the documented commands wrote %v into %s, want %v", written, kubeadmValuesDir, want)
	}
	res := kustomizationResources(t, filepath.Join(kubeadmValuesDir, "kustomization.yaml"))
	sort.Strings(res)
	if !reflect.DeepEqual(res, want) {
		t.Errorf("%s reads %v, want the saved copies %v", kubeadmValuesDir, res, want)
	}
	var ignored []string
	for _, l := range strings.Split(readDoc(t, filepath.Join(kubeadmValuesDir, ".gitignore")), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			ignored = append(ignored, strings.TrimPrefix(l, "/"))
		}
	}
	sort.Strings(ignored)
	if !reflect.DeepEqual(ignored, want) {
		t.Errorf("%s/.gitignore lists %v, want the saved copies %v", kubeadmValuesDir, ignored, want)
	}
}

// compareRenders renders base and overlay (directories under deploy) and
// checks that their YAML differs only in lines of base that wantDiff maps
// to the overlay's line (after indentation), and in the ConfigMap's hashed
// name; each line of wantDiff must differ at least once, unless it maps to
// itself.
func compareRenders(t *testing.T, deploy, base, overlay string, wantDiff map[string]string) {
	t.Helper()
	b, _ := render(t, filepath.Join(deploy, base))
	o, _ := render(t, filepath.Join(deploy, overlay))
	bl, ol := strings.Split(string(b), "\n"), strings.Split(string(o), "\n")
	if len(bl) != len(ol) {
		t.Fatalf("%s renders %d lines, %s %d: more than values differ\n%s", overlay, len(ol), base, len(bl), o)
	}
	hashed := func(l string) bool {
		return strings.Contains(l, "name: kproxy-") && !strings.Contains(l, "kproxy-windows") && !strings.HasSuffix(l, "kproxy-cleanup-windows")
	}
	seen := map[string]bool{}
	for i := range bl {
		if bl[i] == ol[i] {
			continue
		}
		bt, ot := strings.TrimSpace(bl[i]), strings.TrimSpace(ol[i])
		if want, ok := wantDiff[bt]; ok && ot == want {
			seen[bt] = true
			continue
		}
		if hashed(bt) && hashed(ot) {
			continue
		}
		t.Errorf("%s line %d: %q, where %s has %q", overlay, i+1, ol[i], base, bl[i])
	}
	for from, to := range wantDiff {
		if from != to && !seen[from] {
			t.Errorf("%s: %q never became %q", overlay, from, to)
		}
	}
}

// copyDeploy copies deploy/ without its Go files and without an operator's
// copies of the kube-proxy ConfigMap.
func copyDeploy(t *testing.T, dst string) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".go") || classify(path) == fileClusterCopy {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(path)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, path), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func dirFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
