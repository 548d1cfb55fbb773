package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestDryRunExamples runs the command on docs/examples: the desired state of
// a dual-stack Service, an externalTrafficPolicy Local Service, one with only
// terminating endpoints, one with zone hints and one with the source-hash
// algorithm, as node1 in zone-a.
func TestDryRunExamples(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	code := run(ctx, []string{"--manifests", filepath.Join("..", "..", "docs", "examples"),
		"--hostname-override", "node1", "--dry-run", "--dry-run-output", "state"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	golden := filepath.Join("testdata", "examples-state.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != string(want) {
		t.Errorf("dry run output differs from %s (run with -update after checking):\n%s", golden, got)
	}
	for _, must := range []string{
		"10.244.1.40:9000 node=node1 zone=zone-a ready local", // zone hints keep zone-a
		"10.244.2.30:5353 node=node2 serving terminating",     // terminating fallback
		"fd00:96::10", // the IPv6 view of the dual-stack Service
		"10.244.1.20:8443 node=node1 ready local", // Local policy's local endpoint
	} {
		if !strings.Contains(out.String(), must) {
			t.Errorf("output lacks %q", must)
		}
	}
	if strings.Contains(out.String(), "10.244.2.40") {
		t.Errorf("zone-b endpoint used despite zone hints")
	}
}

func TestVersionAndBadFlags(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, &out, &errs); code != 0 || !strings.Contains(out.String(), "kproxy") {
		t.Errorf("--version: exit %d, %q", code, out.String())
	}
	out.Reset()
	errs.Reset()
	if code := run(context.Background(), []string{"--no-such-flag"}, &out, &errs); code != 1 {
		t.Errorf("unknown flag: exit %d", code)
	}
	errs.Reset()
	code := run(context.Background(), []string{"--iptables-masquerade-bit", "40", "--cluster-cidr", "junk", "--dry-run", "--manifests", "."}, &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "masqueradeBit") || !strings.Contains(errs.String(), "clusterCIDR") {
		t.Errorf("invalid config: exit %d, stderr %q (want every bad field listed)", code, errs.String())
	}
}

// TestRunMainSubcommands goes through runMain, the entry point main calls
// (on Windows it also handles --windows-service): the subcommands must be
// dispatched there, not parsed as flags of the proxy.
func TestRunMainSubcommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	if code := runMain(ctx, []string{checkHNSCommand, "--fake=exact"}, &out, &errs); code != 0 {
		t.Errorf("runMain check-hns --fake=exact: exit %d, stderr %q", code, errs.String())
	}
	out.Reset()
	errs.Reset()
	code := runMain(ctx, []string{"explain", "--manifests", filepath.Join("..", "..", "docs", "examples"),
		"--hostname-override", "node1", "--to", "10.96.0.30:53/udp", "--from", "10.244.1.5"}, &out, &errs)
	if code != 0 || !strings.Contains(out.String(), "frontend") {
		t.Errorf("runMain explain: exit %d, stdout %q, stderr %q", code, out.String(), errs.String())
	}
}

// TestIPVSModeDefaultsToRoundRobin: as upstream's ipvs proxier, mode ipvs
// without ipvs.scheduler is rr, which kproxy runs as round robin for the
// Services without a kproxy.io/load-balancing annotation.
func TestIPVSModeDefaultsToRoundRobin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	code := run(ctx, []string{"--manifests", filepath.Join("..", "..", "docs", "examples"), "--hostname-override", "node1",
		"--proxy-mode", "ipvs", "--dry-run", "--dry-run-output", "state"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	if n := strings.Count(out.String(), "algorithm: round-robin"); n == 0 || strings.Contains(out.String(), "algorithm: random") {
		t.Errorf("%d round-robin ports, random ones: %v; want round robin for every port without the annotation:\n%s",
			n, strings.Contains(out.String(), "algorithm: random"), out.String())
	}
	if !strings.Contains(out.String(), "algorithm: source-hash") {
		t.Errorf("the source-hash annotation lost to the node-wide default")
	}
}

// TestDryRunBadManifestExitsNonZero: a dry run over a directory with a
// manifest that does not parse exits 1 (it used to print the rest and exit
// 0) and prints no rules.
func TestDryRunBadManifestExitsNonZero(t *testing.T) {
	// Not t.TempDir: under Wine, removing the unparsable file right after
	// the run fails ("Invalid function") and t.TempDir fails the test for it.
	dir, err := os.MkdirTemp("", "kproxy-dryrun-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("leaving %s: %v", dir, err)
		}
	})
	for name, content := range map[string]string{
		"node.yaml":   "apiVersion: v1\nkind: Node\nmetadata: {name: node1}\n",
		"broken.json": `{"apiVersion": "v1", "kind": "Service",`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	if code := run(ctx, []string{"--manifests", dir, "--hostname-override", "node1", "--dry-run"}, &out, &errs); code != 1 || out.Len() != 0 {
		t.Errorf("exit %d, stdout %q; want 1 and nothing printed", code, out.String())
	}
}

// TestVersionNamesCommit: --version and --version=raw print the commit
// (stamped, or "unknown" in a test binary built without VCS information).
func TestVersionNamesCommit(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{{"--version", "(commit "}, {"--version=raw", "Commit:"}} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), []string{tc.arg}, &out, &errs); code != 0 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%s: exit %d, stdout %q; want 0 and %q", tc.arg, code, out.String(), tc.want)
		}
	}
}
