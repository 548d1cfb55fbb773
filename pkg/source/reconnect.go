package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
)

// reconnectInterval is how often an unreachable API server is tried again.
const reconnectInterval = time.Second

// reconnector makes list and watch calls ride out API-server outages.
//
// client-go's reflector backs off exponentially (up to 30 s) while the API
// server is unreachable, so after a minute-long outage changes could wait
// half a minute to be seen. Instead, a list or watch call that fails for a
// reason an outage explains (connection refused or reset, timeouts, 5xx,
// 429, and the 401/403 a restarting server answers before its authorizer is
// ready) is retried here every second until it succeeds or ctx ends, and
// the reflector never sees the outage.
//
// A watch that could only be opened after such a failure is not resumed:
// the server behind the address may be a new cluster whose history does not
// contain the old resourceVersion, and resuming would miss its objects. The
// call answers 410 Gone instead, so the reflector lists again (a list always
// returns the complete current state).
type reconnector struct {
	kind     string
	interval time.Duration
	// sleep waits d or until ctx ends (a seam for tests).
	sleep func(ctx context.Context, d time.Duration) error
}

func newReconnector(kind string) *reconnector {
	return &reconnector{kind: kind, interval: reconnectInterval, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// outage reports whether err is what an unreachable or restarting API
// server answers.
func outage(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	switch {
	case errors.As(err, &netErr),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsTimeout(err),
		apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		return true
	}
	if s, ok := err.(apierrors.APIStatus); ok && s.Status().Code >= 500 {
		return true
	}
	return false
}

// retry calls fn until it succeeds, fails for a reason other than an
// outage, or ctx ends. It reports whether an outage was seen.
func (r *reconnector) retry(ctx context.Context, what string, fn func() error) (sawOutage bool, err error) {
	log := klog.FromContext(ctx)
	var first time.Time
	lastLog := time.Time{}
	for {
		err = fn()
		if !outage(err) || ctx.Err() != nil {
			if sawOutage && err == nil {
				log.Info("API server reachable again", "kind", r.kind, "call", what, "after", time.Since(first).Round(time.Millisecond))
			}
			return sawOutage, err
		}
		if !sawOutage {
			sawOutage, first = true, time.Now()
		}
		if time.Since(lastLog) >= 30*time.Second {
			log.Info("API server unreachable, retrying every second", "kind", r.kind, "call", what, "err", err)
			lastLog = time.Now()
		}
		if err := r.sleep(ctx, r.interval); err != nil {
			return sawOutage, fmt.Errorf("%s %s: %w", what, r.kind, err)
		}
	}
}

// list wraps a list call.
func (r *reconnector) list(ctx context.Context, list func() (runtime.Object, error)) (runtime.Object, error) {
	var obj runtime.Object
	_, err := r.retry(ctx, "list", func() error {
		var err error
		obj, err = list()
		return err
	})
	return obj, err
}

// watch wraps a watch call made with opts.
func (r *reconnector) watch(ctx context.Context, opts metav1.ListOptions, open func() (watch.Interface, error)) (watch.Interface, error) {
	var w watch.Interface
	sawOutage, err := r.retry(ctx, "watch", func() error {
		var err error
		w, err = open()
		return err
	})
	if err != nil {
		return nil, err
	}
	streamsInitialState := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	if sawOutage && !streamsInitialState && opts.ResourceVersion != "" {
		w.Stop()
		return nil, apierrors.NewResourceExpired(fmt.Sprintf("kproxy: the API server was unreachable; listing %s again instead of resuming at resourceVersion %s", r.kind, opts.ResourceVersion))
	}
	return w, nil
}
