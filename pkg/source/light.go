package source

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// lightInformer feeds Services and EndpointSlices to the Handler without
// keeping the objects. A shared informer stores every object it delivers,
// and kproxy's cache stores its own parsed form of each: at 10,000 Services
// × 10 endpoints the informers' copy alone is about 35 MiB of live heap,
// twice that in resident memory at the default GOGC. This informer is the
// same reflector and DeltaFIFO (list, watch, relist with deletions, the
// transform) whose deltas go straight to the Handler; of each object it
// remembers only what a later update or delete needs: its key and, for
// EndpointSlices, the name of their Service.
//
// The Handler's old argument is therefore a stub holding the namespace, the
// name and (for EndpointSlices) the Service label, never the previous
// object: pkg/cache reads nothing else from it. Nothing is resynced (a
// resync would replay stubs); the cache is the state, and every relist
// after a watch failure re-delivers the objects.
type lightInformer[T any] struct {
	kind kind
	// label reads what is remembered of an object; stub rebuilds an old
	// object from it.
	label func(*T) string
	stub  func(namespace, name, label string) *T
	on    func(old, cur *T)
	log   klog.Logger

	mu    sync.Mutex
	known map[string]string // key → label
	ctrl  cache.Controller
	fifo  *cache.DeltaFIFO
}

func newLightInformer[T any](lw cache.ListerWatcher, example runtime.Object, k kind, transform cache.TransformFunc,
	label func(*T) string, stub func(namespace, name, label string) *T, on func(old, cur *T), logger klog.Logger) *lightInformer[T] {
	l := &lightInformer[T]{kind: k, label: label, stub: stub, on: on, log: logger, known: map[string]string{}}
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{
		KnownObjects:          l,
		EmitDeltaTypeReplaced: true,
		Transformer:           transform,
	})
	l.fifo = fifo
	l.ctrl = cache.New(&cache.Config{
		Queue:             fifo,
		ListerWatcher:     lw,
		ObjectType:        example,
		ObjectDescription: k.String(),
		Process:           l.process,
	})
	return l
}

func (l *lightInformer[T]) run(ctx context.Context) { l.ctrl.RunWithContext(ctx) }

// synced returns a checker that is done once every object of the initial
// list has been handed to the Handler. The controller's own checker is done
// when the DeltaFIFO has popped the last initial item, before it is
// processed; the DeltaFIFO holds its lock while an item is processed, so
// one more locked call after that returns only once the last item is
// handled.
func (l *lightInformer[T]) synced(ctx context.Context) cache.DoneChecker {
	inner := l.ctrl.HasSyncedChecker()
	done := make(chan struct{})
	go func() {
		select {
		case <-inner.Done():
			l.fifo.IsClosed() // waits for the item being processed
			close(done)
		case <-ctx.Done():
		}
	}()
	return doneChecker{name: inner.Name(), done: done}
}

type doneChecker struct {
	name string
	done chan struct{}
}

func (d doneChecker) Name() string          { return d.name }
func (d doneChecker) Done() <-chan struct{} { return d.done }

// ListKeys and GetByKey make the informer the DeltaFIFO's known objects, so
// that a relist turns the objects it no longer returns into deletions.
func (l *lightInformer[T]) ListKeys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.known))
	for k := range l.known {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (l *lightInformer[T]) GetByKey(key string) (any, bool, error) {
	l.mu.Lock()
	label, ok := l.known[key]
	l.mu.Unlock()
	if !ok {
		return nil, false, nil
	}
	old, err := l.rebuild(key, label)
	if err != nil {
		return nil, false, err
	}
	return old, true, nil
}

func (l *lightInformer[T]) rebuild(key, label string) (*T, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, fmt.Errorf("%s key %q: %w", l.kind, key, err)
	}
	return l.stub(ns, name, label), nil
}

// process hands one object's deltas, oldest first, to the Handler. It runs
// in the controller's single processing goroutine.
func (l *lightInformer[T]) process(obj any, _ bool) error {
	deltas, ok := obj.(cache.Deltas)
	if !ok {
		l.log.Error(nil, "Ignoring informer item that is not Deltas", "kind", l.kind, "type", fmt.Sprintf("%T", obj))
		return nil
	}
	for _, d := range deltas {
		if d.Type == cache.Sync {
			continue // only a resync produces these, and none is configured
		}
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(d.Object)
		if err != nil {
			l.log.Error(err, "Ignoring informer event without a key", "kind", l.kind)
			continue
		}
		l.mu.Lock()
		label, had := l.known[key]
		var cur *T
		if d.Type == cache.Deleted {
			delete(l.known, key)
		} else if cur, ok = d.Object.(*T); ok && cur != nil {
			l.known[key] = l.label(cur)
		}
		l.mu.Unlock()
		if d.Type != cache.Deleted && cur == nil {
			l.log.Error(nil, "Ignoring informer event with unexpected object type", "kind", l.kind, "type", fmt.Sprintf("%T", d.Object))
			continue
		}
		var old *T
		if had {
			if old, err = l.rebuild(key, label); err != nil {
				l.log.Error(err, "Ignoring informer event")
				continue
			}
		}
		if cur == nil && old == nil {
			continue // a deletion of something never delivered
		}
		l.on(old, cur)
	}
	return nil
}
