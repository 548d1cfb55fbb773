package app

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// fakeNode is a Node that appears after some polls.
type fakeNode struct {
	mu    sync.Mutex
	calls int
	at    int // the Node is known from this call on (0: never)
	n     proxy.Node
}

func (f *fakeNode) get() proxy.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.at == 0 || f.calls < f.at {
		return proxy.Node{Name: "node1"}
	}
	return f.n
}

func TestWaitNode(t *testing.T) {
	bounds := struct{ node, podCIDRs, poll time.Duration }{200 * time.Millisecond, 300 * time.Millisecond, 5 * time.Millisecond}
	withIPs := proxy.Node{Name: "node1", Known: true, Addresses: []netip.Addr{netip.MustParseAddr("192.168.50.1")}}
	withCIDRs := withIPs
	withCIDRs.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
	for _, tc := range []struct {
		name      string
		node      *fakeNode
		needCIDRs bool
		wantErr   string
		wantLog   string
		minCalls  int
	}{
		{name: "known at once", node: &fakeNode{at: 1, n: withIPs}},
		{name: "appears later", node: &fakeNode{at: 5, n: withIPs}, minCalls: 5},
		{name: "never: go on", node: &fakeNode{}, wantLog: "Timed out waiting for the Node object"},
		{name: "NodeCIDR: cidrs later", node: &fakeNode{at: 3, n: withCIDRs}, needCIDRs: true, minCalls: 3},
		{name: "NodeCIDR: no cidrs: error", node: &fakeNode{at: 1, n: withIPs}, needCIDRs: true, wantErr: "timed out after 300ms waiting for node \"node1\"'s pod CIDRs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			buf := logger.GetSink().(ktesting.Underlier).GetBuffer()
			err := waitNode(context.Background(), logger, tc.node.get, "node1", tc.needCIDRs, clock.RealClock{}, bounds)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if tc.wantLog != "" && !strings.Contains(buf.String(), tc.wantLog) {
				t.Errorf("log %q lacks %q", buf.String(), tc.wantLog)
			}
			if tc.node.calls < tc.minCalls {
				t.Errorf("%d polls, want at least %d", tc.node.calls, tc.minCalls)
			}
		})
	}
	// Cancelled: returns at once with the context's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitNode(ctx, ktesting.NewLogger(t, ktesting.NewConfig()), (&fakeNode{}).get, "node1", true, clock.RealClock{}, bounds); err == nil {
		t.Error("cancelled wait returned nil")
	}
}

func TestSchedulerAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  proxy.Algorithm
		known bool
	}{{"", "", true}, {"rr", proxy.AlgorithmRoundRobin, true}, {"sh", proxy.AlgorithmSourceHash, true},
		{"lc", proxy.AlgorithmLeastConnection, true}, {"wrr", proxy.AlgorithmRandom, false}} {
		if got, known := SchedulerAlgorithm(tc.in); got != tc.want || known != tc.known {
			t.Errorf("SchedulerAlgorithm(%q) = %q, %v; want %q, %v", tc.in, got, known, tc.want, tc.known)
		}
	}
}
