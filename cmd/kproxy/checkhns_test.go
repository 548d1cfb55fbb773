package main

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
)

func runCheck(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"check-hns"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheckHNSNeedsWindows(t *testing.T) {
	code, _, stderr := runCheck(t)
	if code == 0 {
		t.Fatalf("check-hns without HNS must fail; stderr: %s", stderr)
	}
	if runtime.GOOS != "windows" && !strings.Contains(stderr, "needs Windows") {
		t.Errorf("stderr %q does not say it needs Windows", stderr)
	}
}

func TestCheckHNSFakeExact(t *testing.T) {
	code, stdout, stderr := runCheck(t, "--fake=exact")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "FIELD") || !strings.Contains(stdout, "OK: HNS returned every field") {
		t.Errorf("stdout:\n%s", stdout)
	}
}

func TestCheckHNSFakeDrop(t *testing.T) {
	code, stdout, _ := runCheck(t, "--fake=drop", "--cluster-ip=198.18.5.1")
	if code != 1 {
		t.Fatalf("exit %d, want 1 (fields not returned)\n%s", code, stdout)
	}
	if !strings.Contains(stdout, "(not returned)") || !strings.Contains(stdout, "198.18.5.1:80") || strings.Contains(stdout, "PROBLEM") {
		t.Errorf("stdout:\n%s", stdout)
	}
}

func TestCheckHNSUsage(t *testing.T) {
	if code, _, _ := runCheck(t, "--fake=maybe"); code != 2 {
		t.Errorf("exit %d for a bad --fake, want 2", code)
	}
	if code, _, _ := runCheck(t, "--fake=exact", "--node-ip=nope"); code != 2 {
		t.Errorf("exit %d for a bad --node-ip, want 2", code)
	}
}

func TestCheckHNSFakeDropAll(t *testing.T) {
	code, stdout, _ := runCheck(t, "--fake=drop-all")
	if code != 1 {
		t.Fatalf("exit %d, want 1 (fields not returned)\n%s", code, stdout)
	}
	if !strings.Contains(stdout, "FrontendVIPs") || !strings.Contains(stdout, "(not returned)") || strings.Contains(stdout, "PROBLEM") {
		t.Errorf("stdout:\n%s", stdout)
	}
}
