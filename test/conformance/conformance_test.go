package conformance

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const fixture = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="2" errors="0" failures="1" time="125.5">
  <testsuite name="Kubernetes e2e suite" package="/e2e" tests="5" disabled="2" skipped="2" errors="0" failures="1" time="125.5" timestamp="2026-12-05T10:00:00">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="3.2"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="20.4"></testcase>
    <testcase name="[It] [sig-network] Services should be able to preserve UDP traffic when server pod cycles for a NodePort service" classname="Kubernetes e2e suite" status="failed" time="60.1">
      <failure message="" type="failed">[FAILED] timed out waiting for the condition
In [It] at: service.go:123</failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work with the LoadBalancer" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] Networking should check kube-proxy urls" classname="Kubernetes e2e suite" status="skipped" time="1.5"><skipped message="skipped - Requires at least 2 nodes (not 1)"></skipped></testcase>
  </testsuite>
</testsuites>`

func TestReadJUnit(t *testing.T) {
	res, err := ReadJUnit(strings.NewReader(fixture))
	if err != nil {
		t.Fatal(err)
	}
	if res.Duration != 125500*time.Millisecond {
		t.Errorf("duration %v", res.Duration)
	}
	states := map[string]string{}
	for _, r := range res.Tests {
		states[r.Name] = r.State
	}
	want := map[string]string{
		"[SynchronizedBeforeSuite]": "passed",
		"[It] [sig-network] Services should serve a basic endpoint from pods  [Conformance]":                               "passed",
		"[It] [sig-network] Services should be able to preserve UDP traffic when server pod cycles for a NodePort service": "failed",
		"[It] [sig-network] Services should work with the LoadBalancer":                                                    "not-run",
		"[It] [sig-network] Networking should check kube-proxy urls":                                                       "skipped",
	}
	for n, s := range want {
		if states[n] != s {
			t.Errorf("%s: %q, want %q", n, states[n], s)
		}
	}
	c := res.Counts()
	// The passed [SynchronizedBeforeSuite] is no test: one passed. (The
	// first real run said "28 passed" for 15 specs.)
	if c["passed"] != 1 || c["failed"] != 1 || c["skipped"] != 1 || c["not-run"] != 1 {
		t.Errorf("counts %v", c)
	}
	failedSetup := Results{Tests: []Result{{Name: "[SynchronizedBeforeSuite]", State: "failed"}, {Name: "[ReportAfterSuite] x", State: "passed"}}}
	if c := failedSetup.Counts(); c["failed"] != 1 || c["passed"] != 0 {
		t.Errorf("a failed setup node: counts %v, want it failed and the passed report node not counted", c)
	}
	for _, r := range res.Tests {
		if r.State == "failed" && !strings.Contains(r.Message, "timed out waiting") {
			t.Errorf("failure message %q", r.Message)
		}
		if r.State == "skipped" && r.Message != "Requires at least 2 nodes (not 1)" {
			t.Errorf("skip message %q", r.Message)
		}
	}
	if _, err := ReadJUnit(strings.NewReader("not xml")); err == nil {
		t.Error("garbage read as a report")
	}
}

func TestSummary(t *testing.T) {
	res, _ := ReadJUnit(strings.NewReader(fixture))
	s := Summary(Header{Proxy: "kproxy", Mode: "nftables", Commit: "abc", Command: "make conformance", Started: time.Unix(0, 0),
		Focus: DefaultFocus, Skip: SkipRegexp(MachineSkips), Skips: MachineSkips, Evidence: "node1: kproxy_sync_proxy_rules_last_timestamp_seconds 1"}, res)
	for _, want := range []string{
		"# make conformance: kproxy, nftables mode", "**1 passed, 1 failed, 1 skipped by the test itself**, 1 not selected",
		"| failed | [It] [sig-network] Services should be able to preserve UDP traffic", "timed out waiting",
		"| skipped | [It] [sig-network] Networking should check kube-proxy urls<br>Requires at least 2 nodes", "`SCTP` | the kernel has no SCTP",
		"kproxy_sync_proxy_rules_last_timestamp_seconds 1",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "LoadBalancer") {
		t.Error("the summary lists a test the focus and skip left out")
	}
	if strings.Index(s, "| failed |") > strings.Index(s, "| passed |") {
		t.Error("failures are not listed first")
	}
}

func TestCompare(t *testing.T) {
	a, _ := ReadJUnit(strings.NewReader(fixture))
	b, _ := ReadJUnit(strings.NewReader(strings.ReplaceAll(fixture, `status="failed" time="60.1">
      <failure message="" type="failed">[FAILED] timed out waiting for the condition
In [It] at: service.go:123</failure>`, `status="passed" time="60.1">`)))
	out := Compare([]Column{{"kproxy-iptables", a}, {"kube-proxy-iptables", b}})
	if !strings.Contains(out, "| [It] [sig-network] Services should be able to preserve UDP traffic when server pod cycles for a NodePort service | failed | passed |") {
		t.Errorf("the test one run fails and the other passes is not shown side by side:\n%s", out)
	}
	if !strings.Contains(out, "| passed | 1 | 2 |") || !strings.Contains(out, "1 tests passed in every run.") {
		t.Errorf("counts:\n%s", out)
	}
	if strings.Contains(out, "LoadBalancer") {
		t.Error("a test no run selected is listed")
	}
}

func TestArgv(t *testing.T) {
	r := Run{E2ETest: "/b/e2e.test", Ginkgo: "/b/ginkgo", Kubeconfig: "/k", Focus: DefaultFocus, Skip: SkipRegexp(UpstreamSkips, MachineSkips),
		Nodes: 4, ReportDir: "/r", Timeout: 2 * time.Hour, NumNodes: 2}
	argv := r.Argv()
	sep := slices.Index(argv, "--")
	if argv[0] != "/b/ginkgo" || sep < 0 || argv[sep-1] != "/b/e2e.test" {
		t.Fatalf("argv %q: want ginkgo flags, e2e.test, --, its flags", argv)
	}
	for _, want := range []string{"--nodes=4", "--focus=" + DefaultFocus, "--timeout=2h0m0s"} {
		if !slices.Contains(argv[:sep], want) {
			t.Errorf("ginkgo flags %q lack %q", argv[:sep], want)
		}
	}
	for _, want := range []string{"--kubeconfig=/k", "--provider=skeleton", "--report-dir=/r", "--num-nodes=2"} {
		if !slices.Contains(argv[sep:], want) {
			t.Errorf("e2e.test flags %q lack %q", argv[sep:], want)
		}
	}
}

// TestSkipRegexp: the skip expression compiles, matches what each entry
// is for, and leaves the tests the issue is about.
func TestSkipRegexp(t *testing.T) {
	re := regexp.MustCompile(SkipRegexp(UpstreamSkips, MachineSkips))
	for _, name := range []string{
		"[sig-network] LoadBalancers should be able to change the type and ports of a TCP service [Slow]",
		"[sig-network] SCTP [LinuxOnly] should allow creating a basic SCTP service with pod and endpoints",
		"[sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]",
		"[sig-network] Services should be able to handle large requests [Serial]",
		"[sig-network] Networking IPerf2 [Feature:Networking-Performance] [Feature:Networking-IPv6]",
		"[sig-network] Networking IPerf2 [Feature:Networking-Performance] should run iperf2",
	} {
		if !re.MatchString(name) {
			t.Errorf("not skipped: %s", name)
		}
	}
	for _, name := range []string{
		"[sig-network] Services should serve a basic endpoint from pods  [Conformance]",
		"[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
		"[sig-network] DNS should provide DNS for services  [Conformance]",
		"[sig-network] Conntrack should drop INVALID conntrack entries [Privileged]",
	} {
		if re.MatchString(name) {
			t.Errorf("skipped: %s", name)
		}
	}
	for _, s := range append(append([]Skip{}, UpstreamSkips...), MachineSkips...) {
		if s.Why == "" {
			t.Errorf("%s has no reason", s.Regexp)
		}
	}
}
