package deploy

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// imagesComponent is the one place deploy/ names its images.
const imagesComponent = "images"

// imageKustomizations are the kustomizations that render DaemonSets.
var imageKustomizations = []string{".", "cleanup", kubeadmOverlay, kubeadmCleanup}

type kustomizationImages struct {
	Kind   string `json:"kind"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

func readKustomizationImages(t *testing.T, path string) kustomizationImages {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var k kustomizationImages
	if err := sigsyaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return k
}

// Minimal saved copies of a kubeadm cluster's kube-proxy ConfigMap, for
// rendering the kubeadm overlay (TestKubeadmOverlay makes the real ones
// with the documented commands).
var kubeadmFixtures = map[string]string{
	"config.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmetadata:\n  name: kube-proxy\n" +
		"clusterCIDR: 10.244.0.0/16\nwinkernel:\n  networkName: \"\"\n",
	"kubeconfig.yaml": "apiVersion: v1\nkind: Config\nmetadata:\n  name: kube-proxy\nclusters:\n- cluster:\n    server: https://cp.example.test:6443\n  name: default\n",
}

// TestImagesFromOneComponent: only deploy/images (a kustomize Component)
// has an images: list, and every kustomization that renders DaemonSets
// takes its images from it: rendered in a copy of deploy/ whose component
// names other images, every container of each uses exactly the
// component's two images, and deploy/ and deploy/cleanup name the same.
func TestImagesFromOneComponent(t *testing.T) {
	files := deployFiles(t)
	for _, path := range files[fileKustomization] {
		k := readKustomizationImages(t, path)
		if filepath.Dir(path) == imagesComponent {
			if k.Kind != "Component" {
				t.Errorf("%s: kind %q, want Component", path, k.Kind)
			}
			continue
		}
		if len(k.Images) > 0 {
			t.Errorf("%s has an images: list of its own; the images belong in %s/kustomization.yaml", path, imagesComponent)
		}
	}
	comp := readKustomizationImages(t, filepath.Join(imagesComponent, "kustomization.yaml"))
	names := map[string]bool{}
	for _, im := range comp.Images {
		names[im.Name] = true
	}
	if len(comp.Images) != 2 || !names["kproxy"] || !names["kproxy-windows"] {
		t.Fatalf("%s/kustomization.yaml: images %+v, want kproxy and kproxy-windows", imagesComponent, comp.Images)
	}

	for _, probe := range []struct{ registry, tag string }{{"", ""}, {"registry.test/probe", "probe-tag"}} {
		root := t.TempDir()
		copyDeploy(t, root)
		for name, data := range kubeadmFixtures {
			if err := os.WriteFile(filepath.Join(root, kubeadmValuesDir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		compPath := filepath.Join(root, imagesComponent, "kustomization.yaml")
		if probe.tag != "" {
			data, err := os.ReadFile(compPath)
			if err != nil {
				t.Fatal(err)
			}
			s := strings.ReplaceAll(string(data), "newName: ghcr.io/kproxy/", "newName: "+probe.registry+"/")
			s = strings.ReplaceAll(s, "newTag: "+comp.Images[0].NewTag, "newTag: "+probe.tag)
			if err := os.WriteFile(compPath, []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want := map[string]bool{}
		for _, im := range readKustomizationImages(t, compPath).Images {
			want[im.NewName+":"+im.NewTag] = true
		}
		if probe.tag != "" && !want[probe.registry+"/kproxy:"+probe.tag] {
			t.Fatalf("the probe did not change the component: %v", want)
		}
		rendered := map[string][]string{}
		for _, dir := range imageKustomizations {
			_, objs := render(t, filepath.Join(root, dir))
			seen := map[string]bool{}
			for _, o := range objs {
				ds, ok := o.(*appsv1.DaemonSet)
				if !ok {
					continue
				}
				for _, c := range allContainers(&ds.Spec.Template.Spec) {
					if !want[c.Image] {
						t.Errorf("%s: DaemonSet %s container %s: image %q is not one of %s's %v", dir, ds.Name, c.Name, c.Image, imagesComponent, want)
					}
					seen[c.Image] = true
				}
			}
			for im := range seen {
				rendered[dir] = append(rendered[dir], im)
			}
			sort.Strings(rendered[dir])
			if len(rendered[dir]) != len(want) {
				t.Errorf("%s renders images %v, want all of %v", dir, rendered[dir], want)
			}
		}
		if strings.Join(rendered["."], " ") != strings.Join(rendered["cleanup"], " ") {
			t.Errorf("deploy/ renders %v, deploy/cleanup %v", rendered["."], rendered["cleanup"])
		}
	}
}
