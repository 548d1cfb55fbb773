package tools

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Versions of the tools, as this module's go.mod requires them (TestToolVersions checks).
const (
	HelmVersion       = "v4.3.2"
	PrometheusVersion = "v0.316.0"
)

// tool is one binary this module builds from its go.mod's tool directives.
type tool struct {
	name, pkg, version string
	tags               string
}

var tools = map[string]tool{
	"helm": {name: "helm", pkg: "helm.sh/helm/v4/cmd/helm", version: HelmVersion},
	// remove_all_sd leaves out Prometheus's service-discovery plugins
	// (cloud SDKs): promtool's rule checks and unit tests do not use them,
	// and they would triple the build.
	"promtool": {name: "promtool", pkg: "github.com/prometheus/prometheus/cmd/promtool", version: PrometheusVersion, tags: "remove_all_sd"},
}

// RepoRoot is kproxy's checkout: two directories up from this module.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the source")
	}
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("%s is not kproxy's checkout: %w", root, err)
	}
	return root, nil
}

// CacheDir is where the tools are built: $KPROXY_TOOLS_CACHE, else
// <repository>/.build/tools.
func CacheDir() (string, error) {
	if d := os.Getenv("KPROXY_TOOLS_CACHE"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".build", "tools"), nil
}

var buildMu sync.Mutex

// Ensure returns the path of the named tool (helm, promtool), built with
// `go build` from this module (GOFLAGS=-mod=readonly: go.sum pins it) into
// CacheDir()/NAME-VERSION unless it is there. A cold build takes minutes
// (helm: about 8 minutes of CPU on this project's 2-core machines), so make
// tools runs it before the tests.
func Ensure(ctx context.Context, name string, logf func(string, ...any)) (string, error) {
	t, ok := tools[name]
	if !ok {
		return "", fmt.Errorf("no tool %q", name)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, t.name+"-"+t.version)
	buildMu.Lock()
	defer buildMu.Unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", tmp}
	if t.tags != "" {
		args = append(args, "-tags", t.tags)
	}
	args = append(args, t.pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(root, "hack", "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false", "CGO_ENABLED=0")
	start := time.Now()
	if logf != nil {
		logf("building %s %s into %s (minutes when cold)", t.name, t.version, out)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", t.pkg, err, strings.TrimSpace(string(b)))
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	if logf != nil {
		logf("built %s in %v", t.name, time.Since(start).Round(time.Second))
	}
	return out, nil
}
