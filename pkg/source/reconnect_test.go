package source

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	v1 "k8s.io/api/core/v1"
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
	r := newReconnector("Service")
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

func TestWatchAfterAnOutageRelists(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	yes := true
	for _, tc := range []struct {
		name    string
		opts    metav1.ListOptions
		errs    []error
		expired bool
	}{
		{"no outage: the watch resumes", metav1.ListOptions{ResourceVersion: "100"}, nil, false},
		{"outage: 410 instead of resuming at an old resourceVersion", metav1.ListOptions{ResourceVersion: "100"}, []error{refused}, true},
		{"outage while streaming the initial state: nothing to resume", metav1.ListOptions{ResourceVersion: "100", SendInitialEvents: &yes}, []error{refused}, false},
		{"outage before a watch from scratch", metav1.ListOptions{}, []error{refused}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var slept int
			r := testReconnector(&slept)
			f := &fakeCalls{errs: tc.errs}
			fw := watch.NewFake()
			w, err := r.watch(context.Background(), tc.opts, func() (watch.Interface, error) {
				if err := f.next(); err != nil {
					return nil, err
				}
				return fw, nil
			})
			if tc.expired {
				if !apierrors.IsResourceExpired(err) || w != nil || !fw.IsStopped() {
					t.Fatalf("watch %v err %v stopped %v, want 410 and the new watch stopped", w, err, fw.IsStopped())
				}
				return
			}
			if err != nil || w != fw {
				t.Fatalf("watch %v err %v", w, err)
			}
		})
	}
}
