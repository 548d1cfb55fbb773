package source

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
)

// scriptedLW serves lists from a script; each watch either hands out a
// fake watcher for the test to drive or, once the test asks for it,
// answers 410 Gone so that the reflector lists again.
type scriptedLW struct {
	mu       sync.Mutex
	lists    []*discovery.EndpointSliceList
	expire   bool
	watchers chan *watch.FakeWatcher
}

func (lw *scriptedLW) List(metav1.ListOptions) (runtime.Object, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if len(lw.lists) == 0 {
		return nil, fmt.Errorf("no list left in the script")
	}
	l := lw.lists[0]
	lw.lists = lw.lists[1:]
	return l, nil
}

func (lw *scriptedLW) Watch(metav1.ListOptions) (watch.Interface, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.expire {
		lw.expire = false
		return nil, apierrors.NewResourceExpired("too old resource version")
	}
	w := watch.NewFake()
	lw.watchers <- w
	return w, nil
}

func (lw *scriptedLW) IsWatchListSemanticsUnSupported() bool { return true }

func lightSlice(name, svc, addr, rv string) *discovery.EndpointSlice {
	s := testSlice("ns", name, svc, nil)
	s.ResourceVersion = rv
	s.Endpoints[0].Addresses = []string{addr}
	return s
}

func sliceList(rv string, items ...*discovery.EndpointSlice) *discovery.EndpointSliceList {
	l := &discovery.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}
	for _, s := range items {
		l.Items = append(l.Items, *s)
	}
	return l
}

// describe renders one handler call: "old → cur", each as
// name[service label](addresses).
func describe(old, cur *discovery.EndpointSlice) string {
	one := func(s *discovery.EndpointSlice) string {
		if s == nil {
			return "-"
		}
		var addrs []string
		for _, ep := range s.Endpoints {
			addrs = append(addrs, ep.Addresses...)
		}
		return fmt.Sprintf("%s[%s]%v", s.Name, s.Labels[discovery.LabelServiceName], addrs)
	}
	return one(old) + " → " + one(cur)
}

// TestLightInformer checks what the Handler sees from the informer that
// keeps no objects: the old side of an update or a delete is a stub with
// the namespace, name and Service label the object had (not its
// endpoints), a relist turns what disappeared into deletions, and the
// initial list completes the sync.
func TestLightInformer(t *testing.T) {
	lw := &scriptedLW{
		lists: []*discovery.EndpointSliceList{
			sliceList("10", lightSlice("a", "web", "10.1.0.1", "5"), lightSlice("b", "web", "10.1.0.2", "6")),
			sliceList("30", lightSlice("a", "api", "10.1.0.3", "21"), lightSlice("c", "db", "10.1.0.4", "22")),
		},
		watchers: make(chan *watch.FakeWatcher, 4),
	}
	calls := make(chan string, 32)
	on := func(old, cur *discovery.EndpointSlice) {
		if old != nil && (old.Namespace != "ns" || len(old.Endpoints) != 0 || old.Annotations != nil) {
			t.Errorf("old is not a stub: %+v", old)
		}
		calls <- describe(old, cur)
	}
	tr := newTransformer()
	l := newLightInformer(lw, &discovery.EndpointSlice{}, kindEndpointSlice, tr.transform,
		func(s *discovery.EndpointSlice) string { return s.Labels[discovery.LabelServiceName] },
		func(ns, name, svc string) *discovery.EndpointSlice {
			return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}}}
		}, on, klog.Background())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	expect := func(stage string, want ...string) {
		t.Helper()
		got := map[string]bool{}
		timeout := time.After(10 * time.Second)
		for range want {
			select {
			case c := <-calls:
				got[c] = true
			case <-timeout:
				t.Fatalf("%s: timed out; got %v, want %v", stage, got, want)
			}
		}
		for _, w := range want {
			if !got[w] {
				t.Errorf("%s: no call %q; got %v", stage, w, got)
			}
		}
	}
	expect("initial list", "- → a[web][10.1.0.1]", "- → b[web][10.1.0.2]")
	select {
	case <-l.synced(ctx).Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not synced after the initial list")
	}
	if keys := l.ListKeys(); fmt.Sprint(keys) != "[ns/a ns/b]" {
		t.Errorf("known keys %v", keys)
	}

	w := <-lw.watchers
	w.Modify(lightSlice("a", "api", "10.1.0.9", "11"))
	expect("update moving a to another Service", "a[web][] → a[api][10.1.0.9]")

	// The watch breaks and the next one is refused with 410: the relist
	// no longer holds b (a deletion, told with its stub), changes a and
	// brings c.
	lw.mu.Lock()
	lw.expire = true
	lw.mu.Unlock()
	w.Stop()
	expect("relist", "a[api][] → a[api][10.1.0.3]", "b[web][] → -", "- → c[db][10.1.0.4]")
	if keys := l.ListKeys(); fmt.Sprint(keys) != "[ns/a ns/c]" {
		t.Errorf("known keys after the relist %v", keys)
	}
	select {
	case c := <-calls:
		t.Errorf("unexpected call %q", c)
	case <-time.After(100 * time.Millisecond):
	}
	w = <-lw.watchers
	w.Delete(lightSlice("c", "db", "10.1.0.4", "31"))
	expect("delete", "c[db][] → -")
}

// TestLightInformerSyncedAfterLastInitialObject: the informer is synced only
// once the Handler has returned for every object of the initial list (the
// controller's own signal comes when the last one is popped, before it is
// handled: the first sync could miss it).
func TestLightInformerSyncedAfterLastInitialObject(t *testing.T) {
	lw := &scriptedLW{
		lists:    []*discovery.EndpointSliceList{sliceList("10", lightSlice("a", "web", "10.1.0.1", "5"), lightSlice("b", "web", "10.1.0.2", "6"))},
		watchers: make(chan *watch.FakeWatcher, 4),
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	var mu sync.Mutex
	handled := 0
	on := func(_, cur *discovery.EndpointSlice) {
		if cur != nil && cur.Name == "b" {
			<-release // the last initial object is slow to handle
		}
		mu.Lock()
		handled++
		mu.Unlock()
	}
	tr := newTransformer()
	l := newLightInformer(lw, &discovery.EndpointSlice{}, kindEndpointSlice, tr.transform,
		func(s *discovery.EndpointSlice) string { return s.Labels[discovery.LabelServiceName] },
		func(ns, name, svc string) *discovery.EndpointSlice {
			return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		}, on, klog.Background())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() { unblock(); cancel(); <-done }()
	synced := l.synced(ctx)
	select {
	case <-synced.Done():
		t.Fatal("synced while the last initial object is still being handled")
	case <-time.After(300 * time.Millisecond):
	}
	unblock()
	select {
	case <-synced.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("never synced")
	}
	mu.Lock()
	defer mu.Unlock()
	if handled != 2 {
		t.Errorf("synced with %d objects handled, want 2", handled)
	}
}
