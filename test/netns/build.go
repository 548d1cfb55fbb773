package netns

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// EchoPackage is the import path of the echo server and client binary.
const EchoPackage = "github.com/kproxy/kproxy/test/netns/cmd/kpt-echo"

// GoBuild builds a main package of this module into dir and returns the
// binary's path. It runs the go command found in PATH; the build cache makes
// repeated builds cheap. extra are additional "go build" flags (e.g. "-race").
func GoBuild(ctx context.Context, dir, pkg string, extra ...string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	args := append([]string{"build", "-o", out}, extra...)
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", pkg, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// BuildEcho builds kpt-echo into dir.
func BuildEcho(ctx context.Context, dir string) (string, error) {
	return GoBuild(ctx, dir, EchoPackage)
}
