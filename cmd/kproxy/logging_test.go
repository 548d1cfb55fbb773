package main

import (
	"context"
	"io"
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
	if len(lines) == 0 || !strings.HasPrefix(lines[0], `{"ts":`) || !strings.Contains(stderr.String(), `"msg":"Warning: Configuration problem"`) {
		t.Errorf("log is not JSON:\n%s", stderr.String())
	}
}

// TestConfigurationWarningIsWSeverity: in the text format, a configuration
// warning is a klog WARNING line (it starts with W), not an Info line (run
// in a child process: klog writes to the process's stderr).
func TestConfigurationWarningIsWSeverity(t *testing.T) {
	if os.Getenv("KPROXY_TEST_WARN_CHILD") == "1" {
		os.Exit(run(context.Background(), []string{"--manifests", "../../docs/examples", "--hostname-override", "node1",
			"--dry-run", "--feature-gates=SomeGate=true"}, io.Discard, os.Stderr))
	}
	if runtime.GOOS == "windows" {
		t.Skip("re-executing the test binary is not supported under Wine; the Linux run covers the shared code")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConfigurationWarningIsWSeverity$")
	cmd.Env = append(os.Environ(), "KPROXY_TEST_WARN_CHILD=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kproxy: %v\n%s", err, stderr.String())
	}
	found := false
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, `"Configuration problem"`) && strings.Contains(l, "featureGates") {
			found = true
			if !strings.HasPrefix(l, "W") {
				t.Errorf("configuration warning is not a WARNING line: %q", l)
			}
		}
	}
	if !found {
		t.Errorf("no configuration warning about featureGates:\n%s", stderr.String())
	}
}
