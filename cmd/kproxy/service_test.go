package main

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"
)

// fakeSCM drives serviceLoop as the Service Control Manager would.
type fakeSCM struct {
	requests chan string
	mu       sync.Mutex
	states   []serviceState
	answered []string
	running  chan struct{} // closed once Running is reported
	once     sync.Once
}

func newFakeSCM() *fakeSCM {
	return &fakeSCM{requests: make(chan string), running: make(chan struct{})}
}

func (f *fakeSCM) loop(parent context.Context, run func(context.Context) int) int {
	return serviceLoop(parent, run, f.requests,
		func(r string) serviceCommand {
			switch r {
			case "interrogate":
				return serviceInterrogate
			case "stop", "shutdown":
				return serviceStop
			}
			return serviceIgnored
		},
		func(r string) { f.mu.Lock(); f.answered = append(f.answered, r); f.mu.Unlock() },
		func(s serviceState) {
			f.mu.Lock()
			f.states = append(f.states, s)
			f.mu.Unlock()
			if s == serviceRunning {
				f.once.Do(func() { close(f.running) })
			}
		})
}

func (f *fakeSCM) reported() ([]serviceState, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]serviceState(nil), f.states...), append([]string(nil), f.answered...)
}

var startRunStop = []serviceState{serviceStartPending, serviceRunning, serviceStopPending}

// TestServiceLoopStop: interrogations are answered, other commands ignored;
// Stop (and Shutdown) cancel kproxy's context, StopPending is reported and
// the loop returns kproxy's exit code once it has returned.
func TestServiceLoopStop(t *testing.T) {
	for _, stop := range []string{"stop", "shutdown"} {
		t.Run(stop, func(t *testing.T) {
			f := newFakeSCM()
			returned := make(chan struct{})
			run := func(ctx context.Context) int {
				<-ctx.Done()
				time.Sleep(10 * time.Millisecond) // kproxy winding down
				close(returned)
				return 7
			}
			code := make(chan int, 1)
			go func() { code <- f.loop(context.Background(), run) }()
			<-f.running
			f.requests <- "interrogate"
			f.requests <- "pause"
			f.requests <- stop
			select {
			case c := <-code:
				if c != 7 {
					t.Errorf("exit code %d, want kproxy's 7", c)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the loop did not return after " + stop)
			}
			select {
			case <-returned:
			default:
				t.Error("the loop returned before kproxy did")
			}
			states, answered := f.reported()
			if !reflect.DeepEqual(states, startRunStop) {
				t.Errorf("states %v, want %v", states, startRunStop)
			}
			if !reflect.DeepEqual(answered, []string{"interrogate"}) {
				t.Errorf("answered %v, want the one interrogation", answered)
			}
		})
	}
}

// TestServiceLoopRunReturns: kproxy stopping by itself (an error, a
// changed config file) ends the service with its exit code, after
// StopPending; a closed request channel does not end it early.
func TestServiceLoopRunReturns(t *testing.T) {
	f := newFakeSCM()
	release := make(chan struct{})
	close(f.requests)
	code := make(chan int, 1)
	go func() {
		code <- f.loop(context.Background(), func(context.Context) int { <-release; return 1 })
	}()
	<-f.running
	select {
	case c := <-code:
		t.Fatalf("returned %d while kproxy runs", c)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if c := <-code; c != 1 {
		t.Errorf("exit code %d, want 1", c)
	}
	if states, _ := f.reported(); !reflect.DeepEqual(states, startRunStop) {
		t.Errorf("states %v, want %v", states, startRunStop)
	}
}

// TestServiceLoopParentCancelled: the process's own signal context reaches
// kproxy through the loop.
func TestServiceLoopParentCancelled(t *testing.T) {
	f := newFakeSCM()
	parent, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- f.loop(parent, func(ctx context.Context) int { <-ctx.Done(); return 0 }) }()
	<-f.running
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kproxy did not see the parent's cancellation")
	}
}
