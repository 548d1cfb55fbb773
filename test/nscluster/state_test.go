package nscluster

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/proxytest"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestExampleManifest keeps docs/examples/cluster/echo.yaml true to the
// cluster: it decodes strictly, its ClusterIP is in the service range, its
// EndpointSlice names pods of the topology on their nodes and the echo port.
func TestExampleManifest(t *testing.T) {
	ex, err := LoadExample(repoRoot(t), proxytest.Default())
	if err != nil {
		t.Fatal(err)
	}
	want := Example{Service: "echo", ClusterIP: netip.MustParseAddr("10.96.100.10"), Port: 80, NodePort: 30080,
		Backends: []string{proxytest.PodA1, proxytest.PodB1, proxytest.PodB2}}
	if ex.Service != want.Service || ex.ClusterIP != want.ClusterIP || ex.Port != want.Port || ex.NodePort != want.NodePort ||
		strings.Join(ex.Backends, ",") != strings.Join(want.Backends, ",") {
		t.Errorf("example = %+v, want %+v", *ex, want)
	}
	if ex.URL() != "http://10.96.100.10/" {
		t.Errorf("URL = %s", ex.URL())
	}
}

func TestLoadExampleRejects(t *testing.T) {
	root := repoRoot(t)
	orig, err := os.ReadFile(filepath.Join(root, ExampleManifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, from, to string }{
		{"ClusterIP outside the service range", "clusterIP: 10.96.100.10", "clusterIP: 10.97.0.1"},
		{"endpoint not a pod", `["10.244.2.11"]`, `["10.244.2.99"]`},
		{"endpoint on the wrong node", "nodeName: node1", "nodeName: node2"},
		{"wrong port", "  port: 8080", "  port: 8081"},
		{"unknown field", "addressType: IPv4", "addressType: IPv4\nbogus: 1"},
		{"slice of another Service", "kubernetes.io/service-name: echo", "kubernetes.io/service-name: other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(orig), tc.from) {
				t.Fatalf("the example no longer contains %q", tc.from)
			}
			dir := t.TempDir()
			path := filepath.Join(dir, filepath.FromSlash(ExampleManifest))
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(strings.Replace(string(orig), tc.from, tc.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			if ex, err := LoadExample(dir, proxytest.Default()); err == nil {
				t.Errorf("accepted: %+v", *ex)
			}
		})
	}
}

func testState() *State {
	return &State{
		PID: 42, ID: "kpt-42-abcd",
		Namespaces: map[string]string{
			proxytest.Client1: "kpt-42-abcd-client-1", proxytest.Client2: "kpt-42-abcd-client-2",
			ControlPlaneHost: "kpt-42-abcd-control-plane", proxytest.Outside: "kpt-42-abcd-outside",
		},
		APIServer:  "https://192.168.50.10:6443",
		Kubeconfig: "/repo/.build/nscluster/kubeconfig",
		Kubectl:    "/repo/.build/controlplane/v/kubectl",
		Nodes: []Node{
			{Name: "node1", IPv4: "192.168.50.1", Mode: "iptables", Pods: []string{"pod-a1", "client-1"}},
			{Name: "node2", IPv4: "192.168.50.2", Mode: "nftables", Pods: []string{"pod-b1", "client-2"}},
		},
		EchoPort: 8080,
		Ready:    time.Unix(0, 0),
	}
}

func TestStateRoundTripAndHost(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadState(dir); !errors.Is(err, ErrNoCluster) {
		t.Errorf("ReadState of an empty directory: %v, want ErrNoCluster", err)
	}
	st := testState()
	if err := WriteState(dir, st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != st.ID || got.Nodes[1].Mode != "nftables" || got.Namespaces[ControlPlaneHost] != st.Namespaces[ControlPlaneHost] {
		t.Errorf("read back %+v", got)
	}
	for name, want := range map[string]string{ClientAlias: proxytest.Client1, proxytest.Client2: proxytest.Client2, ControlPlaneHost: ControlPlaneHost} {
		h, ns, err := got.Host(name)
		if err != nil || h != want || ns != st.Namespaces[want] {
			t.Errorf("Host(%q) = %q, %q, %v; want %q", name, h, ns, err, want)
		}
	}
	if _, _, err := got.Host("pod-zz"); err == nil || !strings.Contains(err.Error(), "client-2") {
		t.Errorf("Host of an unknown name: %v, want an error listing the hosts", err)
	}
}

// TestHints: what make netns-cluster prints names the KUBECONFIG, the kubectl
// wrapper, the example, make netns-shell, the curl through the ClusterIP and
// make netns-cluster-down, with NSCLUSTER_DIR on every make command when the state
// directory is not the default.
func TestHints(t *testing.T) {
	ex, err := LoadExample(repoRoot(t), proxytest.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		makeArgs string
		want     []string
	}{
		{"default directory", "", []string{
			"KUBECONFIG=/repo/.build/nscluster/kubeconfig\n",
			"export KUBECONFIG=/repo/.build/nscluster/kubeconfig PATH=/repo/.build/nscluster/bin:$PATH",
			"kubectl apply -f docs/examples/cluster/echo.yaml",
			"written by hand", "no controller manager",
			"make netns-shell POD=client\n", "curl http://10.96.100.10/", "kpt-echo probe -addr 10.96.100.10:80",
			"make netns-shell POD=client-2\n", "kproxy --proxy-mode iptables", "kproxy --proxy-mode nftables",
			"curl -s http://192.168.50.1:30080/", "make netns-cluster-down\n",
		}},
		{"another directory", "NSCLUSTER_DIR=/tmp/c", []string{
			"make netns-shell POD=client NSCLUSTER_DIR=/tmp/c\n", "make netns-cluster-down NSCLUSTER_DIR=/tmp/c\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := Hints(testState(), ex, HintOptions{MakeArgs: tc.makeArgs, BinDir: "/repo/.build/nscluster/bin"})
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("hints do not contain %q:\n%s", w, out)
				}
			}
		})
	}
}
