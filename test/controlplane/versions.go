package controlplane

// Versions of the servers that the wrapper modules under modules/ build. They
// key the binary cache directory and must match the go.mod files there (a unit
// test checks this).
const (
	// EtcdVersion is the go.etcd.io/etcd/server/v3 version of modules/etcd.
	EtcdVersion = "v3.6.16"
	// KubernetesVersion is the k8s.io/kubernetes version of
	// modules/kube-apiserver; its staging modules are pinned to StagingVersion.
	KubernetesVersion = "v1.37.2"
	// StagingVersion is the version of the k8s.io staging modules (k8s.io/api,
	// k8s.io/apiserver, ...) that matches KubernetesVersion.
	StagingVersion = "v0.37.2"
	// ContainerdVersion is the github.com/containerd/containerd/v2 version of
	// modules/containerd (make cluster's container runtime).
	ContainerdVersion = "v2.4.2"
	// CoreDNSVersion is the github.com/coredns/coredns version of
	// modules/coredns: the one kubeadm v1.37 installs.
	CoreDNSVersion = "v1.14.6"
)
