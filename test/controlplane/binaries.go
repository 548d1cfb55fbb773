package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// EnvCacheDir names the environment variable that moves the binary cache. Its
// value replaces "<repo root>/.build/controlplane"; the version directory is
// still appended, so a version bump never reuses stale binaries.
const EnvCacheDir = "KPROXY_CONTROLPLANE_CACHE"

// ModulePath is the path of kproxy's main module; RepoRoot looks for its go.mod.
const ModulePath = "github.com/kproxy/kproxy"

// modulesDir is where the wrapper modules live, relative to the repository root.
const modulesDir = "test/controlplane/modules"

// ErrNotBuilt is returned by Ensure with NoBuild set when a binary is missing.
var ErrNotBuilt = errors.New("control-plane binaries are not built (run: make controlplane, or go run ./test/controlplane/build)")

// Binaries are the paths of the built servers.
type Binaries struct {
	// Dir is the cache directory that holds the binaries.
	Dir           string
	Etcd          string
	KubeAPIServer string
	// KubeProxy is upstream kube-proxy of the same Kubernetes release, for
	// the drop-in swap and the differential tests.
	KubeProxy string
	// Kubectl is upstream kubectl of the same release, for make cluster and
	// the test that uses it.
	Kubectl string
	// Results says, per binary, whether it was built now and how long it took.
	Results []BuildResult
}

// BuildResult describes one binary handled by Ensure.
type BuildResult struct {
	Name string
	Path string
	// Built is false when the binary was already in the cache.
	Built    bool
	Duration time.Duration
	Size     int64
}

// BuildOptions configure Ensure. Zero values pick the defaults.
type BuildOptions struct {
	// RepoRoot is kproxy's repository root (the wrapper modules are under it).
	// Default: found by RepoRoot from the working directory.
	RepoRoot string
	// CacheDir is the directory that receives the binaries, used as is.
	// Default: DefaultCacheDir(RepoRoot, $KPROXY_CONTROLPLANE_CACHE).
	CacheDir string
	// Go is the go command. Default: "go" from PATH.
	Go string
	// NoBuild makes Ensure return ErrNotBuilt instead of building.
	NoBuild bool
	// Logf receives progress lines (a build takes minutes). May be nil.
	Logf func(format string, args ...any)
}

// target is one wrapper module and the package built from it.
type target struct {
	name string
	// file is the cache's file name when it is not name: a new one when
	// the binary's source here changes (the cache is by file name).
	file      string
	moduleDir string // relative to the repository root
	pkg       string // package path given to go build, from moduleDir
	ldflags   string
	tags      string // -tags, when not empty
	// test builds the package's test binary (go test -c) instead.
	test     bool
	coldHint string
}

// kubeLdflags are the -ldflags of a Kubernetes binary: stripped, with the
// version stamps the upstream build scripts would set, so /version, the
// servers' logs and kubernetes_build_info name the real release.
func kubeLdflags() string {
	const versionPkg = "k8s.io/component-base/version"
	major, minor := kubeMajorMinor(KubernetesVersion)
	return strings.Join([]string{
		"-s -w",
		"-X " + versionPkg + ".gitVersion=" + KubernetesVersion,
		"-X " + versionPkg + ".gitMajor=" + major,
		"-X " + versionPkg + ".gitMinor=" + minor,
		"-X " + versionPkg + ".gitTreeState=clean",
	}, " ")
}

func targets() []target {
	kubeLdflags := kubeLdflags()
	return []target{
		{
			name:      "etcd",
			moduleDir: modulesDir + "/etcd",
			pkg:       ".",
			ldflags:   "-s -w",
			coldHint:  "about 2 minutes cold",
		},
		{
			name:      "kube-apiserver",
			moduleDir: modulesDir + "/kube-apiserver",
			pkg:       "k8s.io/kubernetes/cmd/kube-apiserver",
			ldflags:   kubeLdflags,
			coldHint:  "about 7 minutes cold on 2 cores",
		},
		{
			name:      "kube-proxy",
			moduleDir: modulesDir + "/kube-proxy",
			pkg:       "k8s.io/kubernetes/cmd/kube-proxy",
			ldflags:   kubeLdflags,
			coldHint:  "several minutes cold on 2 cores",
		},
		{
			name:      "kubectl",
			moduleDir: modulesDir + "/kubectl",
			pkg:       "k8s.io/kubernetes/cmd/kubectl",
			ldflags:   kubeLdflags,
			coldHint:  "about 2 minutes after kube-apiserver and kube-proxy, whose packages it mostly shares",
		},
	}
}

// kubeMajorMinor splits "v1.37.2" into "1" and "37".
func kubeMajorMinor(v string) (string, string) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return "", ""
	}
	return parts[0], parts[1]
}

// VersionKey names the cache directory for the pinned versions.
func VersionKey() string { return EtcdVersion + "-" + KubernetesVersion }

// DefaultCacheDir returns the cache directory for the pinned versions:
// <base>/<etcd version>-<kubernetes version>, where base is override when
// non-empty and <repoRoot>/.build/controlplane otherwise.
func DefaultCacheDir(repoRoot, override string) string {
	base := override
	if base == "" {
		base = filepath.Join(repoRoot, ".build", "controlplane")
	}
	return filepath.Join(base, VersionKey())
}

// RepoRoot walks up from dir to the directory whose go.mod declares
// ModulePath. The wrapper modules' own go.mod files are passed over.
func RepoRoot(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("finding kproxy repository root from %q: %w", dir, err)
	}
	for d := abs; ; {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && modulePathOf(data) == ModulePath {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.mod for module %s in %s or any parent directory", ModulePath, abs)
		}
		d = parent
	}
}

// modulePathOf returns the module path declared by go.mod data ("" if none).
func modulePathOf(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`)
		}
	}
	return ""
}

// EnsureBinaries returns the control-plane binaries (etcd, kube-apiserver,
// kube-proxy and kubectl), building each one that is missing from the cache directory (see DefaultCacheDir and
// EnvCacheDir). The repository root is found from the working directory.
// logf (may be nil) receives progress lines.
func EnsureBinaries(ctx context.Context, logf func(format string, args ...any)) (Binaries, error) {
	return Ensure(ctx, BuildOptions{Logf: logf})
}

// Ensure is EnsureBinaries with explicit options.
func Ensure(ctx context.Context, o BuildOptions) (Binaries, error) {
	o, err := o.withDefaults(func(root string) string { return DefaultCacheDir(root, os.Getenv(EnvCacheDir)) })
	if err != nil {
		return Binaries{}, err
	}
	bins := Binaries{Dir: o.CacheDir}
	for _, t := range targets() {
		res, err := ensureOne(ctx, o, t)
		if err != nil {
			return Binaries{}, err
		}
		bins.Results = append(bins.Results, res)
		switch t.name {
		case "etcd":
			bins.Etcd = res.Path
		case "kube-apiserver":
			bins.KubeAPIServer = res.Path
		case "kube-proxy":
			bins.KubeProxy = res.Path
		case "kubectl":
			bins.Kubectl = res.Path
		}
	}
	return bins, nil
}

// withDefaults fills the zero fields of o; cacheDir gives the default cache
// directory for a repository root.
func (o BuildOptions) withDefaults(cacheDir func(root string) string) (BuildOptions, error) {
	if o.RepoRoot == "" {
		wd, err := os.Getwd()
		if err != nil {
			return o, fmt.Errorf("finding kproxy repository root: %w", err)
		}
		if o.RepoRoot, err = RepoRoot(wd); err != nil {
			return o, err
		}
	}
	if o.CacheDir == "" {
		o.CacheDir = cacheDir(o.RepoRoot)
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o, nil
}

func exeName(name string) string {
	if runtime.GOOS == "windows" {
		return name + ".exe"
	}
	return name
}

// ensureOne returns the cached binary of t, building it when missing.
func ensureOne(ctx context.Context, o BuildOptions, t target) (BuildResult, error) {
	file := t.name
	if t.file != "" {
		file = t.file
	}
	path := filepath.Join(o.CacheDir, exeName(file))
	res := BuildResult{Name: t.name, Path: path}
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		res.Size = fi.Size()
		return res, nil
	}
	if o.NoBuild {
		return res, fmt.Errorf("%s missing from %s: %w", t.name, o.CacheDir, ErrNotBuilt)
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return res, fmt.Errorf("creating control-plane cache directory: %w", err)
	}

	// Build next to the final path, then rename: an interrupted build never
	// leaves a file that a later run would take for a finished binary, and
	// two concurrent builds end with one complete binary.
	tmp, err := os.CreateTemp(o.CacheDir, "."+t.name+".*.tmp")
	if err != nil {
		return res, fmt.Errorf("creating temporary file for %s: %w", t.name, err)
	}
	tmpPath := tmp.Name()
	_ = tmp.Close()
	defer func() { _ = os.Remove(tmpPath) }() // nothing to remove after the rename

	o.Logf("building %s into %s (%s)", t.name, o.CacheDir, t.coldHint)
	start := time.Now()
	args := []string{"build"}
	if t.test {
		// go test runs vet on the package by default: minutes for e2e's.
		args = []string{"test", "-c", "-vet=off"}
	}
	args = append(args, "-trimpath", "-ldflags", t.ldflags)
	if t.tags != "" {
		args = append(args, "-tags", t.tags)
	}
	cmd := exec.CommandContext(ctx, o.Go, append(args, "-o", tmpPath, t.pkg)...)
	cmd.Dir = filepath.Join(o.RepoRoot, filepath.FromSlash(t.moduleDir))
	cmd.Env = buildEnv(os.Environ())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return res, fmt.Errorf("building %s in %s: %w\n%s", t.name, cmd.Dir, err, tail(out, 4000))
	}
	res.Duration = time.Since(start)
	if err := os.Rename(tmpPath, path); err != nil {
		return res, fmt.Errorf("installing %s: %w", t.name, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return res, fmt.Errorf("checking built %s: %w", t.name, err)
	}
	res.Built, res.Size = true, fi.Size()
	o.Logf("built %s in %s (%.1f MB)", t.name, res.Duration.Round(time.Second), float64(res.Size)/1e6)
	return res, nil
}

// buildEnv is the environment for go build: the caller's, with the settings
// that make the build reproducible and independent of a go.work, a cross
// compilation target or cgo.
func buildEnv(env []string) []string {
	override := map[string]string{
		"GOWORK":      "off",
		"GOFLAGS":     "-mod=readonly -buildvcs=false",
		"CGO_ENABLED": "0",
		"GOOS":        runtime.GOOS,
		"GOARCH":      runtime.GOARCH,
	}
	out := make([]string, 0, len(env)+len(override))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := override[k]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range []string{"GOWORK", "GOFLAGS", "CGO_ENABLED", "GOOS", "GOARCH"} {
		out = append(out, k+"="+override[k])
	}
	return out
}

// tail returns the last n bytes of b, for error messages.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
