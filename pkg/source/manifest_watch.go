package source

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// manifestLW is the ListerWatcher of one kind over a manifestStore.
type manifestLW struct {
	store *manifestStore
	kind  kind
	tweak func(*metav1.ListOptions)
}

var (
	_ cache.ListerWatcher            = (*manifestLW)(nil)
	_ cache.ListerWatcherWithContext = (*manifestLW)(nil)
)

// listerWatcher is the store's lwFactory.
func (s *manifestStore) listerWatcher(k kind, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	return &manifestLW{store: s, kind: k, tweak: tweak}
}

func (lw *manifestLW) options(o metav1.ListOptions) metav1.ListOptions {
	if lw.tweak != nil {
		lw.tweak(&o)
	}
	return o
}

// List implements cache.Lister.
func (lw *manifestLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.store.list(lw.kind, lw.options(o))
}

// ListWithContext implements cache.ListerWithContext.
func (lw *manifestLW) ListWithContext(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
	return lw.store.list(lw.kind, lw.options(o))
}

// Watch implements cache.Watcher.
func (lw *manifestLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.store.watch(context.Background(), lw.kind, lw.options(o))
}

// WatchWithContext implements cache.WatcherWithContext.
func (lw *manifestLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return lw.store.watch(ctx, lw.kind, lw.options(o))
}

// IsWatchListSemanticsUnSupported tells the reflector to list, then watch:
// the store does not stream initial events with bookmarks.
func (lw *manifestLW) IsWatchListSemanticsUnSupported() bool { return true }

// filter is the label and field selector of a list or watch call.
type filter struct {
	labels labels.Selector
	fields fields.Selector
}

func newFilter(o metav1.ListOptions) (filter, error) {
	f := filter{labels: labels.Everything(), fields: fields.Everything()}
	var err error
	if o.LabelSelector != "" {
		if f.labels, err = labels.Parse(o.LabelSelector); err != nil {
			return f, apierrors.NewBadRequest(fmt.Sprintf("invalid label selector %q: %v", o.LabelSelector, err))
		}
	}
	if o.FieldSelector != "" {
		if f.fields, err = fields.ParseSelector(o.FieldSelector); err != nil {
			return f, apierrors.NewBadRequest(fmt.Sprintf("invalid field selector %q: %v", o.FieldSelector, err))
		}
	}
	return f, nil
}

// matches applies the selectors; the fields known are metadata.name and
// metadata.namespace, like the API server's common fields.
func (f filter) matches(obj runtime.Object) bool {
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	return f.labels.Matches(labels.Set(m.GetLabels())) &&
		f.fields.Matches(fields.Set{"metadata.name": m.GetName(), "metadata.namespace": m.GetNamespace()})
}

// served returns a copy of obj as it is served, with resourceVersion rv.
func served(obj runtime.Object, rv uint64) runtime.Object {
	c := obj.DeepCopyObject()
	if m, err := meta.Accessor(c); err == nil {
		m.SetResourceVersion(strconv.FormatUint(rv, 10))
	}
	return c
}

// list returns the typed list of one kind's matching objects, in key order.
func (s *manifestStore) list(k kind, o metav1.ListOptions) (runtime.Object, error) {
	f, err := newFilter(o)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]objectKey, 0, len(s.objects))
	for key, so := range s.objects {
		if key.kind == k && f.matches(so.obj) {
			keys = append(keys, key)
		}
	}
	sortKeys(keys)
	lm := metav1.ListMeta{ResourceVersion: strconv.FormatUint(s.rev, 10)}
	item := func(i int) runtime.Object { so := s.objects[keys[i]]; return served(so.obj, so.rv) }
	switch k {
	case kindService:
		l := &v1.ServiceList{ListMeta: lm, Items: make([]v1.Service, len(keys))}
		for i := range keys {
			l.Items[i] = *item(i).(*v1.Service)
		}
		return l, nil
	case kindEndpointSlice:
		l := &discovery.EndpointSliceList{ListMeta: lm, Items: make([]discovery.EndpointSlice, len(keys))}
		for i := range keys {
			l.Items[i] = *item(i).(*discovery.EndpointSlice)
		}
		return l, nil
	default:
		l := &v1.NodeList{ListMeta: lm, Items: make([]v1.Node, len(keys))}
		for i := range keys {
			l.Items[i] = *item(i).(*v1.Node)
		}
		return l, nil
	}
}

// watch starts a watch of one kind from o.ResourceVersion: "" or "0" starts
// with an Added event for every matching object; a version the history no
// longer covers fails with 410 Gone (the reflector then lists again).
func (s *manifestStore) watch(ctx context.Context, k kind, o metav1.ListOptions) (watch.Interface, error) {
	f, err := newFilter(o)
	if err != nil {
		return nil, err
	}
	var from uint64
	if o.ResourceVersion != "" {
		if from, err = strconv.ParseUint(o.ResourceVersion, 10, 64); err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid resourceVersion %q", o.ResourceVersion))
		}
	}
	w := &manifestWatch{
		store:  s,
		kind:   k,
		filter: f,
		result: make(chan watch.Event),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	s.mu.Lock()
	switch {
	case from == 0:
		keys := make([]objectKey, 0, len(s.objects))
		for key := range s.objects {
			keys = append(keys, key)
		}
		sortKeys(keys)
		for _, key := range keys {
			so := s.objects[key]
			w.offer(storeEvent{rv: so.rv, key: key, cur: so.obj})
		}
	case from < s.floor:
		s.mu.Unlock()
		return nil, apierrors.NewResourceExpired(fmt.Sprintf("resourceVersion %d is too old (oldest kept: %d)", from, s.floor+1))
	default:
		for _, ev := range s.history {
			if ev.rv > from {
				w.offer(ev)
			}
		}
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	go w.run(ctx)
	return w, nil
}

func (s *manifestStore) removeWatcher(w *manifestWatch) {
	s.mu.Lock()
	delete(s.watchers, w)
	s.mu.Unlock()
}

// manifestWatch is one watch on a manifestStore. The store queues events
// without ever blocking; run hands them to the consumer.
type manifestWatch struct {
	store  *manifestStore
	kind   kind
	filter filter
	result chan watch.Event
	wake   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	queue []watch.Event
}

var _ watch.Interface = (*manifestWatch)(nil)

// offer queues the event ev means to this watch, if any: an object that
// starts matching the selectors is Added, one that stops matching is
// Deleted. Called with the store's lock held.
func (w *manifestWatch) offer(ev storeEvent) {
	if ev.key.kind != w.kind {
		return
	}
	oldIn := ev.old != nil && w.filter.matches(ev.old)
	curIn := ev.cur != nil && w.filter.matches(ev.cur)
	var e watch.Event
	switch {
	case oldIn && curIn:
		e = watch.Event{Type: watch.Modified, Object: served(ev.cur, ev.rv)}
	case curIn:
		e = watch.Event{Type: watch.Added, Object: served(ev.cur, ev.rv)}
	case oldIn:
		e = watch.Event{Type: watch.Deleted, Object: served(ev.old, ev.rv)}
	default:
		return
	}
	w.mu.Lock()
	w.queue = append(w.queue, e)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run delivers queued events until the watch is stopped or ctx is done, then
// closes the result channel.
func (w *manifestWatch) run(ctx context.Context) {
	defer close(w.result)
	defer w.store.removeWatcher(w)
	for {
		w.mu.Lock()
		batch := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, e := range batch {
			select {
			case w.result <- e:
			case <-w.done:
				return
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-w.wake:
		case <-w.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Stop implements watch.Interface.
func (w *manifestWatch) Stop() {
	w.once.Do(func() { close(w.done) })
}

// ResultChan implements watch.Interface.
func (w *manifestWatch) ResultChan() <-chan watch.Event { return w.result }
