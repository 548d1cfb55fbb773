package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kproxy/kproxy/cmd/internal/explaincmd"
	"github.com/kproxy/kproxy/deploy"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
)

// decodeFile decodes every object of a YAML file of the repository.
func decodeFile(t *testing.T, file string) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Decode(scheme.Codecs.UniversalDeserializer(), data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return objs
}

// daemonSetPod is a pod of deploy/'s DaemonSet in file, running on node.
func daemonSetPod(t *testing.T, file, name, node string) *v1.Pod {
	t.Helper()
	for _, o := range decodeFile(t, file) {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			return &v1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: ds.Spec.Template.Labels},
				Spec:       *ds.Spec.Template.Spec.DeepCopy(),
			}
		}
	}
	t.Fatalf("%s holds no DaemonSet", file)
	return nil
}

// exampleCluster is docs/examples (the Node node1, Services and slices), a
// Windows node win1, kproxy's DaemonSet pods of deploy/ on both, and
// deploy/'s ConfigMap with the Linux configuration's mode set to mode.
func exampleCluster(t *testing.T, mode string) (*fake.Clientset, string) {
	t.Helper()
	var objs []runtime.Object
	files, _ := filepath.Glob("../../docs/examples/*.yaml")
	for _, f := range files {
		objs = append(objs, decodeFile(t, f)...)
	}
	linuxConf, err := os.ReadFile("../../deploy/config/linux.yaml")
	if err != nil {
		t.Fatal(err)
	}
	linuxConf = bytes.Replace(linuxConf, []byte("\nmode: iptables\n"), []byte("\nmode: "+mode+"\n"), 1)
	if !bytes.Contains(linuxConf, []byte("\nmode: "+mode+"\n")) {
		t.Fatal("deploy/config/linux.yaml has no line mode: iptables any more: update this test")
	}
	windowsConf, err := os.ReadFile("../../deploy/config/windows.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kproxy", Namespace: "kube-system"},
		Data: map[string]string{"linux.yaml": string(linuxConf), "windows.yaml": string(windowsConf), "kubeconfig.conf": "unused"}}
	lp := daemonSetPod(t, "../../deploy/linux/daemonset.yaml", "kproxy-abcde", "node1")
	lp.Spec.NodeName = "node1"
	wp := daemonSetPod(t, "../../deploy/windows/daemonset.yaml", "kproxy-windows-fghij", "win1")
	wp.Spec.NodeName = "win1"
	win := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "win1", Labels: map[string]string{v1.LabelOSStable: "windows"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.50.21"}}}}
	bare := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	objs = append(objs, cm, lp, wp, win, bare)
	return fake.NewClientset(objs...), string(linuxConf)
}

func pluginExplain(t *testing.T, client *fake.Clientset, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runExplain(context.Background(), args, &connection{clientset: client}, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestPluginExplainsAsKproxyOnTheNode: `kubectl kproxy explain node1` from
// the API server answers what `kproxy explain` answers on node1 with the
// node's configuration file and the same objects (docs/examples), in
// both Linux modes and for every kind of client; the mode comes from the
// ConfigMap the node's pod mounts.
func TestPluginExplainsAsKproxyOnTheNode(t *testing.T) {
	queries := [][]string{
		{"--to", "10.96.0.30:53/udp"},
		{"--to", "10.96.0.30:54/udp"},
		{"--from-outside", "--to", "10.96.0.30:53/udp"},
		{"--from-node", "--to", "10.96.0.30:53/udp", "-o", "json"},
	}
	for _, mode := range []string{"iptables", "nftables"} {
		client, conf := exampleCluster(t, mode)
		dir := t.TempDir()
		file := filepath.Join(dir, "config.conf")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, q := range queries {
			code, got, errOut := pluginExplain(t, client, append([]string{"node1"}, q...)...)
			if code != 0 {
				t.Fatalf("%s %q: exit %d: %s", mode, q, code, errOut)
			}
			// kproxy explain on the node: its configuration file, the
			// same objects from --manifests.
			o := config.NewOptionsFor("linux")
			fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse([]string{"--config", file, "--manifests", "../../docs/examples", "--hostname-override", "node1"}); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(fs); err != nil {
				t.Fatal(err)
			}
			o.DryRun = true
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			var f explaincmd.Flags
			ffs := pflag.NewFlagSet("explain", pflag.ContinueOnError)
			f.AddFlags(ffs, true)
			if err := ffs.Parse(q); err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := explaincmd.Run(context.Background(), o, f, "", app.Snapshot, &want); err != nil {
				t.Fatal(err)
			}
			if got != want.String() {
				t.Errorf("%s %q: the plugin says\n%s\nkproxy explain on the node says\n%s", mode, q, got, want.String())
			}
			if !strings.Contains(got, mode) {
				t.Errorf("%s %q: the explanation does not name the mode:\n%s", mode, q, got)
			}
		}
	}
}

// TestPluginExplainsAWindowsNode: a Windows node's kproxy pod mounts
// windows.yaml (mode kernelspace): the plugin, on any OS, plans HNS load
// balancers for it.
func TestPluginExplainsAWindowsNode(t *testing.T) {
	client, _ := exampleCluster(t, "iptables")
	code, out, errOut := pluginExplain(t, client, "win1", "--to", "10.96.0.30:53/udp")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "kernelspace") {
		t.Errorf("the Windows node is not explained in kernelspace mode:\n%s", out)
	}
}

// TestPluginExplainErrors: what the operator gets wrong is named.
func TestPluginExplainErrors(t *testing.T) {
	client, _ := exampleCluster(t, "iptables")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no node", []string{"--to", "10.96.0.30:53"}, "give one NODE"},
		{"no destination", []string{"node1"}, "--to ADDRESS:PORT is required"},
		{"a misspelt node", []string{"nod1", "--to", "10.96.0.30:53"}, `node "nod1"`},
		{"a node without kproxy", []string{"bare", "--to", "10.96.0.30:53"}, `no kproxy pod on node "bare" in namespace kube-system`},
		{"another namespace", []string{"node1", "-n", "kproxy", "--to", "10.96.0.30:53"}, `no kproxy pod on node "node1" in namespace kproxy`},
	} {
		code, _, errOut := pluginExplain(t, client, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, %q; want exit 1 and %q", tc.name, code, errOut, tc.want)
		}
	}
}

// TestExpandEnv: $(VAR) as the kubelet expands it, for what the plugin
// can know.
func TestExpandEnv(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: v1.PodSpec{NodeName: "n1"}}
	c := &v1.Container{Env: []v1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "LIT", Value: "x"},
		{Name: "SECRET", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{Key: "k"}}},
	}}
	got := expandEnv([]string{"--hostname-override=$(NODE_NAME)", "$(LIT)-$(SECRET)", "$$(LIT)", "$(", "a$"}, c, pod)
	want := []string{"--hostname-override=n1", "x-$(SECRET)", "$(LIT)", "$(", "a$"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("expandEnv #%d = %q, want %q", i, got[i], want[i])
		}
	}
}
