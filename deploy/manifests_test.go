package deploy

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// kustomizations are the directories users apply with kubectl apply -k.
var kustomizations = []string{".", "cleanup"}

// strict decodes Kubernetes objects of client-go's scheme from YAML or JSON;
// an unknown or duplicate field is an error.
var strict = k8sjson.NewSerializerWithOptions(k8sjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
	k8sjson.SerializerOptions{Yaml: true, Strict: true})

// decodeAll decodes a YAML stream strictly.
func decodeAll(data []byte) ([]runtime.Object, error) { return Decode(strict, data) }

// render builds a kustomization directory with kustomize's library (what
// `kubectl kustomize DIR` runs) and decodes the result strictly.
func render(t *testing.T, dir string) (yaml []byte, objs []runtime.Object) {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	yaml, err = m.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objs, err = decodeAll(yaml)
	if err != nil {
		t.Fatalf("kustomize build %s: output does not decode: %v", dir, err)
	}
	return yaml, objs
}

// rendered is the output of the main kustomization, by kind.
type rendered struct {
	objs                []runtime.Object
	daemonSets          map[string]*appsv1.DaemonSet
	configMaps          map[string]*v1.ConfigMap
	serviceAccounts     map[string]*v1.ServiceAccount
	clusterRoles        map[string]*rbacv1.ClusterRole
	clusterRoleBindings map[string]*rbacv1.ClusterRoleBinding
}

func renderMain(t *testing.T) *rendered {
	t.Helper()
	return renderDir(t, ".")
}

// renderDir renders a kustomization directory, by kind.
func renderDir(t *testing.T, dir string) *rendered {
	t.Helper()
	_, objs := render(t, dir)
	r := &rendered{
		objs:                objs,
		daemonSets:          map[string]*appsv1.DaemonSet{},
		configMaps:          map[string]*v1.ConfigMap{},
		serviceAccounts:     map[string]*v1.ServiceAccount{},
		clusterRoles:        map[string]*rbacv1.ClusterRole{},
		clusterRoleBindings: map[string]*rbacv1.ClusterRoleBinding{},
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			r.daemonSets[o.Name] = o
		case *v1.ConfigMap:
			r.configMaps[o.Name] = o
		case *v1.ServiceAccount:
			r.serviceAccounts[o.Name] = o
		case *rbacv1.ClusterRole:
			r.clusterRoles[o.Name] = o
		case *rbacv1.ClusterRoleBinding:
			r.clusterRoleBindings[o.Name] = o
		default:
			t.Errorf("unexpected %T in the rendered kustomization", o)
		}
	}
	return r
}

// daemonSet returns the rendered DaemonSet name, failing the test if absent.
func (r *rendered) daemonSet(t *testing.T, name string) *appsv1.DaemonSet {
	t.Helper()
	ds, ok := r.daemonSets[name]
	if !ok {
		t.Fatalf("no DaemonSet %q in the rendered kustomization", name)
	}
	return ds
}

// The kinds of files under deploy/ and how each is checked.
const (
	fileKustomization = "kustomization"   // rendered with krusty
	fileKubernetes    = "kubernetes"      // strict decode with client-go's scheme
	fileProxyConfig   = "proxy config"    // config.Load and Validate (config_test.go)
	fileKubeconfig    = "kubeconfig"      // strict decode as a kubeconfig (config_test.go)
	fileDockerfile    = "Dockerfile"      // images_test.go
	fileScript        = "script"          // images_test.go
	fileGo            = "Go"              // this package
	fileGitignore     = "gitignore"       // kubeadm_overlay_test.go
	fileClusterCopy   = "cluster copy"    // an operator's copy of the cluster's kube-proxy ConfigMap (gitignored; kubeadm_overlay_test.go)
	fileMonitoring    = "monitoring"      // monitoring_test.go; PromQL and promtool in hack/tools
	fileUnknown       = "unknown"         // a test failure: nothing goes unchecked
	monitoringDir     = "monitoring"      // the dashboard and alert rules
	proxyConfigDir    = "config"          // where the KubeProxyConfigurations live
	kubeconfigName    = "kubeconfig.conf" // in proxyConfigDir
)

func classify(path string) string {
	base := filepath.Base(path)
	switch {
	case base == "kustomization.yaml":
		return fileKustomization
	case filepath.Dir(path) == monitoringDir:
		return fileMonitoring
	case base == ".gitignore":
		return fileGitignore
	case filepath.Dir(path) == kubeadmValuesDir && kubeadmCopies[base]:
		return fileClusterCopy
	case filepath.Dir(path) == proxyConfigDir && base == kubeconfigName:
		return fileKubeconfig
	case filepath.Dir(path) == proxyConfigDir && strings.HasSuffix(base, ".yaml"):
		return fileProxyConfig
	case strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml"):
		return fileKubernetes
	case base == "Dockerfile":
		return fileDockerfile
	case strings.HasSuffix(base, ".ps1"):
		return fileScript
	case strings.HasSuffix(base, ".go"):
		return fileGo
	}
	return fileUnknown
}

// deployFiles lists every file under deploy/ by kind.
func deployFiles(t *testing.T) map[string][]string {
	t.Helper()
	files := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		k := classify(path)
		files[k] = append(files[k], path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestEveryFileIsChecked(t *testing.T) {
	files := deployFiles(t)
	if u := files[fileUnknown]; len(u) > 0 {
		t.Errorf("files no test checks (teach classify about them): %v", u)
	}
	for _, k := range []string{fileKustomization, fileKubernetes, fileProxyConfig, fileKubeconfig, fileDockerfile, fileScript} {
		if len(files[k]) == 0 {
			t.Errorf("no %s file found under deploy/", k)
		}
	}
}

// TestManifestsDecodeStrictly decodes every Kubernetes manifest file as
// written, and checks that each is a resource of some kustomization (so
// that none is forgotten when applying).
func TestManifestsDecodeStrictly(t *testing.T) {
	files := deployFiles(t)
	listed := map[string]bool{}
	for _, k := range files[fileKustomization] {
		dir := filepath.Dir(k)
		for _, res := range kustomizationResources(t, k) {
			listed[filepath.Join(dir, res)] = true
		}
	}
	for _, path := range files[fileKubernetes] {
		t.Run(path, func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeAll(data)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if len(objs) == 0 {
				t.Errorf("%s holds no object", path)
			}
			if !listed[path] {
				t.Errorf("%s is not a resource of any kustomization.yaml", path)
			}
		})
	}
}

// TestStrictDecoderRejects shows that the decoder above would catch the
// mistakes it is there for.
func TestStrictDecoderRejects(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"unknown field", "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\nautomountToken: false\n"},
		{"misplaced field", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: a\nspec:\n  hostNetwork: true\n"},
		{"duplicate field", "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  name: b\n"},
		{"wrong type", "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: [a]\n"},
		{"unknown kind", "apiVersion: v1\nkind: Pdo\nmetadata:\n  name: a\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeAll([]byte(tc.doc)); err == nil {
				t.Errorf("decoded without error:\n%s", tc.doc)
			}
		})
	}
	if objs, err := decodeAll([]byte("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n")); err != nil || len(objs) != 1 {
		t.Errorf("a valid document: %d objects, %v", len(objs), err)
	}
}

// kustomizationResources returns the resources a kustomization.yaml lists.
func kustomizationResources(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := sigsyaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return k.Resources
}

func TestKustomizationsRender(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			_, objs := render(t, dir)
			if len(objs) == 0 {
				t.Fatal("renders nothing")
			}
			for _, o := range objs {
				ds, ok := o.(*appsv1.DaemonSet)
				if !ok {
					continue
				}
				if ds.Namespace != "kube-system" {
					t.Errorf("DaemonSet %s: namespace %q, want kube-system", ds.Name, ds.Namespace)
				}
				for _, c := range allContainers(&ds.Spec.Template.Spec) {
					if !strings.Contains(c.Image, "/") || !strings.Contains(c.Image, ":") {
						t.Errorf("DaemonSet %s container %s: image %q is not rewritten to a registry and tag by the kustomization's images", ds.Name, c.Name, c.Image)
					}
				}
			}
		})
	}
}

// TestKubectlKustomizeAgrees renders with the kubectl on this machine, when
// there is one (CI has none; the krusty rendering above is the check there),
// and expects the same objects.
func TestKubectlKustomizeAgrees(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: only the kustomize library's rendering is checked")
	}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", dir).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			got, err := decodeAll(out)
			if err != nil {
				t.Fatalf("kubectl kustomize %s: output does not decode: %v", dir, err)
			}
			_, want := render(t, dir)
			if !reflect.DeepEqual(sortObjects(got), sortObjects(want)) {
				t.Errorf("kubectl kustomize %s differs from the kustomize library's rendering:\n%s", dir, out)
			}
		})
	}
}

// installDoc is the installation guide, whose overlays the tests render.
const installDoc = "../docs/install.md"

// TestCanaryOverlay renders the node-by-node overlay that
// docs/install.md tells operators to write next to deploy/, exactly as
// the guide spells it.
func TestCanaryOverlay(t *testing.T) {
	doc, err := os.ReadFile(installDoc)
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- canary overlay -->\n```yaml\n"
	_, rest, ok := strings.Cut(string(doc), marker)
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("%s: no YAML block after %q", installDoc, strings.TrimSpace(marker))
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.Symlink(here, filepath.Join(root, "deploy")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "kproxy-canary")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	_, objs := render(t, dir)
	n := 0
	for _, o := range objs {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		n++
		ns := ds.Spec.Template.Spec.NodeSelector
		if ns["kproxy.io/enabled"] != "true" || ns[v1.LabelOSStable] == "" {
			t.Errorf("DaemonSet %s: nodeSelector %v, want kproxy.io/enabled=true besides the OS", ds.Name, ns)
		}
	}
	if n != 2 {
		t.Errorf("the overlay renders %d DaemonSets, want 2", n)
	}
}

func sortObjects(objs []runtime.Object) []runtime.Object {
	out := append([]runtime.Object(nil), objs...)
	key := func(o runtime.Object) string {
		return fmt.Sprintf("%T %v", o, o)
	}
	sort.Slice(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out
}

func allContainers(spec *v1.PodSpec) []*v1.Container {
	var out []*v1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}
