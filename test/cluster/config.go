package cluster

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kproxy/kproxy/test/cluster/images"
)

// CNIBinDir is where Debian's containernetworking-plugins installs the
// plugins (bridge, host-local, loopback, portmap).
const CNIBinDir = "/usr/lib/cni"

// RuncBinary is Debian's runc.
const RuncBinary = "/usr/sbin/runc"

// ContainerdConfig is a node's containerd configuration (version 4, that of
// containerd 2.4): everything under the node's directory, the CRI plugin with
// the pause image built here as the sandbox, runc with cgroupfs (the
// kubelet's driver), the node's CNI configuration, and pod network
// namespaces mounted under the state directory. NRI is off: its socket path
// is fixed, and two containerds on one host would share it. restrictOOM
// keeps every container's oom_score_adj at or above containerd's own, for
// machines without CAP_SYS_RESOURCE, where a negative one cannot be set
// (OOMScoreSettable).
func ContainerdConfig(p NodePaths, restrictOOM bool) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return `# containerd of make cluster (test/cluster): one per node, all state under
# the node's directory.
version = 4
root = ` + q(p.ContainerdRoot) + `
state = ` + q(p.ContainerdState) + `
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = ` + q(p.ContainerdSocket) + `
  [plugins.'io.containerd.server.v1.ttrpc']
    address = ` + q(p.ContainerdSocket+".ttrpc") + `
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = ` + q(p.ContainerdRoot+"/image-verifier") + `
  [plugins.'io.containerd.internal.v1.opt']
    path = ` + q(p.ContainerdRoot+"/opt") + `
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = ` + q(images.Pause) + `
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = ` + fmt.Sprint(restrictOOM) + `
    enable_unprivileged_ports = true
    enable_unprivileged_icmp = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = ` + q(RuncBinary) + `
          Root = ` + q(p.RuncRoot) + `
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [` + q(CNIBinDir) + `]
      conf_dir = ` + q(p.CNIConfDir) + `
`
}

// CNIConfig is a node's CNI network: the bridge plugin (cni0, the node's
// pod CIDR from host-local, hairpin mode so a pod reaches itself through a
// Service), portmap for hostPort, loopback by the runtime. No masquerade:
// the nodes route every pod CIDR (test/netns), and the Service proxy
// masquerades what it must.
func CNIConfig(n Node, p NodePaths) string {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kproxy-cluster",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      "cni0",
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": p.CNIState,
					"ranges":  [][]map[string]string{{{"subnet": n.PodCIDR.String(), "gateway": n.Gateway.String()}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return string(b) + "\n"
}

// KernelTunables are the host-wide sysctls (not per network namespace) the
// kubelet wants at these values; it would write them on the machine
// (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) or, with
// protectKernelDefaults, refuse to start. In each node's mount namespace
// (and only there) a file with the wanted value is mounted over each, so the
// kubelet finds them as it wants them and the machine keeps its own.
var KernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// KubeletConfig is a node's KubeletConfiguration: cgroupfs under the
// cluster's cgroup (cgroup v1 accepted: failCgroupV1 false), its own root,
// logs and plugin directories, the node's containerd, webhook
// authentication and authorization with the cluster CA for clients, the
// cluster DNS, protectKernelDefaults (see KernelTunables), and eviction
// thresholds low enough for a shared development machine.
func KubeletConfig(n Node, p NodePaths, cgroupRoot, caFile string) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# make cluster (test/cluster): the kubelet of ` + n.Name + `.
address: ` + q(n.IP.String()) + `
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ` + q(caFile) + `
authorization:
  mode: Webhook
containerRuntimeEndpoint: ` + q("unix://"+p.ContainerdSocket) + `
cgroupDriver: cgroupfs
cgroupRoot: ` + q(cgroupRoot) + `
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
clusterDNS: [` + q(DNSIP.String()) + `]
clusterDomain: ` + q(DNSDomain) + `
resolvConf: ` + q(p.ResolvConf) + `
podLogsDir: ` + q(p.PodLogs) + `
volumePluginDir: ` + q(p.KubeletRoot+"/volume-plugins") + `
staticPodPath: ""
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
maxPods: 110
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
evictionPressureTransitionPeriod: 10s
`
}

// ResolvConf is the kubelets' resolv.conf: the node network's router,
// which answers nothing (the machine's name server is not reachable from the
// cluster's namespaces): CoreDNS forwards there and gets no answer for names
// outside the cluster.
func ResolvConf(router string) string {
	return "# make cluster: no name server outside the cluster is reachable\nnameserver " + router + "\noptions timeout:1 attempts:1\n"
}

// KubeletArgs are a kubelet's command line.
func KubeletArgs(n Node, p NodePaths) []string {
	return []string{
		"--config=" + p.KubeletConfig,
		"--kubeconfig=" + p.KubeletKubeconfig,
		"--root-dir=" + p.KubeletRoot,
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP.String(),
		"--node-labels=" + "topology.kubernetes.io/zone=zone-" + strings.TrimPrefix(n.Name, "node"),
		"--v=1",
	}
}

// ControllerManagerArgs are kube-controller-manager's command line: every
// default controller (EndpointSlice, service accounts, root CA, node
// lifecycle, ...) with a service account each, no CIDR allocation (make
// cluster sets each Node's pod CIDR itself, to the routes it built), no
// leader election.
func ControllerManagerArgs(l Layout, caFile, saKeyFile string) []string {
	return []string{
		"--kubeconfig=" + l.Kubeconfig("kube-controller-manager"),
		"--authentication-kubeconfig=" + l.Kubeconfig("kube-controller-manager"),
		"--authorization-kubeconfig=" + l.Kubeconfig("kube-controller-manager"),
		"--bind-address=127.0.0.1",
		"--root-ca-file=" + caFile,
		"--service-account-private-key-file=" + saKeyFile,
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range=" + ServiceCIDR.String(),
		"--cluster-cidr=" + ClusterCIDR.String(),
		"--allocate-node-cidrs=false",
		"--leader-elect=false",
		"--controllers=*",
		"--v=1",
	}
}

// SchedulerArgs are kube-scheduler's command line.
func SchedulerArgs(l Layout) []string {
	return []string{
		"--kubeconfig=" + l.Kubeconfig("kube-scheduler"),
		"--authentication-kubeconfig=" + l.Kubeconfig("kube-scheduler"),
		"--authorization-kubeconfig=" + l.Kubeconfig("kube-scheduler"),
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
		"--v=1",
	}
}

// APIServerArgs are the flags make cluster adds to test/controlplane's:
// privileged pods (the proxies' DaemonSets), NodeRestriction as kubeadm
// enables it, webhooks and aggregated APIs reached at their endpoints (the
// control plane's namespace runs no Service proxy), no audit log (the
// suite makes millions of requests).
func APIServerArgs() []string {
	return []string{
		"--allow-privileged=true",
		"--enable-admission-plugins=NodeRestriction",
		"--enable-aggregator-routing=true",
		"--kubelet-preferred-address-types=InternalIP",
		"--audit-log-path=",
		"--v=1",
	}
}

// ControlPlaneUsers are the identities of the token file beyond the admin:
// one per kubelet (Node authorization) and the two controllers.
func ControlPlaneUsers() []User {
	users := []User{
		{Name: "system:kube-controller-manager"},
		{Name: "system:kube-scheduler"},
	}
	for _, n := range Nodes {
		users = append(users, User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}})
	}
	return users
}

// User is a control-plane identity (test/controlplane.User).
type User struct {
	Name   string
	Groups []string
}

// kubeconfigName is the file name of a user's kubeconfig.
func kubeconfigName(user string) string {
	switch {
	case strings.HasPrefix(user, "system:node:"):
		return strings.TrimPrefix(user, "system:node:")
	case strings.HasPrefix(user, "system:"):
		return strings.TrimPrefix(user, "system:")
	}
	return user
}

// nodeNamed returns the node called name.
func nodeNamed(name string) (Node, error) {
	for _, n := range Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("no node %q in the cluster", name)
}
