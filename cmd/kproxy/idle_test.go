package main

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestIdle: kproxy idle blocks until its context ends (SIGTERM in main),
// then exits 0; with an argument it exits 1 at once.
func TestIdle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stdout, stderr bytes.Buffer
	go func() { done <- run(ctx, []string{"idle"}, &stdout, &stderr) }()
	select {
	case code := <-done:
		t.Fatalf("kproxy idle returned %d before it was stopped (stderr %q)", code, stderr.String())
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 || stdout.Len() > 0 || stderr.Len() > 0 {
			t.Errorf("kproxy idle stopped: exit %d, stdout %q, stderr %q; want 0 and nothing", code, stdout.String(), stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kproxy idle did not return after its context ended")
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"idle", "forever"}, &stdout, &stderr); code != 1 || stderr.Len() == 0 {
		t.Errorf("kproxy idle forever: exit %d, stderr %q; want 1 and a message", code, stderr.String())
	}
}
