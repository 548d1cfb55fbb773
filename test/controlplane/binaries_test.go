package controlplane

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionsMatchWrapperModules keeps the cache key honest: the constants
// must name what modules/*/go.mod really build.
func TestVersionsMatchWrapperModules(t *testing.T) {
	tests := []struct {
		gomod string
		want  []string // "module version" pairs that must appear in a require or replace line
	}{
		{"modules/etcd/go.mod", []string{"go.etcd.io/etcd/server/v3 " + EtcdVersion}},
		{"modules/kube-apiserver/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"k8s.io/api => k8s.io/api " + StagingVersion,
			"k8s.io/apiserver => k8s.io/apiserver " + StagingVersion,
			"k8s.io/client-go => k8s.io/client-go " + StagingVersion,
		}},
		{"modules/kube-proxy/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"tool k8s.io/kubernetes/cmd/kube-proxy",
			"k8s.io/kube-proxy => k8s.io/kube-proxy " + StagingVersion,
			"k8s.io/client-go => k8s.io/client-go " + StagingVersion,
		}},
		{"modules/kubectl/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"tool k8s.io/kubernetes/cmd/kubectl",
			"k8s.io/kubectl => k8s.io/kubectl " + StagingVersion,
			"k8s.io/cli-runtime => k8s.io/cli-runtime " + StagingVersion,
		}},
		{"modules/kubelet/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"tool k8s.io/kubernetes/cmd/kubelet",
			"k8s.io/kubelet => k8s.io/kubelet " + StagingVersion,
		}},
		{"modules/kube-controller-manager/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"tool k8s.io/kubernetes/cmd/kube-controller-manager",
			"k8s.io/kube-controller-manager => k8s.io/kube-controller-manager " + StagingVersion,
		}},
		{"modules/kube-scheduler/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"tool k8s.io/kubernetes/cmd/kube-scheduler",
			"k8s.io/kube-scheduler => k8s.io/kube-scheduler " + StagingVersion,
		}},
		{"modules/e2e/go.mod", []string{
			"k8s.io/kubernetes " + KubernetesVersion,
			"k8s.io/kubernetes/test/images/agnhost",
			"k8s.io/client-go => k8s.io/client-go " + StagingVersion,
		}},
		{"modules/containerd/go.mod", []string{"github.com/containerd/containerd/v2 " + ContainerdVersion}},
		{"modules/coredns/go.mod", []string{"github.com/coredns/coredns " + CoreDNSVersion}},
	}
	for _, tt := range tests {
		t.Run(tt.gomod, func(t *testing.T) {
			data, err := os.ReadFile(tt.gomod)
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s does not contain %q", tt.gomod, w)
				}
			}
		})
	}
}

// TestKubeAPIServerReplacesAllStaging checks that every k8s.io module the
// kube-apiserver, kube-proxy and kubectl wrappers replace is pinned to StagingVersion
// (a stray version would build a mixed server).
func TestKubeAPIServerReplacesAllStaging(t *testing.T) {
	for _, gomod := range []string{"modules/kube-apiserver/go.mod", "modules/kube-proxy/go.mod", "modules/kubectl/go.mod",
		"modules/kubelet/go.mod", "modules/kube-controller-manager/go.mod", "modules/kube-scheduler/go.mod", "modules/e2e/go.mod"} {
		t.Run(gomod, func(t *testing.T) { checkStagingReplaces(t, gomod) })
	}
}

func checkStagingReplaces(t *testing.T, gomod string) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		from, to, ok := strings.Cut(strings.TrimSpace(line), "=>")
		if !ok {
			continue
		}
		n++
		fields := strings.Fields(to)
		if len(fields) != 2 || fields[0] != strings.TrimSpace(from) || fields[1] != StagingVersion {
			t.Errorf("replace %q: want %s => %s %s", line, strings.TrimSpace(from), strings.TrimSpace(from), StagingVersion)
		}
	}
	if n < 30 {
		t.Errorf("found %d replace lines, want one per staging module (31 or more)", n)
	}
}

func TestKubeMajorMinor(t *testing.T) {
	tests := []struct{ in, major, minor string }{
		{"v1.37.2", "1", "37"},
		{"1.30.0", "1", "30"},
		{"v1", "", ""},
	}
	for _, tt := range tests {
		if major, minor := kubeMajorMinor(tt.in); major != tt.major || minor != tt.minor {
			t.Errorf("kubeMajorMinor(%q) = %q, %q; want %q, %q", tt.in, major, minor, tt.major, tt.minor)
		}
	}
}

func TestDefaultCacheDir(t *testing.T) {
	key := EtcdVersion + "-" + KubernetesVersion
	tests := []struct {
		name, root, override, want string
	}{
		{"repo build dir", "/src/kproxy", "", filepath.Join("/src/kproxy", ".build", "controlplane", key)},
		{"override keeps the version key", "/src/kproxy", "/var/cache/cp", filepath.Join("/var/cache/cp", key)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultCacheDir(tt.root, tt.override); got != tt.want {
				t.Errorf("DefaultCacheDir(%q, %q) = %q, want %q", tt.root, tt.override, got, tt.want)
			}
		})
	}
}

func TestRepoRoot(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("repo/go.mod", "// comment\nmodule "+ModulePath+"\n\ngo 1.26\n")
	write("repo/test/controlplane/modules/etcd/go.mod", "module "+ModulePath+"/test/controlplane/modules/etcd\n")
	write("other/go.mod", "module example.com/other\n")

	tests := []struct {
		name, from, want string
		wantErr          bool
	}{
		{"at the root", "repo", "repo", false},
		{"inside a wrapper module", "repo/test/controlplane/modules/etcd", "repo", false},
		{"another module", "other", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RepoRoot(filepath.Join(root, filepath.FromSlash(tt.from)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("RepoRoot error = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != filepath.Join(root, filepath.FromSlash(tt.want)) {
				t.Errorf("RepoRoot = %q, want %q", got, filepath.Join(root, tt.want))
			}
		})
	}

	// The real repository: this package's directory is inside it.
	if got, err := RepoRoot("."); err != nil || !fileExists(filepath.Join(got, modulesDir, "etcd", "go.mod")) {
		t.Errorf("RepoRoot(.) = %q, %v; want the kproxy checkout holding %s", got, err, modulesDir)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// fakeRepo makes a repository root with empty wrapper module directories.
func fakeRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, tg := range append(append(targets(), clusterTargets()...), conformanceTargets()...) {
		if err := os.MkdirAll(filepath.Join(root, filepath.FromSlash(tg.moduleDir)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestEnsureBuildsMissingBinaries(t *testing.T) {
	t.Setenv(envFake, "go")
	t.Setenv("GOWORK", "/elsewhere/go.work") // must not reach the build
	root := fakeRepo(t)
	cache := filepath.Join(t.TempDir(), "cache")
	var logs []string
	o := BuildOptions{
		RepoRoot: root, CacheDir: cache, Go: os.Args[0],
		Logf: func(f string, a ...any) { logs = append(logs, f) },
	}

	bins, err := Ensure(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if bins.Dir != cache || bins.Etcd != filepath.Join(cache, exeName("etcd")) || bins.KubeAPIServer != filepath.Join(cache, exeName("kube-apiserver")) {
		t.Errorf("Ensure = %+v, want both binaries in %s", bins, cache)
	}
	tests := []struct {
		path string
		want []string
	}{
		{bins.Etcd, []string{
			"dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "etcd")), "pkg=.",
			"GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly",
		}},
		{bins.KubeAPIServer, []string{
			"pkg=k8s.io/kubernetes/cmd/kube-apiserver",
			"k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
			"k8s.io/component-base/version.gitMinor=37",
			"GOWORK=off",
		}},
		{bins.KubeProxy, []string{
			"dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "kube-proxy")),
			"pkg=k8s.io/kubernetes/cmd/kube-proxy",
			"k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
			"GOWORK=off",
		}},
		{bins.Kubectl, []string{
			"dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "kubectl")),
			"pkg=k8s.io/kubernetes/cmd/kubectl",
			"k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
			"GOWORK=off",
		}},
	}
	for _, tt := range tests {
		data, err := os.ReadFile(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tt.want {
			if !strings.Contains(string(data), w) {
				t.Errorf("%s was built with\n%s\nwant it to contain %q", tt.path, data, w)
			}
		}
	}
	for _, r := range bins.Results {
		if !r.Built || r.Size == 0 {
			t.Errorf("result %+v: want Built with a size", r)
		}
	}
	if len(logs) == 0 {
		t.Error("no progress was logged during a build")
	}
	leftovers, _ := filepath.Glob(filepath.Join(cache, ".*.tmp"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}

	// A second call finds both binaries and builds nothing: a go command that
	// always fails proves it is not run.
	t.Setenv("KPROXY_CONTROLPLANE_FAKE_GO_FAIL", "1")
	again, err := Ensure(context.Background(), o)
	if err != nil {
		t.Fatalf("second Ensure built again: %v", err)
	}
	for _, r := range again.Results {
		if r.Built {
			t.Errorf("second Ensure rebuilt %s", r.Name)
		}
	}
}

func TestEnsureFailures(t *testing.T) {
	tests := []struct {
		name     string
		noBuild  bool
		goFails  bool
		wantIs   error
		wantText string
	}{
		{name: "no build allowed", noBuild: true, wantIs: ErrNotBuilt, wantText: "etcd missing"},
		{name: "compiler fails", goFails: true, wantText: "compile error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envFake, "go")
			if tt.goFails {
				t.Setenv("KPROXY_CONTROLPLANE_FAKE_GO_FAIL", "1")
			}
			cache := filepath.Join(t.TempDir(), "cache")
			_, err := Ensure(context.Background(), BuildOptions{RepoRoot: fakeRepo(t), CacheDir: cache, Go: os.Args[0], NoBuild: tt.noBuild})
			if err == nil {
				t.Fatal("Ensure succeeded, want an error")
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v is not %v", err, tt.wantIs)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not mention %q", err, tt.wantText)
			}
			if fileExists(filepath.Join(cache, exeName("etcd"))) {
				t.Error("a failed build left a binary in the cache")
			}
		})
	}
}

// TestEnsureClusterBuildsMissingBinaries: every cluster binary is built from
// its wrapper module, containerd without cgo's snapshotters, and
// EnsureConformance builds e2e.test as a test binary, into the cluster cache
// directory; a second call builds nothing.
func TestEnsureClusterBuildsMissingBinaries(t *testing.T) {
	t.Setenv(envFake, "go")
	root := fakeRepo(t)
	cache := filepath.Join(t.TempDir(), "cluster-cache")
	o := BuildOptions{RepoRoot: root, CacheDir: cache, Go: os.Args[0]}
	bins, err := EnsureCluster(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want []string
	}{
		{bins.Kubelet, []string{"verb=build", "dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "kubelet")),
			"pkg=k8s.io/kubernetes/cmd/kubelet", "k8s.io/component-base/version.gitVersion=" + KubernetesVersion, "CGO_ENABLED=0"}},
		{bins.KubeControllerManager, []string{"pkg=k8s.io/kubernetes/cmd/kube-controller-manager"}},
		{bins.KubeScheduler, []string{"pkg=k8s.io/kubernetes/cmd/kube-scheduler"}},
		{bins.Containerd, []string{"dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "containerd")),
			"pkg=github.com/containerd/containerd/v2/cmd/containerd", "tags=urfave_cli_no_docs no_btrfs no_devmapper no_zfs",
			"containerd/v2/version.Version=" + ContainerdVersion}},
		{bins.ContainerdShim, []string{"pkg=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", "no_grpc"}},
		{bins.Ctr, []string{"pkg=github.com/containerd/containerd/v2/cmd/ctr"}},
		{bins.CoreDNS, []string{"dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "coredns")), "pkg=."}},
		{bins.Agnhost, []string{"pkg=k8s.io/kubernetes/test/images/agnhost"}},
		{bins.RegressionIssue74839, []string{"pkg=k8s.io/kubernetes/test/images/regression-issue-74839"}},
	}
	conf, err := EnsureConformance(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	tests = append(tests, []struct {
		path string
		want []string
	}{
		{conf.Ginkgo, []string{"pkg=github.com/onsi/ginkgo/v2/ginkgo"}},
		{conf.E2ETest, []string{"verb=test -c -vet=off", "dir=" + filepath.ToSlash(filepath.Join(root, modulesDir, "e2e")),
			"pkg=k8s.io/kubernetes/test/e2e", "k8s.io/component-base/version.gitVersion=" + KubernetesVersion}},
	}...)
	for _, tt := range tests {
		if filepath.Dir(tt.path) != cache {
			t.Errorf("%s is not in the cache %s", tt.path, cache)
		}
		data, err := os.ReadFile(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tt.want {
			if !strings.Contains(string(data), w) {
				t.Errorf("%s was built with\n%s\nwant it to contain %q", tt.path, data, w)
			}
		}
	}
	if len(bins.Results) != len(clusterTargets()) {
		t.Errorf("%d results for %d targets", len(bins.Results), len(clusterTargets()))
	}
	t.Setenv("KPROXY_CONTROLPLANE_FAKE_GO_FAIL", "1")
	again, err := EnsureCluster(context.Background(), o)
	if err != nil {
		t.Fatalf("second EnsureCluster built again: %v", err)
	}
	for _, r := range again.Results {
		if r.Built {
			t.Errorf("second EnsureCluster rebuilt %s", r.Name)
		}
	}
}

func TestDefaultClusterCacheDir(t *testing.T) {
	key := KubernetesVersion + "-containerd" + ContainerdVersion + "-coredns" + CoreDNSVersion
	if got, want := DefaultClusterCacheDir("/repo", ""), filepath.Join("/repo", ".build", "cluster-bin", key); got != want {
		t.Errorf("DefaultClusterCacheDir = %q, want %q", got, want)
	}
	if got, want := DefaultClusterCacheDir("/repo", "/cache"), filepath.Join("/cache", key); got != want {
		t.Errorf("DefaultClusterCacheDir with override = %q, want %q", got, want)
	}
}

// TestCoreDNSPlugins: the CoreDNS built here links, and orders, every
// plugin of the Corefiles it serves: kubeadm's (the cluster DNS) and the
// one the e2e suite's DNS tests give /coredns of the agnhost image (hosts
// and log; "should support configurable pod resolv.conf" failed while
// hosts was missing). Its cache file is not the one of the build without
// hosts, which a cache would otherwise keep using.
func TestCoreDNSPlugins(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("modules", "coredns", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"errors", "health", "ready", "kubernetes", "prometheus", "forward", "cache", "loop", "reload", "loadbalance", "hosts", "log"} {
		pkg := p
		if p == "prometheus" {
			pkg = "metrics"
		}
		if !strings.Contains(string(src), `_ "github.com/coredns/coredns/plugin/`+pkg+`"`) {
			t.Errorf("modules/coredns does not link plugin %s", pkg)
		}
		if !strings.Contains(string(src), "\t\""+p+"\",\n") {
			t.Errorf("modules/coredns's directives lack %s", p)
		}
	}
	for _, tg := range clusterTargets() {
		if tg.name == "coredns" && (tg.file == "" || tg.file == "coredns") {
			t.Errorf("the coredns target's cache file is %q: a cache holding the build without hosts would be kept", tg.file)
		}
	}
}
