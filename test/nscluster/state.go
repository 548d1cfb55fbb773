package nscluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kproxy/kproxy/deploy"
	"github.com/kproxy/kproxy/test/internal/daemon"
	"github.com/kproxy/kproxy/test/proxytest"
)

// Files of the state directory (<repository>/.build/nscluster by default).
const (
	// MarkerFile marks a directory Up created: Down removes no directory
	// without it.
	MarkerFile = ".kproxy-nscluster"
	// PIDFile holds the daemon's process id (written by Up).
	PIDFile = "daemon.pid"
	// IDFile holds the netns cluster ID (written by the daemon as soon as
	// the namespaces exist, so Down finds them even after a crash).
	IDFile = "netns-id"
	// StateFile is written by the daemon once everything runs.
	StateFile = "state.json"
	// LogFile receives the daemon's output.
	LogFile = "cluster.log"
	// KubeconfigFile is the admin kubeconfig (system:masters).
	KubeconfigFile = "kubeconfig"
	// BinDir holds kproxy, kpt-echo, kproxy-nscluster and the kubectl wrapper.
	BinDir = "bin"
	// LogDir holds kproxy's logs, one file per node.
	LogDir = "logs"
	// ShellRC is the bash startup file of make netns-shell.
	ShellRC = "shellrc"
)

// DefaultDir is the state directory under a repository root.
func DefaultDir(root string) string { return filepath.Join(root, ".build", "nscluster") }

// ExampleManifest is the Service the quick start applies, relative to the
// repository root.
const ExampleManifest = "docs/examples/cluster/echo.yaml"

// ControlPlaneHost is the control plane's host name (its namespace).
const ControlPlaneHost = "control-plane"

// ClientAlias is the host "make netns-shell POD=client" enters.
const ClientAlias = "client"

// NodeSpec is how the daemon runs kproxy on one node.
type NodeSpec struct {
	Name string
	Mode string // --proxy-mode
}

// Nodes are the cluster's nodes and their proxy modes.
var Nodes = []NodeSpec{
	{Name: proxytest.Node1, Mode: "iptables"},
	{Name: proxytest.Node2, Mode: "nftables"},
}

// Node is one node of a running cluster.
type Node struct {
	Name string `json:"name"`
	IPv4 string `json:"ipv4"`
	Mode string `json:"mode"`
	// Pods are the pods on the node (each runs an echo server).
	Pods []string `json:"pods"`
	// KproxyPID is the pid of "ip netns exec ... kproxy" (exec'd into kproxy).
	KproxyPID int    `json:"kproxyPID"`
	KproxyLog string `json:"kproxyLog"`
}

// State describes a running cluster (StateFile).
type State struct {
	// PID is the daemon's.
	PID int `json:"pid"`
	// ID prefixes every namespace name (netns.Cluster.ID).
	ID string `json:"id"`
	// Namespaces maps each host (pods, nodes, "outside", "control-plane",
	// "lan") to its network namespace.
	Namespaces map[string]string `json:"namespaces"`
	// APIServer is kube-apiserver's URL on the node network.
	APIServer string `json:"apiServer"`
	// Kubeconfig is the admin kubeconfig; Kubectl the kubectl binary built
	// from Go modules.
	Kubeconfig string `json:"kubeconfig"`
	Kubectl    string `json:"kubectl"`
	Nodes      []Node `json:"nodes"`
	// EchoPort is the pods' echo server port (TCP and UDP; HTTP on TCP).
	EchoPort int       `json:"echoPort"`
	Ready    time.Time `json:"ready"`
}

// ErrNoCluster is returned when a state directory holds no running cluster.
var ErrNoCluster = errors.New("no cluster is running")

// ReadState reads dir's StateFile.
func ReadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (start one with make netns-cluster)", ErrNoCluster, dir)
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

// WriteState writes s to dir's StateFile atomically.
func WriteState(dir string, s *State) error {
	return daemon.WriteJSON(filepath.Join(dir, StateFile), s)
}

// Host resolves a name given to make netns-shell: a host of the cluster, or
// ClientAlias for client-1 (the client pod on node1).
func (s *State) Host(name string) (host, ns string, err error) {
	if name == ClientAlias {
		name = proxytest.Client1
	}
	if ns, ok := s.Namespaces[name]; ok {
		return name, ns, nil
	}
	hosts := make([]string, 0, len(s.Namespaces)+1)
	for h := range s.Namespaces {
		hosts = append(hosts, h)
	}
	hosts = append(hosts, ClientAlias)
	sort.Strings(hosts)
	return "", "", fmt.Errorf("no host %q in the cluster; one of: %s", name, strings.Join(hosts, ", "))
}

// Example is what the hints say about ExampleManifest.
type Example struct {
	Service   string
	ClusterIP netip.Addr
	Port      int32
	NodePort  int32
	// Backends are the pods the EndpointSlices name, sorted.
	Backends []string
}

// LoadExample decodes ExampleManifest under root strictly (Kubernetes
// scheme) and checks it against the topology: a ClusterIP in the service
// range, one TCP port with a NodePort, EndpointSlices of that Service whose
// addresses are pods of the topology, on their nodes, on the echo port.
func LoadExample(root string, t *proxytest.Topology) (*Example, error) {
	path := filepath.Join(root, filepath.FromSlash(ExampleManifest))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)
	objs, err := deploy.Decode(codecs.UniversalDeserializer(), data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var svc *v1.Service
	var eps []*discovery.EndpointSlice
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			if svc != nil {
				return nil, fmt.Errorf("%s: more than one Service", path)
			}
			svc = o
		case *discovery.EndpointSlice:
			eps = append(eps, o)
		default:
			return nil, fmt.Errorf("%s: unexpected %T", path, o)
		}
	}
	if svc == nil || len(eps) == 0 {
		return nil, fmt.Errorf("%s: want a Service and its EndpointSlices", path)
	}
	ex := &Example{Service: svc.Name}
	if ex.ClusterIP, err = netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !t.ServiceCIDR4.Contains(ex.ClusterIP) {
		return nil, fmt.Errorf("%s: clusterIP %q: want an address in %s", path, svc.Spec.ClusterIP, t.ServiceCIDR4)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Protocol != v1.ProtocolTCP || svc.Spec.Ports[0].NodePort == 0 {
		return nil, fmt.Errorf("%s: want one TCP port with a nodePort", path)
	}
	ex.Port, ex.NodePort = svc.Spec.Ports[0].Port, svc.Spec.Ports[0].NodePort
	for _, sl := range eps {
		if sl.Namespace != svc.Namespace || sl.Labels[discovery.LabelServiceName] != svc.Name {
			return nil, fmt.Errorf("%s: EndpointSlice %s/%s does not belong to Service %s/%s", path, sl.Namespace, sl.Name, svc.Namespace, svc.Name)
		}
		if len(sl.Ports) != 1 || sl.Ports[0].Port == nil || *sl.Ports[0].Port != proxytest.EchoPort ||
			sl.Ports[0].Name == nil || *sl.Ports[0].Name != svc.Spec.Ports[0].Name {
			return nil, fmt.Errorf("%s: EndpointSlice %s: want one port %q %d (the pods' echo servers)", path, sl.Name, svc.Spec.Ports[0].Name, proxytest.EchoPort)
		}
		for _, ep := range sl.Endpoints {
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				host, ok := t.Host(t.HostByAddr(ip))
				if err != nil || !ok || host.Role != proxytest.RolePod || ep.NodeName == nil || *ep.NodeName != host.Node {
					return nil, fmt.Errorf("%s: endpoint %s: want the address of a pod, with its node as nodeName", path, a)
				}
				ex.Backends = append(ex.Backends, host.Name)
			}
		}
	}
	sort.Strings(ex.Backends)
	ex.Backends = slices.Compact(ex.Backends)
	return ex, nil
}

// URL is the Service's ClusterIP as an HTTP URL.
func (ex *Example) URL() string {
	if ex.Port == 80 {
		return "http://" + ex.ClusterIP.String() + "/"
	}
	return "http://" + netip.AddrPortFrom(ex.ClusterIP, uint16(ex.Port)).String() + "/"
}

// HintOptions say how to render paths and make commands in Hints.
type HintOptions struct {
	// Show renders a path for the reader (relative to the repository root
	// when under it). Default: as is.
	Show func(path string) string
	// MakeArgs are appended to every make command (NSCLUSTER_DIR=... when the
	// state directory is not the default).
	MakeArgs string
	// BinDir holds the kubectl wrapper and kpt-echo.
	BinDir string
}

// Hints is what make netns-cluster prints once the cluster runs: what runs where,
// the KUBECONFIG and the commands to try.
func Hints(s *State, ex *Example, o HintOptions) string {
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
	w("kproxy local cluster is running (daemon pid %d; make netns-cluster-down removes it).", s.PID)
	w("")
	w("  control-plane  kube-apiserver %s and etcd, built from Go modules", s.APIServer)
	for _, n := range s.Nodes {
		w("  %-13s  %-14s kproxy --proxy-mode %-9s pods %s", n.Name, n.IPv4, n.Mode, strings.Join(n.Pods, " "))
	}
	w("  every pod runs an echo server on port %d (TCP and UDP; HTTP answers with the pod's name)", s.EchoPort)
	dir := filepath.Dir(s.Kubeconfig)
	w("  logs: %s (this daemon), %s/ (kproxy), %s/ (kube-apiserver, etcd, audit)",
		show(filepath.Join(dir, LogFile)), show(filepath.Join(dir, LogDir)), show(filepath.Join(dir, "controlplane")))
	w("")
	w("KUBECONFIG=%s", s.Kubeconfig)
	w("")
	w("The API server is reachable only inside the cluster's network namespaces: the kubectl")
	w("in %s runs kubectl v1.37.2 (built from Go modules) in the control-plane namespace.", show(o.BinDir))
	w("Try it, from the repository root:")
	w("")
	w("  export KUBECONFIG=%s PATH=%s:$PATH", s.Kubeconfig, o.BinDir)
	w("  kubectl get nodes")
	w("  # Service %s (ClusterIP %s, NodePort %d) and its EndpointSlice, written by hand in", ex.Service, netip.AddrPortFrom(ex.ClusterIP, uint16(ex.Port)), ex.NodePort)
	w("  # the file because no controller manager runs here: pods %s", strings.Join(ex.Backends, ", "))
	w("  kubectl apply -f %s", ExampleManifest)
	w("  # a shell in pod %s on node1 (kproxy iptables): curl is answered by one of the", proxytest.Client1)
	w("  # Service's pods, kpt-echo probe makes ten new connections and shows the spread")
	w("  %s", mk("netns-shell POD="+ClientAlias))
	w("      curl %s", ex.URL())
	w("      kpt-echo probe -addr %s -count 10", netip.AddrPortFrom(ex.ClusterIP, uint16(ex.Port)))
	w("      exit")
	w("  # the same from pod %s on node2 (kproxy nftables); a NodePort from outside the cluster", proxytest.Client2)
	w("  %s", mk("netns-shell POD="+proxytest.Client2))
	if len(s.Nodes) > 0 {
		w("  %s CMD=\"curl -s http://%s:%d/\"", mk("netns-shell POD="+proxytest.Outside), s.Nodes[0].IPv4, ex.NodePort)
	}
	w("  # everything goes: namespaces, processes, %s", show(dir))
	w("  %s", mk("netns-cluster-down"))
	return b.String()
}
