package tools

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/deploy"
	"github.com/kproxy/kproxy/hack/image"
	"github.com/kproxy/kproxy/pkg/config"
)

// helmLabels are the labels the chart adds to every object's metadata that
// deploy/ has not: Helm's bookkeeping (helm.sh/chart and the recommended
// app.kubernetes.io labels of a release).
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"}

// hashSuffix is the suffix of a generated ConfigMap's name: kustomize's
// hash of its data, the chart's of its own.
var hashSuffix = regexp.MustCompile(`-[a-z0-9]{10}$`)

func repo(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func helm(t *testing.T) string {
	t.Helper()
	p, err := Ensure(context.Background(), "helm", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// helmTemplate renders the chart with helm template (release kproxy in
// kube-system) and the --set values given; it fails the test on error.
func helmTemplate(t *testing.T, sets ...string) []byte {
	t.Helper()
	out, err := helmTemplateErr(t, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func helmTemplateErr(t *testing.T, sets ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", "kproxy", filepath.Join(repo(t), "charts", "kproxy"), "--namespace", "kube-system"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm(t), args...)
	cmd.Env = helmEnv(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// helmEnv keeps helm's caches and configuration inside the test.
func helmEnv(t *testing.T) []string {
	d := t.TempDir()
	return append(os.Environ(), "HELM_CACHE_HOME="+d+"/cache", "HELM_CONFIG_HOME="+d+"/config", "HELM_DATA_HOME="+d+"/data")
}

// kustomize renders a directory of deploy/ as kubectl kustomize does.
func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(repo(t), "deploy", dir))
	if err != nil {
		t.Fatalf("kustomize build deploy/%s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objects splits a YAML stream into objects keyed by kind/namespace/name,
// normalized for comparison: Helm's labels dropped, a ConfigMap's hash
// suffix dropped (in its name and where DaemonSets name it), and the YAML
// files a ConfigMap holds parsed (comments and key order aside, they must
// say the same).
func objects(t *testing.T, stream []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(stream), -1) {
		var o map[string]any
		if err := sigsyaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		if len(o) == 0 {
			continue
		}
		meta, _ := o["metadata"].(map[string]any)
		if labels, ok := meta["labels"].(map[string]any); ok {
			for _, l := range helmLabels {
				delete(labels, l)
			}
		}
		kind, _ := o["kind"].(string)
		name, _ := meta["name"].(string)
		if kind == "ConfigMap" {
			name = hashSuffix.ReplaceAllString(name, "")
			meta["name"] = name
			data, _ := o["data"].(map[string]any)
			for k, v := range data {
				var parsed any
				if err := sigsyaml.Unmarshal([]byte(v.(string)), &parsed); err != nil {
					t.Fatalf("ConfigMap %s key %s: %v", name, k, err)
				}
				data[k] = parsed
			}
		}
		if kind == "DaemonSet" {
			spec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			vols, _ := spec["volumes"].([]any)
			for _, v := range vols {
				if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok {
					cm["name"] = hashSuffix.ReplaceAllString(cm["name"].(string), "")
				}
			}
		}
		ns, _ := meta["namespace"].(string)
		out[kind+"/"+ns+"/"+name] = o
	}
	return out
}

// compareObjects fails for every object of want that got lacks or has
// otherwise, and (when exact) for every object got has beyond want.
func compareObjects(t *testing.T, got, want map[string]map[string]any, exact bool) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart renders no %s", k)
			continue
		}
		if !reflect.DeepEqual(g, want[k]) {
			gy, _ := sigsyaml.Marshal(g)
			wy, _ := sigsyaml.Marshal(want[k])
			t.Errorf("%s differs:\n--- chart\n%s\n--- deploy/\n%s", k, gy, wy)
		}
	}
	if exact {
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("the chart renders %s, which deploy/ has not", k)
			}
		}
	}
}

// TestChartMatchesKustomize: with its default values the chart renders the
// objects of `kubectl kustomize deploy/`, object by object (no more, no
// fewer); with cleanup.enabled (and kproxy's DaemonSets off) it renders
// every object of deploy/cleanup (and the RBAC, which stays with the
// release). The ConfigMaps' files are compared as YAML (the chart writes
// them from values, without deploy/'s comments) and their names without
// the hash suffix.
func TestChartMatchesKustomize(t *testing.T) {
	t.Run("deploy", func(t *testing.T) {
		compareObjects(t, objects(t, helmTemplate(t)), objects(t, kustomize(t, ".")), true)
	})
	t.Run("cleanup", func(t *testing.T) {
		got := objects(t, helmTemplate(t, "linux.enabled=false", "windows.enabled=false", "cleanup.enabled=true"))
		compareObjects(t, got, objects(t, kustomize(t, "cleanup")), false)
		for k := range got {
			if strings.HasPrefix(k, "DaemonSet/") && !strings.Contains(k, "cleanup") {
				t.Errorf("cleanup mode renders %s", k)
			}
		}
	})
}

// TestChartMatchesKustomizeCatchesDrift: the comparison above fails when
// one field differs (a changed probe port in deploy/'s rendering).
func TestChartMatchesKustomizeCatchesDrift(t *testing.T) {
	want := objects(t, kustomize(t, "."))
	drifted := objects(t, bytes.Replace(kustomize(t, "."), []byte("initialDelaySeconds: 15"), []byte("initialDelaySeconds: 16"), 1))
	var diffs int
	for k := range want {
		if !reflect.DeepEqual(want[k], drifted[k]) {
			diffs++
		}
	}
	if diffs != 1 {
		t.Fatalf("a one-field drift changed %d objects, want 1", diffs)
	}
}

// TestChartLint: helm lint --strict passes with the default values and
// with every option turned on.
func TestChartLint(t *testing.T) {
	for _, sets := range [][]string{
		nil,
		{"linux.mode=nftables", "windows.enabled=false", "config.metricsBindAddress=0.0.0.0:10249",
			"metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"},
		{"linux.enabled=false", "windows.enabled=false", "cleanup.enabled=true"},
	} {
		args := []string{"lint", "--strict", filepath.Join(repo(t), "charts", "kproxy")}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		cmd := exec.Command(helm(t), args...)
		cmd.Env = helmEnv(t)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "0 chart(s) failed") {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if strings.Contains(string(out), "[WARNING]") || strings.Contains(string(out), "[ERROR]") {
			t.Errorf("helm %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestChartSchemaRejects: values.schema.json rejects a misspelt key at
// every level (and a wrong type or mode), and the template refuses the
// combinations it cannot express.
func TestChartSchemaRejects(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"linux.mdoe=nftables", "mdoe"},
		{"imagee.linux.tag=v1", "imagee"},
		{"config.clusterCidr=10.0.0.0/8", "clusterCidr"},
		{"config.iptables.syncPeriood=1s", "syncPeriood"},
		{"windows.network.networkname=x", "networkname"},
		{"metrics.serviceMonitor.enable=true", "enable"},
		{"linux.mode=userspace", "mode"},
		{"config.iptables.masqueradeBit=x", "masqueradeBit"},
		{"cleanup.enabled=true", "cleanup.enabled needs"},
		{"metrics.podMonitor.enabled=true", "loopback"},
	} {
		_, err := helmTemplateErr(t, tc.set)
		if err == nil {
			t.Errorf("--set %s: rendered without error", tc.set)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: error does not name %q:\n%v", tc.set, tc.want, err)
		}
	}
}

// TestChartConfig: the KubeProxyConfigurations the chart renders load
// with kproxy's own strict decoder and say what the values asked: the
// mode per OS, a field of config, a linux.config override, the Windows
// network.
func TestChartConfig(t *testing.T) {
	out := helmTemplate(t, "linux.mode=nftables", "config.clusterCIDR=10.1.0.0/16\\,fd00:1::/64",
		"linux.config.nftables.syncPeriod=10s", "windows.network.networkName=flannel.4096",
		"config.clientConnection.qps=20", "apiServer=https://10.0.0.1:6443")
	var cm *v1.ConfigMap
	objs, err := deploy.Decode(scheme.Codecs.UniversalDeserializer(), out)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if c, ok := o.(*v1.ConfigMap); ok {
			cm = c
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap")
	}
	linux, err := config.Decode([]byte(cm.Data["linux.yaml"]))
	if err != nil {
		t.Fatalf("linux.yaml does not load: %v\n%s", err, cm.Data["linux.yaml"])
	}
	windows, err := config.Decode([]byte(cm.Data["windows.yaml"]))
	if err != nil {
		t.Fatalf("windows.yaml does not load: %v\n%s", err, cm.Data["windows.yaml"])
	}
	for _, c := range []struct{ name, got, want string }{
		{"linux mode", string(linux.Mode), "nftables"},
		{"windows mode", string(windows.Mode), "kernelspace"},
		{"linux clusterCIDR", linux.ClusterCIDR, "10.1.0.0/16,fd00:1::/64"},
		{"windows clusterCIDR", windows.ClusterCIDR, "10.1.0.0/16,fd00:1::/64"},
		{"linux nftables.syncPeriod", linux.NFTables.SyncPeriod.Duration.String(), "10s"},
		{"windows nftables.syncPeriod (linux.config is Linux's)", windows.NFTables.SyncPeriod.Duration.String(), "0s"},
		{"windows networkName", windows.Winkernel.NetworkName, "flannel.4096"},
		{"linux kubeconfig", linux.ClientConnection.Kubeconfig, "/var/lib/kproxy/kubeconfig.conf"},
		{"linux qps", fmt.Sprint(linux.ClientConnection.QPS), "20"},
		{"kubeconfig server", fmt.Sprint(strings.Contains(cm.Data["kubeconfig.conf"], `server: "https://10.0.0.1:6443"`)), "true"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestChartCommandsInImage: every program the chart's Linux pods run, with
// every option that adds a pod, is in the Linux image (as hack/image's
// test checks deploy/'s).
func TestChartCommandsInImage(t *testing.T) {
	var runs []image.Run
	for _, sets := range [][]string{nil, {"linux.enabled=false", "windows.enabled=false", "cleanup.enabled=true"}} {
		objs, err := deploy.Decode(scheme.Codecs.UniversalDeserializer(), helmTemplate(t, sets...))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			ds, ok := o.(*appsv1.DaemonSet)
			if !ok || ds.Spec.Template.Spec.NodeSelector[v1.LabelOSStable] == "windows" {
				continue
			}
			runs = append(runs, image.PodRuns("chart: DaemonSet "+ds.Name, &ds.Spec.Template.Spec)...)
		}
	}
	if len(runs) < 5 {
		t.Fatalf("found %d programs: the rendering is broken", len(runs))
	}
	if err := image.CheckRuns(runs, image.Tools()); err != nil {
		t.Error(err)
	}
}

// TestChartNotesNameTheImages: the notes after helm install name each OS's
// image as set, not the chart's appVersion.
func TestChartNotesNameTheImages(t *testing.T) {
	args := []string{"install", "--dry-run=client", "kproxy", filepath.Join(repo(t), "charts", "kproxy"), "--namespace", "kube-system",
		"--set", "image.linux.tag=v9.9.1", "--set", "image.windows.repository=registry.example/kproxy-win"}
	cmd := exec.Command(helm(t), args...)
	cmd.Env = helmEnv(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	_, notes, ok := strings.Cut(string(out), "NOTES:")
	if !ok {
		t.Fatalf("no NOTES in:\n%s", out)
	}
	for _, want := range []string{"image ghcr.io/kproxy/kproxy:v9.9.1", "image registry.example/kproxy-win:dev"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}
