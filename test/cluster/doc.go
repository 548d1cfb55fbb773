// Package cluster is make cluster: a real Kubernetes cluster on one Linux
// machine, with kproxy (or upstream kube-proxy) deployed as a DaemonSet the
// way users deploy it, for the quick start and for upstream's e2e suite
// (test/conformance).
//
//	lan bridge (node network 192.168.50.0/24)
//	├── control-plane .10  kube-apiserver :6443 (Node,RBAC; lease reconciler), etcd,
//	│                      kube-controller-manager, kube-scheduler; routes to the pod CIDRs
//	├── node1 .1           containerd v2 + kubelet + CNI bridge cni0 10.244.1.0/24
//	│   └── pods: CoreDNS, the proxy's DaemonSet pod (host network), workloads
//	├── node2 .2           the same, 10.244.2.0/24 (each node routes the other's pod CIDR)
//	└── outside .100
//
// Everything runs from binaries built from Go modules (test/controlplane:
// Ensure and EnsureCluster) and images written offline (test/cluster/images,
// make images for kproxy's), imported into each node's containerd: nothing is
// pulled.
//
// Isolation. Nothing is created in, or listens in, the machine's network
// namespace (test/netns builds the namespaces). Each node also has a mount
// namespace of its own (a private copy of the machine's, bound to
// <dir>/<node>/mntns), entered by its containerd, its kubelet and so its
// containers: the kubelet's volume mounts are the runtime's, and all of them
// vanish with the namespace. In it, files are mounted over the host-wide
// sysctls the kubelet insists on (KernelTunables), so the kubelet never
// writes the machine's kernel.panic or vm.overcommit_memory; the node's own
// directories over /var/lib/cni and /run/containerd (paths containerd and
// libcni do not let one configure); and /run/netns is unmounted, so the
// machine's named network namespaces are not kept alive by it. Every
// process of the cluster runs below one cgroup (CgroupName: the daemon joins
// it first, the kubelets put their pods under it with cgroupRoot), so one
// walk of it finds them all. Every path is under the state directory.
//
// Commands (cmd/kproxy-cluster):
//
//   - Up (make cluster) builds or finds the binaries and images, starts the
//     daemon in its own session, follows its log until the cluster is
//     ready, then prints the KUBECONFIG and the quick start.
//   - Run is the daemon: cgroups, namespaces, control plane, controllers,
//     per node a mount namespace, containerd, the images, a kubelet; Node
//     pod CIDRs; CoreDNS, kube-proxy's ConfigMap (kubeadm's), then the
//     proxy: kproxy by kubectl apply -k of a copy of deploy/ (the kubeadm
//     overlay after saving the ConfigMap as docs/install.md says, or deploy/
//     edited as it says), or upstream kube-proxy as kubeadm's DaemonSet.
//     It waits for the nodes, the proxy and CoreDNS, writes state.json,
//     and tears everything down on SIGTERM.
//   - Down (make cluster-down) stops the daemon and then removes whatever
//     is left, also after a crash or a SIGKILL: every process below the
//     cluster's cgroup (containers, shims), the mounts under the state
//     directory, the cluster's network namespaces, its cgroups, and the
//     state directory.
//   - Kubectl (<dir>/bin/kubectl) and Shell (make node-shell) run kubectl or
//     a shell in the cluster's namespaces: the API server is only reachable
//     there.
package cluster
