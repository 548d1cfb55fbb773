package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
)

// Backoff of the calls retried during an API-server outage.
const (
	// backoffBase is the first delay, doubled at every failed attempt...
	backoffBase = time.Second
	// ...up to backoffCap.
	backoffCap = 30 * time.Second
	// maxRetryAfter bounds how long a server's Retry-After is honoured.
	maxRetryAfter = 2 * time.Minute
)

// reconnector makes list and watch calls ride out API-server outages.
//
// A list or watch call that fails for a reason an outage explains
// (connection refused or reset, timeouts, 5xx, 429, and the 401/403 a
// restarting server answers before its authorizer is ready) is retried here
// until it succeeds or ctx ends, so the reflector never sees the outage.
// Retries back off exponentially from about 1 s to 30 s with jitter: each
// delay is drawn uniformly from [d/2, d), so the thousands of nodes of a
// large cluster that lost the same API server do not come back in step
// (see delay). A Retry-After the server sends (429, 503) is honoured: the
// next attempt waits at least that long (at most maxRetryAfter), plus up to a
// quarter more, again to spread the clients.
//
// A watch opened after an outage resumes from the resourceVersion the
// reflector asks for when the API server still serves the same cluster (see
// clusterIdentity): when the server's history still holds that version
// nothing is listed again. When it does not, the server answers 410 Gone (or
// "too large resource version"): neither is an outage, the reflector gets it
// at once and lists again. When the cluster is another one (or its identity
// cannot be read), the watch answers 410 Gone itself, so the reflector lists
// the new cluster's objects and drops the old ones.
type reconnector struct {
	kind      string
	base, cap time.Duration
	// sleep waits d or until ctx ends (a seam for tests).
	sleep func(ctx context.Context, d time.Duration) error
	// rand returns a number in [0, 1) (a seam for tests).
	rand func() float64
	// id tells whether a watch may resume after an outage; nil: never.
	id *clusterIdentity
}

func newReconnector(kind string, id *clusterIdentity) *reconnector {
	return &reconnector{kind: kind, base: backoffBase, cap: backoffCap, sleep: sleepCtx, rand: rand.Float64, id: id}
}

// delay returns how long to wait after the failed attempt number n (0 for
// the first failure) that returned err.
func (r *reconnector) delay(n int, err error) time.Duration {
	d := r.cap
	if n < 32 && r.base<<n > 0 && r.base<<n < r.cap {
		d = r.base << n
	}
	d = d/2 + time.Duration(r.rand()*float64(d/2))
	if secs, ok := apierrors.SuggestsClientDelay(err); ok && secs > 0 {
		ra := min(time.Duration(secs)*time.Second, maxRetryAfter)
		if ra > d {
			d = ra + time.Duration(r.rand()*float64(ra/4))
		}
	}
	return d
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
	if err == nil || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		// "Too large resource version" is a 504 Timeout, but no retry helps:
		// the server's history is shorter than ours; the reflector lists again.
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
// outage, or ctx ends, waiting delay(n, err) after the n-th failure.
func (r *reconnector) retry(ctx context.Context, what string, fn func() error) (sawOutage bool, err error) {
	log := klog.FromContext(ctx)
	var first, lastLog time.Time
	for n := 0; ; n++ {
		err := fn()
		if !outage(err) || ctx.Err() != nil {
			if n > 0 && err == nil {
				log.Info("API server reachable again", "kind", r.kind, "call", what, "after", time.Since(first).Round(time.Millisecond), "attempts", n+1)
			}
			return n > 0, err
		}
		if n == 0 {
			first = time.Now()
		}
		d := r.delay(n, err)
		if time.Since(lastLog) >= 30*time.Second {
			log.Info("API server unreachable, retrying with backoff", "kind", r.kind, "call", what, "err", err, "retryIn", d.Round(time.Millisecond))
			lastLog = time.Now()
		}
		if err := r.sleep(ctx, d); err != nil {
			return true, fmt.Errorf("%s %s: %w", what, r.kind, err)
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

// watch wraps a watch call made with opts. After an outage the watch
// resumes where the reflector asks if the cluster is the same one (see
// reconnector), else it answers 410 Gone.
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
	resumes := opts.ResourceVersion != "" && !streamsInitialState
	switch {
	case !sawOutage:
		if r.id != nil {
			r.id.remember(ctx)
		}
	case resumes && (r.id == nil || !r.id.same(ctx)):
		w.Stop()
		return nil, apierrors.NewResourceExpired(fmt.Sprintf("kproxy: after an outage the API server serves another cluster (or its identity is unknown); listing %s again instead of resuming at resourceVersion %s", r.kind, opts.ResourceVersion))
	}
	return w, nil
}
