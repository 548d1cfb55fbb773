package main

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/windows/svc"
)

// TestServiceHandlerExecute runs the svc.Handler as svc.Run would, with
// the SCM's channels: Running accepts Stop and Shutdown, an interrogation
// gets the current status back, Stop ends kproxy and its exit code is the
// service's.
func TestServiceHandlerExecute(t *testing.T) {
	h := &serviceHandler{parent: context.Background(), run: func(ctx context.Context) int { <-ctx.Done(); return 3 }}
	requests := make(chan svc.ChangeRequest)
	status := make(chan svc.Status, 8)
	type result struct {
		specific bool
		code     uint32
	}
	res := make(chan result, 1)
	go func() { s, c := h.Execute(nil, requests, status); res <- result{s, c} }()
	next := func() svc.Status {
		t.Helper()
		select {
		case s := <-status:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no status")
			return svc.Status{}
		}
	}
	if s := next(); s.State != svc.StartPending {
		t.Errorf("first status %v, want StartPending", s.State)
	}
	if s := next(); s.State != svc.Running || s.Accepts != svc.AcceptStop|svc.AcceptShutdown {
		t.Errorf("second status %+v, want Running accepting Stop and Shutdown", s)
	}
	current := svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown, CheckPoint: 42}
	requests <- svc.ChangeRequest{Cmd: svc.Interrogate, CurrentStatus: current}
	if s := next(); s != current {
		t.Errorf("interrogation answered %+v, want %+v", s, current)
	}
	requests <- svc.ChangeRequest{Cmd: svc.Stop}
	if s := next(); s.State != svc.StopPending {
		t.Errorf("after Stop: %v, want StopPending", s.State)
	}
	r := <-res
	if r.specific || r.code != 3 || h.code != 3 {
		t.Errorf("Execute returned (%v, %d), code %d; want (false, 3), 3", r.specific, r.code, h.code)
	}
}
