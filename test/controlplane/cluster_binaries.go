package controlplane

import (
	"context"
	"os"
	"path/filepath"
)

// EnvClusterCacheDir names the environment variable that moves the cache of
// the cluster binaries (EnsureCluster). Its value replaces
// "<repo root>/.build/cluster-bin"; the version directory is still appended.
const EnvClusterCacheDir = "KPROXY_CLUSTER_CACHE"

// ClusterBinaries are the programs of make cluster beyond the control plane
// of Ensure: the node (kubelet, containerd, its shim and ctr), the
// controllers, the cluster DNS, and the programs of the test images.
type ClusterBinaries struct {
	// Dir is the cache directory that holds the binaries.
	Dir                   string
	Kubelet               string
	KubeControllerManager string
	KubeScheduler         string
	Containerd            string
	ContainerdShim        string
	Ctr                   string
	CoreDNS               string
	// Agnhost and RegressionIssue74839 go into the test images of those names.
	Agnhost              string
	RegressionIssue74839 string
	// Results says, per binary, whether it was built now and how long it took.
	Results []BuildResult
}

// ClusterVersionKey names the cache directory of the cluster binaries.
func ClusterVersionKey() string {
	return KubernetesVersion + "-containerd" + ContainerdVersion + "-coredns" + CoreDNSVersion
}

// DefaultClusterCacheDir returns <base>/<ClusterVersionKey>, where base is
// override when non-empty and <repoRoot>/.build/cluster-bin otherwise.
func DefaultClusterCacheDir(repoRoot, override string) string {
	base := override
	if base == "" {
		base = filepath.Join(repoRoot, ".build", "cluster-bin")
	}
	return filepath.Join(base, ClusterVersionKey())
}

func clusterTargets() []target {
	kube := kubeLdflags()
	const (
		containerdPkg = "github.com/containerd/containerd/v2"
		// Pure Go: no btrfs (cgo), devmapper or zfs snapshotters; the
		// cluster uses overlayfs.
		containerdTags = "urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
	)
	containerdLd := "-s -w -X " + containerdPkg + "/version.Version=" + ContainerdVersion +
		" -X " + containerdPkg + "/version.Package=" + containerdPkg
	return []target{
		{name: "kubelet", moduleDir: modulesDir + "/kubelet", pkg: "k8s.io/kubernetes/cmd/kubelet", ldflags: kube,
			coldHint: "the longest cold build after kube-apiserver"},
		{name: "kube-controller-manager", moduleDir: modulesDir + "/kube-controller-manager", pkg: "k8s.io/kubernetes/cmd/kube-controller-manager", ldflags: kube,
			coldHint: "minutes cold, mostly shared with kube-apiserver"},
		{name: "kube-scheduler", moduleDir: modulesDir + "/kube-scheduler", pkg: "k8s.io/kubernetes/cmd/kube-scheduler", ldflags: kube,
			coldHint: "a minute or two after kube-controller-manager"},
		{name: "containerd", moduleDir: modulesDir + "/containerd", pkg: containerdPkg + "/cmd/containerd", ldflags: containerdLd, tags: containerdTags,
			coldHint: "several minutes cold"},
		{name: "containerd-shim-runc-v2", moduleDir: modulesDir + "/containerd", pkg: containerdPkg + "/cmd/containerd-shim-runc-v2", ldflags: containerdLd,
			tags: containerdTags + " no_grpc", coldHint: "about a minute after containerd"},
		{name: "ctr", moduleDir: modulesDir + "/containerd", pkg: containerdPkg + "/cmd/ctr", ldflags: containerdLd, tags: containerdTags,
			coldHint: "about a minute after containerd"},
		// coredns-hosts: with the hosts plugin (modules/coredns).
		{name: "coredns", file: "coredns-hosts", moduleDir: modulesDir + "/coredns", pkg: ".", ldflags: "-s -w",
			coldHint: "a few minutes cold"},
		{name: "agnhost", moduleDir: modulesDir + "/e2e", pkg: "k8s.io/kubernetes/test/images/agnhost", ldflags: "-s -w",
			coldHint: "a few minutes cold"},
		{name: "regression-issue-74839", moduleDir: modulesDir + "/e2e", pkg: "k8s.io/kubernetes/test/images/regression-issue-74839", ldflags: "-s -w",
			coldHint: "seconds"},
	}
}

// ConformanceBinaries are upstream's end-to-end suite and its runner, for
// make conformance.
type ConformanceBinaries struct {
	Dir string
	// E2ETest is upstream's test/e2e built with go test -c; Ginkgo the CLI
	// that runs it on parallel nodes.
	E2ETest string
	Ginkgo  string
	Results []BuildResult
}

func conformanceTargets() []target {
	return []target{
		{name: "ginkgo", moduleDir: modulesDir + "/e2e", pkg: "github.com/onsi/ginkgo/v2/ginkgo", ldflags: "-s -w",
			coldHint: "a minute cold"},
		{name: "e2e.test", moduleDir: modulesDir + "/e2e", pkg: "k8s.io/kubernetes/test/e2e", ldflags: kubeLdflags(), test: true,
			coldHint: "the longest build of all: every e2e suite and most of Kubernetes"},
	}
}

// EnsureConformance returns e2e.test and ginkgo, building what is missing
// from the cluster cache directory, as EnsureCluster does.
func EnsureConformance(ctx context.Context, o BuildOptions) (ConformanceBinaries, error) {
	o, err := o.withDefaults(func(root string) string {
		return DefaultClusterCacheDir(root, os.Getenv(EnvClusterCacheDir))
	})
	if err != nil {
		return ConformanceBinaries{}, err
	}
	bins := ConformanceBinaries{Dir: o.CacheDir}
	for _, t := range conformanceTargets() {
		res, err := ensureOne(ctx, o, t)
		if err != nil {
			return ConformanceBinaries{}, err
		}
		bins.Results = append(bins.Results, res)
		switch t.name {
		case "ginkgo":
			bins.Ginkgo = res.Path
		case "e2e.test":
			bins.E2ETest = res.Path
		}
	}
	return bins, nil
}

// EnsureCluster returns the cluster binaries, building each one that is
// missing from the cache directory (DefaultClusterCacheDir with
// $KPROXY_CLUSTER_CACHE, unless o.CacheDir is set), the way Ensure does.
func EnsureCluster(ctx context.Context, o BuildOptions) (ClusterBinaries, error) {
	o, err := o.withDefaults(func(root string) string {
		return DefaultClusterCacheDir(root, os.Getenv(EnvClusterCacheDir))
	})
	if err != nil {
		return ClusterBinaries{}, err
	}
	bins := ClusterBinaries{Dir: o.CacheDir}
	paths := map[string]*string{
		"kubelet":                 &bins.Kubelet,
		"kube-controller-manager": &bins.KubeControllerManager,
		"kube-scheduler":          &bins.KubeScheduler,
		"containerd":              &bins.Containerd,
		"containerd-shim-runc-v2": &bins.ContainerdShim,
		"ctr":                     &bins.Ctr,
		"coredns":                 &bins.CoreDNS,
		"agnhost":                 &bins.Agnhost,
		"regression-issue-74839":  &bins.RegressionIssue74839,
	}
	for _, t := range clusterTargets() {
		res, err := ensureOne(ctx, o, t)
		if err != nil {
			return ClusterBinaries{}, err
		}
		bins.Results = append(bins.Results, res)
		*paths[t.name] = res.Path
	}
	return bins, nil
}
