package main

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// TestJSONLogging: --logging-format=json makes kproxy log JSON lines, as
// kube-proxy does (run in a child process: the format applies to the whole
// process).
func TestJSONLogging(t *testing.T) {
	if os.Getenv("KPROXY_TEST_JSON_CHILD") == "1" {
		os.Exit(run(context.Background(), []string{"--manifests", "../../docs/examples", "--hostname-override", "node1",
			"--dry-run", "--logging-format=json"}, os.Stdout, os.Stderr))
	}
	if runtime.GOOS == "windows" {
		t.Skip("re-executing the test binary is not supported under Wine; the Linux run covers the shared code")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestJSONLogging$")
	cmd.Env = append(os.Environ(), "KPROXY_TEST_JSON_CHILD=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kproxy --logging-format=json: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], `{"ts":`) || !strings.Contains(stderr.String(), `"msg":"Warning: configuration"`) {
		t.Errorf("log is not JSON:\n%s", stderr.String())
	}
}
