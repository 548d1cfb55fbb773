package cluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/deploy"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/test/cluster/images"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// strict decodes a manifest with the Kubernetes scheme, unknown fields
// refused.
func strict(t *testing.T, data string) []runtime.Object {
	t.Helper()
	d := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	objs, err := deploy.Decode(d, []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestManifestsDecode: the add-ons are valid Kubernetes objects (strictly),
// CoreDNS runs the image make cluster builds behind kube-dns at DNSIP, and
// kube-proxy's DaemonSet runs upstream's image with the ConfigMap's file.
func TestManifestsDecode(t *testing.T) {
	var svc *v1.Service
	var dns *appsv1.Deployment
	for _, o := range strict(t, CoreDNSManifest()) {
		switch x := o.(type) {
		case *v1.Service:
			svc = x
		case *appsv1.Deployment:
			dns = x
		}
	}
	if svc == nil || svc.Name != "kube-dns" || svc.Spec.ClusterIP != DNSIP.String() || len(svc.Spec.Ports) != 3 {
		t.Errorf("kube-dns Service = %+v", svc)
	}
	if dns == nil || dns.Spec.Template.Spec.Containers[0].Image != images.CoreDNS || dns.Spec.Template.Labels["k8s-app"] != "kube-dns" {
		t.Errorf("coredns Deployment = %+v", dns)
	}
	var ds *appsv1.DaemonSet
	for _, o := range strict(t, KubeProxyManifest()) {
		if x, ok := o.(*appsv1.DaemonSet); ok {
			ds = x
		}
	}
	if ds == nil || ds.Spec.Template.Spec.Containers[0].Image != images.KubeProxy || !ds.Spec.Template.Spec.HostNetwork ||
		!strings.Contains(strings.Join(ds.Spec.Template.Spec.Containers[0].Command, " "), "--config=/var/lib/kube-proxy/config.conf") {
		t.Errorf("kube-proxy DaemonSet = %+v", ds)
	}
	for _, mode := range Modes {
		objs := strict(t, KubeProxyConfigMap(mode, "https://192.168.50.10:6443"))
		cm, ok := objs[0].(*v1.ConfigMap)
		if !ok {
			t.Fatalf("KubeProxyConfigMap is a %T", objs[0])
		}
		var cfg map[string]any
		if err := yaml.UnmarshalStrict([]byte(cm.Data["config.conf"]), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg["mode"] != mode || cfg["clusterCIDR"] != ClusterCIDR.String() || cfg["kind"] != "KubeProxyConfiguration" {
			t.Errorf("config.conf (%s) = %v", mode, cfg)
		}
		if !strings.Contains(cm.Data["kubeconfig.conf"], "server: https://192.168.50.10:6443") {
			t.Errorf("kubeconfig.conf does not name the API server:\n%s", cm.Data["kubeconfig.conf"])
		}
	}
}

// TestNodeConfig: containerd's configuration keeps everything under the
// node's directory and names the pause image; the CNI network is the
// node's pod CIDR on a hairpin bridge; the kubelet's is a
// KubeletConfiguration with the node's address, cgroup root and DNS.
func TestNodeConfig(t *testing.T) {
	l := Layout{Dir: "/r/.build/cluster"}
	n := Nodes[1]
	p := l.Node(n.Name)
	cd := ContainerdConfig(p, true)
	for _, want := range []string{
		"version = 4\n", `root = "/r/.build/cluster/node2/containerd/root"`, `address = "/r/.build/cluster/node2/containerd/containerd.sock"`,
		`sandbox = "` + images.Pause + `"`, `conf_dir = "/r/.build/cluster/node2/cni/net.d"`, `SystemdCgroup = false`,
		`netns_mounts_under_state_dir = true`, `disabled_plugins = ["io.containerd.nri.v1.nri"]`, `restrict_oom_score_adj = true`,
	} {
		if !strings.Contains(cd, want) {
			t.Errorf("containerd config lacks %s:\n%s", want, cd)
		}
	}
	var cni struct {
		Plugins []struct {
			Type        string `json:"type"`
			HairpinMode bool   `json:"hairpinMode"`
			IPAM        struct {
				DataDir string                `json:"dataDir"`
				Ranges  [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(CNIConfig(n, p)), &cni); err != nil {
		t.Fatal(err)
	}
	if len(cni.Plugins) != 2 || cni.Plugins[0].Type != "bridge" || !cni.Plugins[0].HairpinMode || cni.Plugins[1].Type != "portmap" ||
		cni.Plugins[0].IPAM.Ranges[0][0]["subnet"] != "10.244.2.0/24" || cni.Plugins[0].IPAM.DataDir != p.CNIState {
		t.Errorf("CNI config = %+v", cni)
	}
	var kc map[string]any
	if err := yaml.UnmarshalStrict([]byte(KubeletConfig(n, p, "/kproxy-cluster-x/node2", "/ca.crt")), &kc); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"kind": "KubeletConfiguration", "address": "192.168.50.2", "cgroupDriver": "cgroupfs", "cgroupRoot": "/kproxy-cluster-x/node2",
		"failCgroupV1": false, "protectKernelDefaults": true, "podLogsDir": p.PodLogs,
		"containerRuntimeEndpoint": "unix://" + p.ContainerdSocket,
	} {
		if kc[k] != want {
			t.Errorf("kubelet config %s = %v, want %v", k, kc[k], want)
		}
	}
	if dns, _ := kc["clusterDNS"].([]any); len(dns) != 1 || dns[0] != DNSIP.String() {
		t.Errorf("clusterDNS = %v", kc["clusterDNS"])
	}
}

// TestKernelTunablesAreKubelets: the files mounted over the host-wide
// sysctls hold exactly the values the kubelet checks, or it would write the
// machine's (or, with protectKernelDefaults, refuse to start).
func TestKernelTunablesAreKubelets(t *testing.T) {
	want := map[string]string{
		"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
		"kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
	}
	if len(KernelTunables) != len(want) {
		t.Errorf("KernelTunables = %v, want %v", KernelTunables, want)
	}
	for k, v := range want {
		if KernelTunables[k] != v {
			t.Errorf("KernelTunables[%s] = %q, want %q", k, KernelTunables[k], v)
		}
	}
}

// TestCheckPaths: a state directory too deep for the sockets under it is
// refused before anything starts.
func TestCheckPaths(t *testing.T) {
	if err := (Layout{Dir: "/work/wt/cluster/.build/cluster"}).CheckPaths(); err != nil {
		t.Errorf("a usual directory is refused: %v", err)
	}
	if err := (Layout{Dir: "/" + strings.Repeat("d", 60)}).CheckPaths(); err == nil {
		t.Error("a 60-character directory is accepted")
	}
}

func TestCgroupNameIsStableAndDistinct(t *testing.T) {
	a, b := CgroupName("/r/.build/cluster"), CgroupName("/r/.build/cluster/")
	if a != b || !strings.HasPrefix(a, "kproxy-cluster-") {
		t.Errorf("CgroupName = %q and %q, want one stable name", a, b)
	}
	if CgroupName("/other") == a {
		t.Error("two directories share a cgroup")
	}
}

func TestCheckProxy(t *testing.T) {
	for _, ok := range [][2]string{{"kproxy", "iptables"}, {"kproxy", "nftables"}, {"kube-proxy", "iptables"}, {"kube-proxy", "nftables"}, {"none", "iptables"}} {
		if err := CheckProxy(ok[0], ok[1]); err != nil {
			t.Errorf("CheckProxy(%v): %v", ok, err)
		}
	}
	for _, bad := range [][2]string{{"kproxy", "ipvs"}, {"cilium", "iptables"}, {"none", "ipvs"}, {"", ""}} {
		if err := CheckProxy(bad[0], bad[1]); err == nil {
			t.Errorf("CheckProxy(%v) accepted", bad)
		}
	}
}

// TestDeployEdits: what make cluster does to a copy of deploy/ before
// kubectl apply -k, rendered as kubectl kustomize would: the kubeadm
// overlay with the kube-proxy ConfigMap saved as docs/install.md says runs
// the imported image, in the mode asked for, against the ConfigMap's API
// server and pod CIDR; the default kustomization with its two edits does
// the same.
func TestDeployEdits(t *testing.T) {
	root := repoRoot(t)
	const ref = "ghcr.io/kproxy/kproxy:v0.1.0-9-gabc1234"
	const api = "https://192.168.50.10:6443"
	for _, overlay := range []string{"kubeadm", "default"} {
		t.Run(overlay, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "deploy")
			if err := copyDeploy(filepath.Join(root, "deploy"), dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, "decode.go")); err == nil {
				t.Error("the copy holds deploy/'s Go files")
			}
			if err := configureDeploy(dir, ref, "nftables", true); err != nil {
				t.Fatal(err)
			}
			target := dir
			if overlay == "kubeadm" {
				cm := strict(t, KubeProxyConfigMap("nftables", api))[0].(*v1.ConfigMap)
				for f, key := range map[string]string{"config.yaml": "config.conf", "kubeconfig.yaml": "kubeconfig.conf"} {
					data := "metadata: {name: kube-proxy}\n" + cm.Data[key]
					if err := os.WriteFile(filepath.Join(dir, "overlays", "kubeadm", "kube-proxy", f), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				target = filepath.Join(dir, "overlays", "kubeadm")
			} else if err := configureDefault(dir); err != nil {
				t.Fatal(err)
			}
			res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), target)
			if err != nil {
				t.Fatal(err)
			}
			out, err := res.AsYaml()
			if err != nil {
				t.Fatal(err)
			}
			var ds *appsv1.DaemonSet
			var cm *v1.ConfigMap
			for _, o := range strict(t, string(out)) {
				switch x := o.(type) {
				case *appsv1.DaemonSet:
					if x.Name == "kproxy" {
						ds = x
					}
				case *v1.ConfigMap:
					if strings.HasPrefix(x.Name, "kproxy-") {
						cm = x
					}
				}
			}
			if ds == nil || cm == nil {
				t.Fatalf("no kproxy DaemonSet or ConfigMap in\n%s", out)
			}
			for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
				if c.Image != ref {
					t.Errorf("container %s runs %s, want %s", c.Name, c.Image, ref)
				}
			}
			if !strings.Contains(cm.Data["linux.yaml"], "\nmode: nftables\n") || !strings.Contains(cm.Data["linux.yaml"], `clusterCIDR: "10.244.0.0/16"`) ||
				!strings.Contains(cm.Data["linux.yaml"], "conntrack:\n  maxPerCore: 0\n") {
				t.Errorf("linux.yaml:\n%s", cm.Data["linux.yaml"])
			}
			cfg, err := config.Decode([]byte(cm.Data["linux.yaml"]))
			if err != nil {
				t.Fatalf("kproxy refuses the edited linux.yaml: %v", err)
			}
			if string(cfg.Mode) != "nftables" || cfg.Conntrack.MaxPerCore == nil || *cfg.Conntrack.MaxPerCore != 0 || cfg.OOMScoreAdj == nil || *cfg.OOMScoreAdj != 0 {
				t.Errorf("kproxy reads mode %q, conntrack.maxPerCore %v, oomScoreAdj %v", cfg.Mode, cfg.Conntrack.MaxPerCore, cfg.OOMScoreAdj)
			}
			if !strings.Contains(cm.Data["kubeconfig.conf"], `server: "`+api+`"`) {
				t.Errorf("kubeconfig.conf:\n%s", cm.Data["kubeconfig.conf"])
			}
		})
	}
}
