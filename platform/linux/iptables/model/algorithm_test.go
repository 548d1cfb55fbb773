package model

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
	"github.com/kproxy/kproxy/platform/linux/trace"
)

// TestClusterSlotMatchesKernel: the slots the kernel's cluster match gave 40
// loopback sources (32 rules "-m cluster --cluster-local-node K
// --cluster-total-nodes 32 --cluster-hash-seed 0x6b707278", each DNAT to
// its own listener; recorded on Linux 6.18 in a network namespace, see
// docs/linux.md) are the ones ClusterSlot computes.
func TestClusterSlotMatchesKernel(t *testing.T) {
	kernel := []struct {
		src  string
		slot uint32
	}{
		{"127.1.0.1", 31},
		{"127.1.0.2", 6},
		{"127.1.0.3", 17},
		{"127.1.0.4", 12},
		{"127.1.0.5", 17},
		{"127.1.0.6", 31},
		{"127.1.1.7", 0},
		{"127.1.1.8", 2},
		{"127.1.1.9", 12},
		{"127.1.1.10", 25},
		{"127.1.1.11", 24},
		{"127.1.1.12", 12},
		{"127.1.1.13", 9},
		{"127.1.2.14", 2},
		{"127.1.2.15", 25},
		{"127.1.2.16", 10},
		{"127.1.2.17", 12},
		{"127.1.2.18", 28},
		{"127.1.2.19", 29},
		{"127.1.2.20", 28},
		{"127.1.3.21", 30},
		{"127.1.3.22", 24},
		{"127.1.3.23", 30},
		{"127.1.3.24", 25},
		{"127.1.3.25", 23},
		{"127.1.3.26", 8},
		{"127.1.3.27", 7},
		{"127.1.4.28", 29},
		{"127.1.4.29", 11},
		{"127.1.4.30", 23},
		{"127.1.4.31", 26},
		{"127.1.4.32", 11},
		{"127.1.4.33", 27},
		{"127.1.4.34", 11},
		{"127.1.5.35", 30},
		{"127.1.5.36", 19},
		{"127.1.5.37", 18},
		{"127.1.5.38", 31},
		{"127.1.5.39", 18},
		{"127.1.5.40", 30},
	}
	for _, k := range kernel {
		if got := trace.ClusterSlot(netip.MustParseAddr(k.src), 0x6b707278, 32); got != k.slot {
			t.Errorf("%s: slot %d, the kernel said %d", k.src, got, k.slot)
		}
	}
}

// TestNthFollowsKernel: "--every N --packet P" matches the packets whose
// index among those reaching the rule is P modulo N (the kernel, checked in
// a network namespace: --every 3/2 --packet 0 chains sent 9 connections to
// 0 1 2 0 1 2 0 1 2); a restore that rewrites the rule starts it again.
func TestNthFollowsKernel(t *testing.T) {
	rs := New()
	restore := "*nat\n:RR - [0:0]\n-A RR -p tcp -m statistic --mode nth --every 3 --packet 1 -j DNAT --to-destination 10.0.0.1:80\n-A RR -p tcp -j DNAT --to-destination 10.0.0.2:80\n-A OUTPUT -j RR\nCOMMIT\n"
	if err := rs.Restore([]byte(restore), true); err != nil {
		t.Fatal(err)
	}
	run := func() string {
		var got []string
		for range 6 {
			out, err := rs.Trace(trace.Host{}, trace.Packet{Local: true, Src: netip.MustParseAddr("10.1.0.1"), Dst: netip.MustParseAddr("10.96.0.1"), Proto: "tcp", SrcPort: 1, DstPort: 80})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, out[0].Dst.Addr().String())
		}
		return strings.Join(got, " ")
	}
	want := "10.0.0.2 10.0.0.1 10.0.0.2 10.0.0.2 10.0.0.1 10.0.0.2"
	if got := run(); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if err := rs.Restore([]byte(strings.Replace(restore, "-A OUTPUT -j RR\n", "", 1)), true); err != nil {
		t.Fatal(err)
	}
	if got := run(); got != want {
		t.Errorf("after a restore: got %s, want %s", got, want)
	}
}

// TestClusterSavedAsMask: a rule given with --cluster-local-node reads back
// the way iptables-save prints it.
func TestClusterSavedAsMask(t *testing.T) {
	args, err := syntax.Split("-p tcp -m cluster --cluster-local-node 7 --cluster-total-nodes 32 --cluster-hash-seed 0x6b707278 -j ACCEPT")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRule(args)
	if err != nil {
		t.Fatal(err)
	}
	want := "-p tcp -m cluster --cluster-local-nodemask 0x00000040 --cluster-total-nodes 32 --cluster-hash-seed 0x6b707278 -j ACCEPT"
	if r.Spec != want {
		t.Errorf("spec %q, want %q", r.Spec, want)
	}
	// The saved form reads back (kproxy explain --live parses saves).
	args, _ = syntax.Split(want)
	if again, err := ParseRule(args); err != nil || again.Spec != want {
		t.Errorf("reading the saved form: %v, %q", err, again.Spec)
	}
}
