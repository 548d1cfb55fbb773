package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/internal/daemon"
)

// State describes a running cluster (StateFile).
type State struct {
	// PID is the daemon's.
	PID int `json:"pid"`
	// ID prefixes every namespace name (netns.Cluster.ID).
	ID string `json:"id"`
	// Namespaces maps each host (the nodes, "control-plane", "outside",
	// "lan") to its network namespace.
	Namespaces map[string]string `json:"namespaces"`
	// Cgroup holds every process of the cluster (CgroupName).
	Cgroup string `json:"cgroup"`
	// APIServer is kube-apiserver's URL on the node network.
	APIServer string `json:"apiServer"`
	// Kubeconfig is the admin kubeconfig; Kubectl the kubectl binary.
	Kubeconfig string `json:"kubeconfig"`
	Kubectl    string `json:"kubectl"`
	// Proxy and Mode say which Service proxy runs, and how; Overlay how
	// kproxy was applied.
	Proxy   string    `json:"proxy"`
	Mode    string    `json:"mode"`
	Overlay string    `json:"overlay,omitempty"`
	Nodes   []Node    `json:"nodes"`
	Ready   time.Time `json:"ready"`
}

// ErrNoCluster is returned when a state directory holds no running cluster.
var ErrNoCluster = errors.New("no cluster is running")

// ReadState reads dir's StateFile.
func ReadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (start one with make cluster)", ErrNoCluster, dir)
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return &s, nil
}

// WriteState writes dir's StateFile atomically.
func WriteState(dir string, s *State) error {
	return daemon.WriteJSON(filepath.Join(dir, StateFile), s)
}

func (s *State) hosts() []string {
	var out []string
	for h := range s.Namespaces {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// HintOptions shape Hints.
type HintOptions struct {
	// Show renders a path for the reader. Default: as is.
	Show func(path string) string
	// MakeArgs are appended to every make command (CLUSTER_DIR=... when the
	// state directory is not the default).
	MakeArgs string
	// BinDir holds the kubectl wrapper.
	BinDir string
}

// Hints is what make cluster prints once the cluster runs: what runs
// where, the KUBECONFIG, and the quick start's commands.
func Hints(s *State, o HintOptions) string {
	show := o.Show
	if show == nil {
		show = func(p string) string { return p }
	}
	mk := func(target string) string {
		if o.MakeArgs != "" {
			return "make " + target + " " + o.MakeArgs
		}
		return "make " + target
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("Kubernetes cluster running (daemon pid %d; %s removes it).", s.PID, mk("cluster-down"))
	w("")
	w("  control-plane  %s: kube-apiserver, etcd, kube-controller-manager, kube-scheduler", s.APIServer)
	proxy := fmt.Sprintf("%s (%s mode)", s.Proxy, s.Mode)
	if s.Proxy == ProxyNone {
		proxy = "no Service proxy yet (PROXY=none: install one, docs/install.md)"
	}
	for _, n := range s.Nodes {
		w("  %-13s  %-13s  containerd, kubelet, pods in %s; %s", n.Name, n.IP, n.PodCIDR, proxy)
	}
	w("  cluster DNS    CoreDNS behind kube-dns, %s", DNSIP)
	w("")
	w("KUBECONFIG=%s", show(s.Kubeconfig))
	w("")
	w("The API server is reachable only inside the cluster's network namespaces: the kubectl")
	w("in %s runs kubectl in the control-plane namespace. Try it, from the repository root:", show(o.BinDir))
	w("")
	bin := show(o.BinDir)
	if !strings.HasPrefix(bin, "/") {
		bin = "$PWD/" + bin
	}
	w("  export PATH=%s:$PATH", bin)
	w("  kubectl get nodes -o wide")
	w("  kubectl -n kube-system get pods -o wide            # %s on each node, CoreDNS", s.Proxy)
	w("  kubectl create deployment web --image=registry.k8s.io/e2e-test-images/agnhost:2.66.1 --replicas=3 -- /agnhost netexec --http-port=8080")
	w("  kubectl expose deployment web --port=80 --target-port=8080")
	w("  kubectl get endpointslices -l kubernetes.io/service-name=web")
	w("  kubectl run client --image=registry.k8s.io/e2e-test-images/agnhost:2.66.1 --restart=Never --command -- sleep 3600")
	w("  kubectl exec client -- curl -s http://web/hostname   # a pod of web answers, through the ClusterIP")
	w("  %s   # a shell in node1's network namespace", mk("node-shell NODE=node1"))
	w("  %s", mk("cluster-down"))
	return b.String()
}
