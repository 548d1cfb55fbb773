package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

type call struct {
	at   time.Duration // since the test's start
	full bool
}

// harness drives a Runner on a fake clock and records its calls.
type harness struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	start time.Time
	r     *Runner
	calls chan call
	mu    sync.Mutex
	fail  int // fail the next n calls
}

// newHarness starts a runner whose first fail calls fail.
func newHarness(t *testing.T, opts Options, fail int) *harness {
	h := &harness{t: t, start: time.Unix(1000, 0), calls: make(chan call, 100), fail: fail}
	h.clock = clocktesting.NewFakeClock(h.start)
	opts.Clock = h.clock
	h.r = New(func(ctx context.Context, full bool) error {
		h.calls <- call{at: h.clock.Since(h.start), full: full}
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.fail > 0 {
			h.fail--
			return errors.New("injected failure")
		}
		return nil
	}, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// expect waits (in real time, bounded) for the next call and checks it.
func (h *harness) expect(at time.Duration, full bool) {
	h.t.Helper()
	select {
	case c := <-h.calls:
		if c.at != at || c.full != full {
			h.t.Fatalf("call at %v full=%v, want at %v full=%v", c.at, c.full, at, full)
		}
	case <-time.After(5 * time.Second):
		h.t.Fatalf("no call, want one at %v", at)
	}
}

// none checks no call is made at the current fake time.
func (h *harness) none() {
	h.t.Helper()
	h.settle()
	select {
	case c := <-h.calls:
		h.t.Fatalf("unexpected call at %v", c.at)
	default:
	}
}

// settle waits until the runner is blocked on its timer again.
func (h *harness) settle() {
	deadline := time.Now().Add(5 * time.Second)
	for !h.clock.HasWaiters() {
		if time.Now().After(deadline) {
			h.t.Fatal("runner never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// triggerNoRun triggers and checks that no run follows at the current fake
// time (the runner gets a moment of real time to react first).
func (h *harness) triggerNoRun() {
	h.t.Helper()
	h.r.Trigger()
	time.Sleep(20 * time.Millisecond)
	h.none()
}

// stepTo moves the fake clock to the given offset from the start.
func (h *harness) stepTo(at time.Duration) {
	h.settle()
	h.clock.SetTime(h.start.Add(at))
}

func TestFirstRunIsImmediateAndFull(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 30 * time.Second}, 0)
	h.expect(0, true)
	h.none()
}

func TestTriggersCoalesceWithinMinInterval(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 30 * time.Second}, 0)
	h.expect(0, true)
	h.settle()
	for i := 0; i < 5; i++ {
		h.r.Trigger()
	}
	h.stepTo(500 * time.Millisecond)
	h.none()
	h.stepTo(time.Second)
	h.expect(time.Second, false)
	h.none()
	// A trigger long after the last run runs at once.
	h.stepTo(10 * time.Second)
	h.r.Trigger()
	h.expect(10*time.Second, false)
}

func TestRunsAtLeastEveryMaxInterval(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 30 * time.Second}, 0)
	h.expect(0, true)
	h.stepTo(29 * time.Second)
	h.none()
	h.stepTo(30 * time.Second)
	h.expect(30*time.Second, false)
	h.stepTo(60 * time.Second)
	h.expect(60*time.Second, false)
}

func TestFailureBacksOffAndForcesFull(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 10 * time.Second}, 4)
	h.expect(0, true) // fails: retry after 1s
	h.stepTo(time.Second)
	h.expect(time.Second, true) // fails: retry after 2s
	h.stepTo(2 * time.Second)
	h.none()
	h.stepTo(3 * time.Second)
	h.expect(3*time.Second, true) // fails: retry after 4s
	h.stepTo(7 * time.Second)
	h.expect(7*time.Second, true) // fails: retry after 8s, capped at 10
	// Triggers during a backoff do not cut it short: they wait for the retry.
	for _, at := range []time.Duration{8, 10, 12, 14} {
		h.stepTo(at * time.Second)
		h.triggerNoRun()
	}
	h.stepTo(15 * time.Second)
	h.expect(15*time.Second, true) // succeeds
	h.r.Trigger()
	h.stepTo(16 * time.Second)
	h.expect(16*time.Second, false)
}

func TestBackoffCapsAtMaxInterval(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 5 * time.Second}, 100)
	h.expect(0, true)
	want := []time.Duration{1, 3, 7, 12, 17, 22} // 1, 2, 4, then 5 (the cap)
	for _, at := range want {
		h.stepTo(at*time.Second - time.Millisecond)
		h.triggerNoRun() // churn
		h.stepTo(at * time.Second)
		h.expect(at*time.Second, true)
	}
}

func TestPeriodicFullSync(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 30 * time.Second, FullInterval: time.Minute}, 0)
	h.expect(0, true)
	h.stepTo(30 * time.Second)
	h.expect(30*time.Second, false)
	h.stepTo(60 * time.Second)
	h.expect(60*time.Second, true)
	h.stepTo(90 * time.Second)
	h.expect(90*time.Second, false)
}

func TestTriggerAfter(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 30 * time.Second}, 0)
	h.expect(0, true)
	h.settle()
	h.r.TriggerAfter(10 * time.Second)
	h.r.TriggerAfter(5 * time.Second) // earlier: wins
	h.r.TriggerAfter(20 * time.Second)
	h.stepTo(4 * time.Second)
	h.none()
	h.stepTo(5 * time.Second)
	h.expect(5*time.Second, false)
	h.stepTo(34 * time.Second)
	h.none() // nothing pending: the next run is the periodic one
	h.stepTo(35 * time.Second)
	h.expect(35*time.Second, false)

	// Within MinInterval of the last run: at MinInterval.
	h.settle()
	h.r.TriggerAfter(0)
	h.stepTo(35*time.Second + 500*time.Millisecond)
	h.none()
	h.stepTo(36 * time.Second)
	h.expect(36*time.Second, false)

	// Later than MaxInterval: the periodic run comes first, and the request
	// is still kept.
	h.settle()
	h.r.TriggerAfter(40 * time.Second) // at 76s
	h.stepTo(66 * time.Second)
	h.expect(66*time.Second, false)
	h.stepTo(75 * time.Second)
	h.none()
	h.stepTo(76 * time.Second)
	h.expect(76*time.Second, false)
}

func TestTriggerAfterDoesNotShortenBackoff(t *testing.T) {
	h := newHarness(t, Options{MinInterval: time.Second, MaxInterval: 30 * time.Second}, 2)
	h.expect(0, true) // fails: retry after 1s
	h.stepTo(time.Second)
	h.expect(time.Second, true) // fails: retry after 2s
	h.settle()
	h.r.TriggerAfter(0)
	time.Sleep(20 * time.Millisecond)
	h.stepTo(2 * time.Second)
	h.none()
	h.stepTo(3 * time.Second)
	h.expect(3*time.Second, true)
}
