package image

import (
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kproxy/kproxy/deploy"
)

// deployKustomizations are the directories of deploy/ operators apply
// (overlays/kubeadm needs a copy of a cluster's ConfigMap to render, and
// changes no command: deploy/kubeadm_overlay_test.go).
var deployKustomizations = []string{".", "cleanup"}

// TestManifestCommandsInImage renders deploy/'s kustomizations and fails
// unless every program their Linux pods run (commands, and the commands of
// their sh -c scripts) is kproxy or one of Tools, which CheckTools requires
// in the image when make images builds it. (The chart's pods are checked
// the same way by hack/tools, with every value that adds a container.)
func TestManifestCommandsInImage(t *testing.T) {
	var runs []Run
	for _, dir := range deployKustomizations {
		for _, ds := range renderDaemonSets(t, filepath.Join("..", "..", "deploy", dir)) {
			if ds.Spec.Template.Spec.NodeSelector[v1.LabelOSStable] == "windows" {
				continue // the Windows image
			}
			runs = append(runs, PodRuns("deploy/"+dir+": DaemonSet "+ds.Name, &ds.Spec.Template.Spec)...)
		}
	}
	if len(runs) < 4 {
		t.Fatalf("found %d programs in deploy/'s Linux pods: the rendering is broken", len(runs))
	}
	for _, r := range runs {
		t.Logf("%s: %s %s", r.Where, r.Program, strings.Join(r.Args, " "))
	}
	if err := CheckRuns(runs, Tools()); err != nil {
		t.Error(err)
	}
}

func renderDaemonSets(t *testing.T, dir string) []*appsv1.DaemonSet {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	yaml, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Decode(scheme.Codecs.UniversalDeserializer(), yaml)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	var out []*appsv1.DaemonSet
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			out = append(out, ds)
		}
	}
	return out
}

// TestCheckRuns: what CheckRuns accepts and refuses.
func TestCheckRuns(t *testing.T) {
	tools := []Tool{{"sh", ""}, {"modprobe", ""}}
	spec := &v1.PodSpec{
		InitContainers: []v1.Container{{Name: "init", Command: []string{"/bin/sh", "-c",
			"modprobe -a x \\\n  y || echo no # a comment\nFOO=1 exec /usr/local/bin/kproxy --init-only; sleep 1 && true | cat\n"}}},
		Containers: []v1.Container{
			{Name: "a", Command: []string{"/usr/local/bin/kproxy", "idle"}},
			{Name: "b", Args: []string{"--config=/x"}},
			{Name: "c", Command: []string{"kproxy", "sleep"}},
			{Name: "d", Command: []string{"/opt/bin/modprobe"}},
			{Name: "e", Command: []string{"./run"}},
		},
	}
	err := CheckRuns(PodRuns("pod", spec), tools)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"runs sleep", "runs cat", `no subcommand "sleep"`, "runs /opt/bin/modprobe", `runs "./run"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	for _, notWant := range []string{"echo", "FOO", "runs modprobe", "runs /bin/sh", "container a", "container b"} {
		if strings.Contains(err.Error(), notWant) {
			t.Errorf("error names %q, which is fine:\n%v", notWant, err)
		}
	}
	if err := CheckRuns(PodRuns("pod", &v1.PodSpec{Containers: spec.Containers[:2]}), tools); err != nil {
		t.Errorf("kproxy idle and kproxy's entrypoint: %v", err)
	}
}
