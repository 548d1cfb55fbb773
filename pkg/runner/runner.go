// Package runner runs the sync function with bounded frequency.
//
// Guarantees:
//  1. Two runs start at least MinInterval apart; Triggers in between coalesce
//     into one run as soon as MinInterval has passed.
//  2. A run starts at most MaxInterval after the previous one, triggered or not.
//  3. After a failed run, the next run comes after a backoff that doubles
//     from MinInterval with each failure in a row, capped at MaxInterval, and
//     it is full. Triggers do not shorten a backoff (they coalesce into the
//     retry): under churn, a failing sync is not repeated every MinInterval.
//     The first run is full, and a run is full when FullInterval has passed
//     since the last successful full run.
//  4. TriggerAfter(d) asks for a run d from now (a retry the function has
//     scheduled, say), within the bounds of 1 and 3. Requests are not
//     queued: the earliest is kept until a run starts at or after it, and a
//     caller asks again after each run.
//
// Runs never overlap: Run calls the function from a single goroutine.
package runner

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Func syncs; full asks it to rewrite everything rather than what changed.
type Func func(ctx context.Context, full bool) error

// Options bound the runner's frequency. Zero values take the defaults.
type Options struct {
	// MinInterval is the shortest time between two runs (default 1s).
	MinInterval time.Duration
	// MaxInterval is the longest time between two runs (default 30s).
	MaxInterval time.Duration
	// FullInterval is the longest time between two full runs (default 1h).
	FullInterval time.Duration
	// Clock defaults to the real clock.
	Clock clock.WithTicker
}

// Runner calls a Func with bounded frequency.
type Runner struct {
	fn      Func
	opts    Options
	trigger chan struct{}
	// wake wakes Run when wakeAt moved earlier.
	wake chan struct{}

	mu     sync.Mutex
	wakeAt time.Time // the earliest run asked for by TriggerAfter (zero: none)
}

// New returns a runner for fn.
func New(fn Func, opts Options) *Runner {
	if opts.MinInterval <= 0 {
		opts.MinInterval = time.Second
	}
	if opts.MaxInterval <= 0 {
		opts.MaxInterval = 30 * time.Second
	}
	if opts.MaxInterval < opts.MinInterval {
		opts.MaxInterval = opts.MinInterval
	}
	if opts.FullInterval <= 0 {
		opts.FullInterval = time.Hour
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Runner{fn: fn, opts: opts, trigger: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
}

// TriggerAfter asks for a run d from now, or as soon as the bounds allow
// after that. It never blocks.
func (r *Runner) TriggerAfter(d time.Duration) {
	at := r.opts.Clock.Now().Add(max(d, 0))
	r.mu.Lock()
	earlier := r.wakeAt.IsZero() || at.Before(r.wakeAt)
	if earlier {
		r.wakeAt = at
	}
	r.mu.Unlock()
	if earlier {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// asked returns the run TriggerAfter asked for (zero: none).
func (r *Runner) asked() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wakeAt
}

// started forgets the requests a run starting at start satisfies.
func (r *Runner) started(start time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.wakeAt.IsZero() && !start.Before(r.wakeAt) {
		r.wakeAt = time.Time{}
	}
}

// Trigger asks for a run as soon as the bounds allow. It never blocks.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run runs until ctx is done. The first run starts at once.
func (r *Runner) Run(ctx context.Context) {
	c := r.opts.Clock
	var (
		lastRun, lastFull time.Time
		needFull          = true
		pending           = true // the first run
		backoff           time.Duration
		retryAt           time.Time
	)
	for {
		now := c.Now()
		var due time.Time
		switch {
		case lastRun.IsZero():
			due = now
		case !retryAt.IsZero():
			due = retryAt // a backoff holds whatever triggers come
		case pending:
			due = lastRun.Add(r.opts.MinInterval)
		default:
			due = lastRun.Add(r.opts.MaxInterval)
			if at := r.asked(); !at.IsZero() && at.Before(due) {
				due = at
				if earliest := lastRun.Add(r.opts.MinInterval); due.Before(earliest) {
					due = earliest
				}
			}
		}
		if wait := due.Sub(now); wait > 0 {
			t := c.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-r.trigger:
				t.Stop()
				pending = true
				continue
			case <-r.wake:
				t.Stop()
				continue
			case <-t.C():
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.trigger: // already covered by this run
		default:
		}

		start := c.Now()
		r.started(start)
		full := needFull || start.Sub(lastFull) >= r.opts.FullInterval
		err := r.fn(ctx, full)
		lastRun, pending = start, false
		if err != nil {
			needFull = true
			if backoff == 0 {
				backoff = r.opts.MinInterval
			} else {
				backoff = min(2*backoff, r.opts.MaxInterval)
			}
			retryAt = start.Add(backoff)
			continue
		}
		needFull, backoff, retryAt = false, 0, time.Time{}
		if full {
			lastFull = start
		}
	}
}
