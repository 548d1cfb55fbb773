package app

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2/ktesting"

	"github.com/kproxy/kproxy/pkg/config"
)

// unreachableKubeconfig writes a kubeconfig whose server is an address
// nothing listens on (a listener opened, then closed) and returns its path
// and the server's URL.
func unreachableKubeconfig(t *testing.T) (string, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := "https://" + l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`, server)
	if err := os.WriteFile(kc, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc, server
}

// TestDryRunUnreachableAPIServer: a dry run against an API server nothing
// answers at ends, within its bound, with an error naming the server
// (it used to wait forever).
func TestDryRunUnreachableAPIServer(t *testing.T) {
	kc, server := unreachableKubeconfig(t)
	o := options(t, "--kubeconfig", kc, "--hostname-override", "node1", "--dry-run")
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	err := RunWith(ctx, o, Deps{Modes: Modes{string(o.ProxyMode()): {}}, Stdout: &out, InitialListTimeout: 300 * time.Millisecond})
	if ctx.Err() != nil {
		t.Fatalf("the dry run was still waiting after %v", time.Since(start))
	}
	if err == nil || !strings.Contains(err.Error(), server) || !strings.Contains(err.Error(), "300ms") {
		t.Errorf("RunWith = %v, want an error naming %s and the bound", err, server)
	}
	if out.Len() != 0 {
		t.Errorf("a failed dry run printed:\n%s", out.String())
	}
}

// TestDryRunBadManifestFails: a dry run over a manifest directory with a
// file that does not parse fails, naming the file, and prints nothing.
func TestDryRunBadManifestFails(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte("apiVersion: v1\nkind: Node\nmetadata: {name: node1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("kind: Service\nmetadata: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options(t, "--manifests", dir, "--hostname-override", "node1", "--dry-run", "--dry-run-output", "state")
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := RunWith(ctx, o, Deps{Modes: Modes{string(o.ProxyMode()): {}}, Stdout: &out})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "bad.yaml")) {
		t.Errorf("RunWith = %v, want an error naming bad.yaml", err)
	}
	if out.Len() != 0 {
		t.Errorf("a failed dry run printed:\n%s", out.String())
	}
}

// TestDryRunFlagNamesTheBound: --dry-run's help states the bound the dry
// run applies.
func TestDryRunFlagNamesTheBound(t *testing.T) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	if u := fs.Lookup("dry-run").Usage; !strings.Contains(u, "within "+DefaultInitialListTimeout.String()) {
		t.Errorf("--dry-run's help %q does not name the %s bound", u, DefaultInitialListTimeout)
	}
}
