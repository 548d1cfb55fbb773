package main

import (
	"bytes"
	"context"
	"net"
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

// check-hns --traffic-only connects through the named Service frontends
// (here, loopback sockets standing for them) and prints a verdict per path;
// the exit status says whether every path tried got through.
func TestCheckHNSTraffic(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()

	code, stdout, stderr := runCheck(t, "--traffic-only", "--traffic-cluster-ip="+ln.Addr().String())
	if code != 0 || !strings.Contains(stdout, "ClusterIP") || !strings.Contains(stdout, "TRAFFIC OK") || strings.Contains(stdout, "FIELD") {
		t.Errorf("a working path: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	code, stdout, _ = runCheck(t, "--traffic-only", "--traffic-cluster-ip="+ln.Addr().String(), "--traffic-node-port="+closedAddr, "--traffic-timeout=2s")
	if code != 1 || !strings.Contains(stdout, "REFUSED") || !strings.Contains(stdout, "TRAFFIC PROBLEMS") {
		t.Errorf("a refused NodePort: exit %d, want 1\n%s", code, stdout)
	}
	// The object check and the traffic check together, on the fake.
	code, stdout, _ = runCheck(t, "--fake=exact", "--traffic", "--traffic-cluster-ip="+ln.Addr().String())
	if code != 0 || !strings.Contains(stdout, "OK: HNS returned every field") || !strings.Contains(stdout, "TRAFFIC OK") {
		t.Errorf("objects and traffic: exit %d\n%s", code, stdout)
	}
	if code, _, _ := runCheck(t, "--traffic-only"); code != 2 {
		t.Errorf("--traffic without a target: exit %d, want 2", code)
	}
	if code, _, _ := runCheck(t, "--traffic-only", "--traffic-dns=10.96.0.10"); code != 2 {
		t.Errorf("--traffic-dns without a port: exit %d, want 2", code)
	}
}
