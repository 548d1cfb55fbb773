package source

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// LabelServiceProxyName marks Services (and their EndpointSlices) handled by
// another proxy.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// ProxiedSelector is the label selector for the Services and EndpointSlices
// kproxy handles, the same as upstream kube-proxy's.
const ProxiedSelector = "!" + LabelServiceProxyName + ",!" + v1.IsHeadlessService

// kind is one of the three object kinds a source serves.
type kind int

const (
	kindService kind = iota
	kindEndpointSlice
	kindNode
)

func (k kind) String() string {
	switch k {
	case kindService:
		return "Service"
	case kindEndpointSlice:
		return "EndpointSlice"
	case kindNode:
		return "Node"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// listOptionsFor returns the function that restricts the list and watch calls
// for one kind: the proxied label selector for Services and EndpointSlices,
// this node's name for Nodes.
func listOptionsFor(k kind, nodeName string) func(*metav1.ListOptions) {
	if k == kindNode {
		sel := fields.OneTermEqualSelector(metav1.ObjectNameField, nodeName).String()
		return func(o *metav1.ListOptions) { o.FieldSelector = sel }
	}
	return func(o *metav1.ListOptions) { o.LabelSelector = ProxiedSelector }
}

// lwFactory builds the ListerWatcher for one kind; tweak must be applied to
// the options of every list and watch call.
type lwFactory func(k kind, tweak func(*metav1.ListOptions)) cache.ListerWatcher

// runOptions configures run.
type runOptions struct {
	nodeName string
	resync   time.Duration
	// awaitNode makes OnSynced wait for the Node informer's initial list too.
	awaitNode bool
}

// run starts one informer per kind over the ListerWatchers from newLW, calls
// h.OnSynced once the initial lists are delivered, and returns when ctx is
// done and every informer has stopped (no handler call happens after run
// returns).
func run(ctx context.Context, newLW lwFactory, opts runOptions, h Handler) error {
	if opts.nodeName == "" {
		return errors.New("source: node name is empty")
	}
	if opts.resync < 0 {
		return fmt.Errorf("source: negative resync period %v", opts.resync)
	}
	logger := klog.FromContext(ctx)

	tr := newTransformer()
	services := newLightInformer(newLW(kindService, listOptionsFor(kindService, opts.nodeName)), &v1.Service{}, kindService, tr.transform,
		func(*v1.Service) string { return "" },
		func(ns, name, _ string) *v1.Service {
			return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		},
		h.OnService, logger)
	slices := newLightInformer(newLW(kindEndpointSlice, listOptionsFor(kindEndpointSlice, opts.nodeName)), &discovery.EndpointSlice{}, kindEndpointSlice, tr.transform,
		func(s *discovery.EndpointSlice) string { return s.Labels[discovery.LabelServiceName] },
		func(ns, name, svc string) *discovery.EndpointSlice {
			s := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			if svc != "" {
				s.Labels = map[string]string{discovery.LabelServiceName: svc}
			}
			return s
		},
		h.OnEndpointSlice, logger)
	// The Node informer (one object) is a shared informer with resyncs.
	nodes := cache.NewSharedIndexInformerWithOptions(newLW(kindNode, listOptionsFor(kindNode, opts.nodeName)), &v1.Node{},
		cache.SharedIndexInformerOptions{ResyncPeriod: opts.resync, ObjectDescription: kindNode.String()})
	if err := nodes.SetTransform(tr.transform); err != nil {
		return fmt.Errorf("source: setting the Node transform: %w", err)
	}
	nodeReg, err := nodes.AddEventHandler(handlerFuncs(logger, h.OnNode))
	if err != nil {
		return fmt.Errorf("source: adding the Node handler: %w", err)
	}

	var wg sync.WaitGroup
	wg.Go(func() { services.run(ctx) })
	wg.Go(func() { slices.run(ctx) })
	wg.Go(func() { nodes.RunWithContext(ctx) })
	defer wg.Wait()

	awaited := []cache.DoneChecker{services.synced(ctx), slices.synced(ctx)}
	if opts.awaitNode {
		awaited = append(awaited, nodeReg.HasSyncedChecker())
	}
	if cache.WaitFor(ctx, "", awaited...) {
		logger.Info("Initial Services and EndpointSlices delivered")
		h.OnSynced()
	}
	<-ctx.Done()
	return nil
}

// handlerFuncs adapts one of the Handler's typed methods to informer events.
func handlerFuncs[T any](logger klog.Logger, on func(old, cur *T)) cache.ResourceEventHandlerFuncs {
	cast := func(obj any) (*T, bool) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		o, ok := obj.(*T)
		if !ok || o == nil {
			logger.Error(nil, "Ignoring informer event with unexpected object type", "type", fmt.Sprintf("%T", obj))
			return nil, false
		}
		return o, true
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if cur, ok := cast(obj); ok {
				on(nil, cur)
			}
		},
		UpdateFunc: func(oldObj, curObj any) {
			old, ok1 := cast(oldObj)
			cur, ok2 := cast(curObj)
			if ok1 && ok2 {
				on(old, cur)
			}
		},
		DeleteFunc: func(obj any) {
			if old, ok := cast(obj); ok {
				on(old, nil)
			}
		},
	}
}
