package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// explainRun runs `kproxy explain` on docs/examples as node1 and returns
// its exit code, stdout and stderr.
func explainRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--manifests", "../../docs/examples"}, args...)
	code := runExplain(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestExplainOperatorFindings: what an operator trying `kproxy explain`
// ran into (issue 26), each a case that failed before.
func TestExplainOperatorFindings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		want     []string // in stdout (code 0) or stderr
		dontWant []string
	}{
		{name: "the help's first example runs without --from",
			args: []string{"--hostname-override", "node1", "--to", "10.96.0.30:53/udp"}, code: 0,
			want: []string{"frontend    ClusterIP 10.96.0.30:53 of demo/draining", "is a placeholder"}},
		{name: "a port miss names the Service that has the address",
			args: []string{"--hostname-override", "node1", "--to", "10.96.0.30:54/udp"}, code: 0,
			want: []string{"frontend    none", "10.96.0.30 is an address of ClusterIP of demo/draining", "(53/udp), but not on port 54/udp"}},
		{name: "a misspelt --node is an error",
			args: []string{"--node", "nod1", "--to", "10.96.0.30:53/udp"}, code: 1,
			want: []string{`--node "nod1": no Node of that name`}},
		{name: "--from-outside without --from uses the documented client",
			args: []string{"--hostname-override", "node1", "--from-outside", "--to", "10.96.0.30:53/udp"}, code: 0,
			want: []string{"from 203.0.113.10 (outside)"}},
		{name: "the cluster CIDR gives the pod client when the Node has no pod CIDR",
			args: []string{"--hostname-override", "node1", "--cluster-cidr", "10.244.0.0/16", "--to", "10.96.0.30:53/udp"}, code: 0,
			want: []string{"from 10.244.0.2 (pod)", "an address of --cluster-cidr"}, dontWant: []string{"placeholder"}},
		{name: "a pod reaching an eTP Local NodePort is short-circuited, and the decisions say so",
			args: []string{"--hostname-override", "node1", "--cluster-cidr", "10.244.0.0/16", "--to", "192.168.50.11:30443"}, code: 0,
			want:     []string{"verdict     DNAT", "short-circuited to the cluster-wide endpoints (3)"},
			dontWant: []string{"connections are dropped", "may short-circuit"}},
		{name: "a Service port without endpoints whose slices have them under another name says so",
			args: []string{"--manifests", "testdata/port-name-mismatch", "--hostname-override", "node1", "--proxy-mode", "iptables", "--to", "10.96.0.80:80"}, code: 0,
			want: []string{"verdict     REJECT", `ready endpoints on port(s) named "web" (tcp), but this Service port is named "http"`}},
		{name: "kernelspace drops what it cannot reject, and says so without contradiction",
			args: []string{"--manifests", "testdata/port-name-mismatch", "--hostname-override", "node1", "--proxy-mode", "kernelspace", "--to", "10.96.0.80:80"}, code: 0,
			want:     []string{"verdict     DROP", "this platform cannot reject, so connections are dropped", "the connection is dropped, not refused"},
			dontWant: []string{"not handled", "connections are rejected"}},
		{name: "flag errors exit 1, as kproxy's own",
			args: []string{"--to", "10.96.0.30:53", "--bogus"}, code: 1, want: []string{"unknown flag: --bogus"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := explainRun(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			text := out
			if code != 0 {
				text = errOut
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("missing %q in:\n%s", w, text)
				}
			}
			for _, w := range tc.dontWant {
				if strings.Contains(text, w) {
					t.Errorf("unexpected %q in:\n%s", w, text)
				}
			}
		})
	}
}

// TestExplainHelpGroupsItsFlags: `kproxy explain --help` shows explain's
// own flags and examples first, not kproxy's seventy flags.
func TestExplainHelpGroupsItsFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := runExplain(context.Background(), []string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	help := out.String()
	for _, w := range []string{"Examples", "Explain's own flags:", "--from-outside", "--to string"} {
		if !strings.Contains(help, w) {
			t.Errorf("help lacks %q:\n%s", w, help)
		}
	}
	if strings.Contains(help, "--iptables-sync-period") {
		t.Errorf("help lists kproxy's own flags one by one:\n%s", help)
	}
}
