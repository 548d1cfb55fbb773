package netns

import (
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/proxytest"
)

// TestKillGroupKillsChildren: Kill signals the process alone, and a child
// it started survives it (as kproxy's iptables-restore survived a kill of
// kproxy's pid); KillGroup kills the whole group, as a container runtime
// kills every process of a container, and returns once none is left. A
// child holding the output pipe does not keep Kill from returning.
func TestKillGroupKillsChildren(t *testing.T) {
	c := New(t, Options{EchoBinary: echoBin})
	ctx := testContext(t, time.Minute)
	start := func(script string) *Process {
		t.Helper()
		p, err := c.Start(proxytest.Node1, "sh", "", "sh", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitOutput(ctx, "started"); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// The child keeps the output pipe open: Kill returns all the same.
	p := start("sleep 600 & echo started; wait")
	t0 := time.Now()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 8*time.Second {
		t.Errorf("Kill returned after %v with a child holding the output pipe", d)
	}
	if left := GroupMembers(p.Pid()); len(left) == 0 {
		t.Error("Kill of the process alone took its child too")
	}
	if err := p.SignalGroup(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(GroupMembers(p.Pid())) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SignalGroup left %v", GroupMembers(p.Pid()))
		}
	}

	p = start("sleep 600 >/dev/null 2>&1 & echo started; wait")
	if err := p.KillGroup(); err != nil {
		t.Fatal(err)
	}
	if left := GroupMembers(p.Pid()); len(left) > 0 {
		t.Errorf("KillGroup left %v", left)
	}
}
