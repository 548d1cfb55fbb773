package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
)

// The cluster's addresses. The node network and the nodes' addresses are
// proxytest.Default's (test/netns builds it); the control plane joins it at
// ControlPlaneIP.
var (
	ControlPlaneIP   = netip.MustParseAddr("192.168.50.10")
	ControlPlaneIPv6 = netip.MustParseAddr("fd00:50::10")
	ClusterCIDR      = netip.MustParsePrefix("10.244.0.0/16")
	ServiceCIDR      = netip.MustParsePrefix("10.96.0.0/16")
	// DNSIP is the kube-dns Service's ClusterIP (the kubelets' clusterDNS).
	DNSIP = netip.MustParseAddr("10.96.0.10")
)

const (
	// DNSDomain is the cluster's DNS domain.
	DNSDomain = "cluster.local"
	// ControlPlaneHost is the control plane's namespace on the node network.
	ControlPlaneHost = "control-plane"
	// NodePortRange is kube-apiserver's --service-node-port-range.
	NodePortRange = "30000-32767"
)

// Node is one node of the cluster.
type Node struct {
	Name    string       `json:"name"`
	IP      netip.Addr   `json:"ip"`
	PodCIDR netip.Prefix `json:"podCIDR"`
	// Gateway is the CNI bridge's address, the first of PodCIDR.
	Gateway netip.Addr `json:"gateway"`
}

// Nodes are the cluster's two nodes.
var Nodes = []Node{
	{Name: "node1", IP: netip.MustParseAddr("192.168.50.1"), PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), Gateway: netip.MustParseAddr("10.244.1.1")},
	{Name: "node2", IP: netip.MustParseAddr("192.168.50.2"), PodCIDR: netip.MustParsePrefix("10.244.2.0/24"), Gateway: netip.MustParseAddr("10.244.2.1")},
}

// Files and directories of the state directory (.build/cluster by default).
const (
	// MarkerFile marks a directory Up created: Down removes no directory
	// without it.
	MarkerFile = ".kproxy-cluster"
	// PIDFile holds the daemon's process id.
	PIDFile = "daemon.pid"
	// IDFile holds the netns cluster ID, written as soon as the namespaces
	// exist, so Down finds them after a crash.
	IDFile = "netns-id"
	// StateFile is written by the daemon once the cluster is ready.
	StateFile = "state.json"
	// LogFile receives the daemon's output.
	LogFile = "cluster.log"
	// KubeconfigFile is the admin kubeconfig (system:masters).
	KubeconfigFile = "kubeconfig"
	// BinDir holds kproxy-cluster and the kubectl wrapper.
	BinDir = "bin"
)

// DefaultDir is the state directory under a repository root.
func DefaultDir(root string) string { return filepath.Join(root, ".build", "cluster") }

// Layout names the paths of a cluster's state directory.
type Layout struct{ Dir string }

func (l Layout) path(elem ...string) string {
	return filepath.Join(append([]string{l.Dir}, elem...)...)
}

// ControlPlaneDir holds the control plane's certificates, etcd data and logs.
func (l Layout) ControlPlaneDir() string { return l.path("controlplane") }

// Deploy is the copy of the repository's deploy/ that kproxy is applied from.
func (l Layout) Deploy() string { return l.path("deploy") }

// Manifests holds the manifests of the cluster's add-ons (CoreDNS, kube-proxy).
func (l Layout) Manifests() string { return l.path("manifests") }

// Logs holds the logs of the controllers.
func (l Layout) Logs() string { return l.path("logs") }

// Kubeconfig is the kubeconfig file of a control-plane user.
func (l Layout) Kubeconfig(name string) string { return l.path("kubeconfigs", name+".kubeconfig") }

// CgroupName is the cgroup (below each hierarchy's root) that holds every
// process of the cluster of dir: the daemon and what it starts, the
// kubelets' pods. It is derived from the directory, so Down finds it after
// a crash, and two clusters in two directories never share one.
func CgroupName(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return "kproxy-cluster-" + hex.EncodeToString(sum[:4])
}

// NodePaths are one node's files, all under <dir>/<node>.
type NodePaths struct {
	Dir string
	// MountNS is the bind mount of the node's mount namespace, shared by its
	// containerd, kubelet and containers (see package doc).
	MountNS          string
	ContainerdConfig string
	ContainerdRoot   string
	ContainerdState  string
	ContainerdSocket string
	// RuncRoot is runc's state directory (--root).
	RuncRoot string
	// KubeletRoot is the kubelet's --root-dir (pods, volumes, plugins).
	KubeletRoot       string
	KubeletConfig     string
	KubeletKubeconfig string
	// PodLogs is the kubelet's podLogsDir (containers' logs).
	PodLogs string
	// CNIConfDir holds the node's CNI configuration; CNIState is host-local's
	// dataDir; CNICache is mounted on /var/lib/cni in the node's mount
	// namespace (libcni's cache); RunContainerd on /run/containerd (the
	// shims' sockets).
	CNIConfDir    string
	CNIState      string
	CNICache      string
	RunContainerd string
	// VarLibKubelet is mounted on /var/lib/kubelet and VarLogContainers
	// on /var/log/containers: paths the kubelet uses whatever its root
	// directory (the device plugins' socket directory, the containers' log
	// links), which two kubelets would otherwise share on the machine.
	VarLibKubelet    string
	VarLogContainers string
	// Sysctl holds the files mounted over host-wide sysctls the kubelet
	// checks (see KernelTunables).
	Sysctl string
	// ResolvConf is the kubelet's resolvConf (the pods of dnsPolicy Default,
	// CoreDNS's upstream).
	ResolvConf string
	// ContainerdLog and KubeletLog are the two daemons' output.
	ContainerdLog string
	KubeletLog    string
}

// Node returns the paths of node name.
func (l Layout) Node(name string) NodePaths {
	d := l.path(name)
	j := func(elem ...string) string { return filepath.Join(append([]string{d}, elem...)...) }
	return NodePaths{
		Dir:               d,
		MountNS:           j("mntns"),
		ContainerdConfig:  j("containerd", "config.toml"),
		ContainerdRoot:    j("containerd", "root"),
		ContainerdState:   j("containerd", "state"),
		ContainerdSocket:  j("containerd", "containerd.sock"),
		RuncRoot:          j("containerd", "runc"),
		KubeletRoot:       j("kubelet"),
		KubeletConfig:     j("kubelet-config.yaml"),
		KubeletKubeconfig: j("kubelet.kubeconfig"),
		PodLogs:           j("pod-logs"),
		CNIConfDir:        j("cni", "net.d"),
		CNIState:          j("cni", "ipam"),
		CNICache:          j("cni", "cache"),
		RunContainerd:     j("run-containerd"),
		VarLibKubelet:     j("var-lib-kubelet"),
		VarLogContainers:  j("var-log-containers"),
		Sysctl:            j("sysctl"),
		ResolvConf:        j("resolv.conf"),
		ContainerdLog:     j("containerd.log"),
		KubeletLog:        j("kubelet.log"),
	}
}

// maxSocketPath is the longest unix socket path that fits sun_path with
// room for the suffixes containerd and the kubelet add (".ttrpc", the
// plugins' sockets under the kubelet's root).
const maxSocketPath = 80

// CheckPaths fails when the state directory is too deep for the sockets
// the node daemons make under it.
func (l Layout) CheckPaths() error {
	for _, n := range Nodes {
		p := l.Node(n.Name)
		for _, s := range []string{p.ContainerdSocket + ".ttrpc", filepath.Join(p.KubeletRoot, "pod-resources", "kubelet.sock")} {
			if len(s) > maxSocketPath {
				return fmt.Errorf("the state directory %s is too long for the unix sockets under it (%s: %d bytes, at most %d): use a shorter CLUSTER_DIR", l.Dir, s, len(s), maxSocketPath)
			}
		}
	}
	return nil
}
