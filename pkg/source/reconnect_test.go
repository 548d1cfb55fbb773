package source

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestOutageErrors(t *testing.T) {
	gr := schema.GroupResource{Resource: "services"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("Get https://x: %w", syscall.ECONNREFUSED), true},
		{fmt.Errorf("wrapped: %w", syscall.ECONNRESET), true},
		{apierrors.NewServiceUnavailable("etcd not ready"), true},
		{apierrors.NewInternalError(errors.New("boom")), true},
		{apierrors.NewTimeoutError("slow", 1), true},
		{apierrors.NewTooManyRequests("busy", 1), true},
		{apierrors.NewForbidden(gr, "", errors.New("RBAC not ready")), true},
		{apierrors.NewUnauthorized("tokens not loaded"), true},
		{apierrors.NewNotFound(gr, "x"), false},
		{apierrors.NewBadRequest("bad selector"), false},
		{apierrors.NewResourceExpired("old"), false},
		{errors.New("some decoding problem"), false},
	} {
		if got := outage(tc.err); got != tc.want {
			t.Errorf("outage(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// fakeCalls answers with the given errors, then succeeds.
type fakeCalls struct {
	errs  []error
	calls int
}

func (f *fakeCalls) next() error {
	f.calls++
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return err
	}
	return nil
}

func testReconnector(slept *int) *reconnector {
	r := newReconnector("Service", nil)
	r.sleep = func(ctx context.Context, d time.Duration) error {
		*slept++
		return ctx.Err()
	}
	return r
}

func TestListRidesOutAnOutage(t *testing.T) {
	var slept int
	r := testReconnector(&slept)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	f := &fakeCalls{errs: []error{refused, refused, apierrors.NewServiceUnavailable("starting")}}
	obj, err := r.list(context.Background(), func() (runtime.Object, error) {
		if err := f.next(); err != nil {
			return nil, err
		}
		return &v1.ServiceList{}, nil
	})
	if err != nil || obj == nil || f.calls != 4 || slept != 3 {
		t.Fatalf("obj %v err %v after %d calls and %d sleeps", obj, err, f.calls, slept)
	}
	// Other errors go to the reflector at once.
	f = &fakeCalls{errs: []error{apierrors.NewBadRequest("bad")}}
	if _, err := r.list(context.Background(), func() (runtime.Object, error) { return nil, f.next() }); !apierrors.IsBadRequest(err) || f.calls != 1 {
		t.Fatalf("err %v after %d calls", err, f.calls)
	}
	// A cancelled context ends the retries.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.list(ctx, func() (runtime.Object, error) { return nil, refused }); err == nil {
		t.Fatal("no error after the context ended")
	}
}

// TestWatchAfterAnOutageResumes: after an outage the watch is opened where
// the reflector asked (its resourceVersion) when the API server still serves
// the same cluster; another cluster (or an unknown identity) answers 410 so
// that the reflector lists again. A 410 Gone or a "too large resource
// version" answer from the server goes to the reflector at once, without
// being retried as an outage.
func TestWatchAfterAnOutageResumes(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tooLarge := apierrors.NewTimeoutError("Too large resource version", 1)
	tooLarge.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	yes := true
	resume := metav1.ListOptions{ResourceVersion: "100"}
	for _, tc := range []struct {
		name string
		opts metav1.ListOptions
		errs []error
		// uids the identity probe returns: at start, then after the outage
		// ("!" makes the probe fail).
		uids      []types.UID
		wantErr   func(error) bool
		wantCalls int
	}{
		{"no outage", resume, nil, []types.UID{"a"}, nil, 1},
		{"outage, same cluster: resumes", resume, []error{refused, apierrors.NewServiceUnavailable("starting"), refused}, []types.UID{"a", "a"}, nil, 4},
		{"outage, another cluster: 410", resume, []error{refused}, []types.UID{"a", "b"}, apierrors.IsResourceExpired, 2},
		{"outage, identity unreadable: 410", resume, []error{refused}, []types.UID{"a", "!"}, apierrors.IsResourceExpired, 2},
		{"outage, identity never known: 410", resume, []error{refused}, []types.UID{"!", "a"}, apierrors.IsResourceExpired, 2},
		{"outage while streaming the initial state: nothing to resume", metav1.ListOptions{ResourceVersion: "100", SendInitialEvents: &yes}, []error{refused}, []types.UID{"a", "b"}, nil, 2},
		{"outage before a watch from scratch", metav1.ListOptions{}, []error{refused}, []types.UID{"a", "b"}, nil, 2},
		{"same cluster, 410 Gone from the server: the reflector relists", resume, []error{refused, apierrors.NewResourceExpired("too old")}, []types.UID{"a", "a"}, apierrors.IsResourceExpired, 2},
		{"rebuilt control plane with a shorter history", resume, []error{refused, tooLarge}, []types.UID{"a", "a"}, func(err error) bool {
			return apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var slept int
			r := testReconnector(&slept)
			uids := tc.uids
			r.id = &clusterIdentity{probe: func(context.Context) (types.UID, error) {
				u := uids[0]
				if len(uids) > 1 {
					uids = uids[1:]
				}
				if u == "!" {
					return "", errors.New("forbidden")
				}
				return u, nil
			}}
			// The identity is read when a watch opens without an outage (start).
			r.id.remember(context.Background())
			f := &fakeCalls{errs: tc.errs}
			fw := watch.NewFake()
			w, err := r.watch(context.Background(), tc.opts, func() (watch.Interface, error) {
				if err := f.next(); err != nil {
					return nil, err
				}
				return fw, nil
			})
			if f.calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", f.calls, tc.wantCalls)
			}
			if tc.wantErr != nil {
				if !tc.wantErr(err) || w != nil {
					t.Fatalf("watch %v err %v, want a 410 or the server's answer", w, err)
				}
				return
			}
			if err != nil || w != fw || fw.IsStopped() {
				t.Fatalf("watch %v err %v stopped %v, want the resumed watch", w, err, fw.IsStopped())
			}
		})
	}
}

// TestKubernetesServiceUID reads the identity through a client.
func TestKubernetesServiceUID(t *testing.T) {
	k := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", UID: "uid-1"}}
	other := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-2"}}
	if uid, err := kubernetesServiceUID(fake.NewClientset(other, k))(context.Background()); err != nil || uid != "uid-1" {
		t.Errorf("uid %q err %v", uid, err)
	}
	if uid, err := kubernetesServiceUID(fake.NewClientset(other))(context.Background()); err != nil || uid != "" {
		t.Errorf("without the Service: uid %q err %v", uid, err)
	}
}

// TestBackoffDelays: exponential from about 1 s to 30 s, each delay drawn
// from [d/2, d); Retry-After is a floor (bounded by maxRetryAfter).
func TestBackoffDelays(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, x := range []float64{0, 0.5, 0.999} {
		r := newReconnector("Service", nil)
		r.rand = func() float64 { return x }
		for n := 0; n < 40; n++ {
			d := min(backoffBase<<min(n, 20), backoffCap)
			got := r.delay(n, refused)
			if got < d/2 || got >= d {
				t.Errorf("rand %v, attempt %d: delay %v outside [%v, %v)", x, n, got, d/2, d)
			}
		}
	}
	r := newReconnector("Service", nil)
	r.rand = func() float64 { return 0.5 }
	busy := apierrors.NewTooManyRequests("busy", 20)
	if got := r.delay(0, busy); got < 20*time.Second || got > 25*time.Second {
		t.Errorf("Retry-After 20 s: delay %v, want 20-25 s", got)
	}
	if got := r.delay(10, apierrors.NewTooManyRequests("busy", 2)); got < 15*time.Second {
		t.Errorf("a short Retry-After shortened the backoff: %v", got)
	}
	if got := r.delay(0, apierrors.NewTooManyRequests("busy", 3600)); got > maxRetryAfter*5/4 {
		t.Errorf("Retry-After of an hour: delay %v, want at most %v", got, maxRetryAfter*5/4)
	}

	// The sleeps retry() asks for follow delay().
	var waits []time.Duration
	r.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	f := &fakeCalls{errs: []error{refused, refused, busy, refused}}
	if _, err := r.retry(context.Background(), "list", f.next); err != nil {
		t.Fatal(err)
	}
	if len(waits) != 4 || waits[0] != 750*time.Millisecond || waits[1] != 1500*time.Millisecond || waits[2] < 20*time.Second || waits[3] != 6*time.Second {
		t.Errorf("waits %v", waits)
	}
}

// TestNoSynchronizedStorm simulates the nodes of a large cluster losing
// the same API server at the same instant. However long the outage, the
// requests reaching the server once it is back must be spread out: no
// 100 ms window may hold more than 10% of the clients (1% after outages of a
// minute or more, once the delays have grown); without jitter every client
// retries in the same instant (100%), which the simulation checks too.
func TestNoSynchronizedStorm(t *testing.T) {
	const clients = 5000
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	peak := func(outage time.Duration, jitter bool, seed uint64) (int, time.Duration) {
		buckets := map[int64]int{}
		worst := time.Duration(0)
		for c := range clients {
			r := newReconnector("Service", nil)
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			r.rand = rng.Float64
			if !jitter {
				r.rand = func() float64 { return 0.999999 }
			}
			at := time.Duration(0)
			for n := 0; at < outage; n++ {
				at += r.delay(n, refused)
			}
			// at: the client's first request once the server is back.
			buckets[int64(at/(100*time.Millisecond))]++
			worst = max(worst, at-outage)
		}
		m := 0
		for _, n := range buckets {
			m = max(m, n)
		}
		return m, worst
	}
	for _, outage := range []time.Duration{5 * time.Second, 20 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute} {
		m, worst := peak(outage, true, uint64(outage))
		t.Logf("outage %v: at most %d of %d clients in one 100 ms window; last client back %v after the server", outage, m, clients, worst.Round(time.Millisecond))
		limit := clients / 10 // short outages: the first delays are short
		if outage >= time.Minute {
			limit = clients / 100
		}
		if m > limit {
			t.Errorf("outage %v: %d of %d clients in one 100 ms window, want at most %d", outage, m, clients, limit)
		}
		if worst > backoffCap {
			t.Errorf("outage %v: a client waited %v after the server came back, more than the %v cap", outage, worst, backoffCap)
		}
		if m, _ := peak(outage, false, 1); m != clients {
			t.Errorf("outage %v: the simulation without jitter should put every client in one window, got %d", outage, m)
		}
	}
}
