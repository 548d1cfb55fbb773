package app

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/logging"
)

// eventsController is the reportingController of kproxy's Events.
const eventsController = "kproxy"

// Actions of kproxy's Events (events.k8s.io/v1 requires one).
const (
	actionStart  = "StartKproxy"
	actionSync   = "Sync"
	actionListen = "Listen"
)

// newRecorder starts an events.k8s.io/v1 recorder writing through client
// until ctx is done. Recording never blocks the caller: the recorder hands
// each Event to a goroutine, and the broadcaster drops Events when its queue
// is full. Needs create and patch on events.k8s.io events.
func newRecorder(ctx context.Context, client kubernetes.Interface) (events.EventRecorder, error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, err
	}
	go func() {
		<-ctx.Done()
		b.Shutdown()
	}()
	return b.NewRecorder(scheme.Scheme, eventsController).WithLogger(klog.FromContext(ctx)), nil
}

// reporter turns what kproxy has to tell about objects into log lines and,
// when there is an API server, Events. Every method is safe for concurrent
// use and returns at once.
type reporter struct {
	log      klog.Logger
	recorder events.EventRecorder // nil: logs only
	nodeName string
	uids     *serviceUIDs

	mu sync.Mutex
	// seen holds, per Service, the reasons already warned about.
	seen map[types.NamespacedName]map[string]bool
}

func newReporter(log klog.Logger, recorder events.EventRecorder, nodeName string, uids *serviceUIDs) *reporter {
	return &reporter{log: log, recorder: recorder, nodeName: nodeName, uids: uids, seen: map[types.NamespacedName]map[string]bool{}}
}

// starting records a Normal "Starting" Event on this node's Node, as
// upstream kube-proxy does. Like upstream, the reference's UID is the node
// name (what kubectl describe node looks for).
func (r *reporter) starting() {
	if r.recorder == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.nodeName, UID: types.UID(r.nodeName)}
	r.recorder.Eventf(ref, nil, v1.EventTypeNormal, "Starting", actionStart, "Starting kproxy.")
}

// nodeWarning records a Warning Event on this node's Node (the log line is
// the caller's).
func (r *reporter) nodeWarning(reason, message string) {
	if r.recorder == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.nodeName, UID: types.UID(r.nodeName)}
	r.recorder.Eventf(ref, nil, v1.EventTypeWarning, reason, actionStart, "%s", message)
}

// warn reports, once per Service and reason, something the platform cannot
// do for the Service: a warning log line and a Warning Event on the Service.
// It is Env.Warn.
func (r *reporter) warn(svc types.NamespacedName, reason, message string) {
	r.mu.Lock()
	reasons := r.seen[svc]
	dup := reasons[reason]
	if !dup {
		if reasons == nil {
			reasons = map[string]bool{}
			r.seen[svc] = reasons
		}
		reasons[reason] = true
	}
	r.mu.Unlock()
	if dup {
		return
	}
	logging.Warning(r.log, "The platform cannot honour part of a Service", "service", svc.String(), "reason", reason, "message", message)
	r.serviceEvent(svc, reason, actionSync, message)
}

// healthCheckFailed is the health check node port servers' Report: they
// log and deduplicate themselves, so this only records the Event.
func (r *reporter) healthCheckFailed(svc types.NamespacedName, reason, message string) {
	r.serviceEvent(svc, reason, actionListen, "node "+r.nodeName+": "+message)
}

func (r *reporter) serviceEvent(svc types.NamespacedName, reason, action, message string) {
	if r.recorder == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name, UID: r.uids.get(svc)}
	r.recorder.Eventf(ref, nil, v1.EventTypeWarning, reason, action, "%s", message)
}

// forget drops the warnings of Services that no longer exist, so a Service
// created again under the same name is warned about again (and memory stays
// bounded by the Services that exist).
func (r *reporter) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for svc := range r.seen {
		if !r.uids.has(svc) {
			delete(r.seen, svc)
		}
	}
}

// serviceUIDs remembers each Service's UID, so Events refer to the exact
// object (kubectl describe service matches Events by UID).
type serviceUIDs struct {
	mu   sync.RWMutex
	uids map[types.NamespacedName]types.UID
}

func newServiceUIDs() *serviceUIDs {
	return &serviceUIDs{uids: map[types.NamespacedName]types.UID{}}
}

func (u *serviceUIDs) update(old, cur *v1.Service) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if old != nil {
		delete(u.uids, types.NamespacedName{Namespace: old.Namespace, Name: old.Name})
	}
	if cur != nil {
		u.uids[types.NamespacedName{Namespace: cur.Namespace, Name: cur.Name}] = cur.UID
	}
}

func (u *serviceUIDs) get(svc types.NamespacedName) types.UID {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.uids[svc]
}

func (u *serviceUIDs) has(svc types.NamespacedName) bool {
	u.mu.RLock()
	defer u.mu.RUnlock()
	_, ok := u.uids[svc]
	return ok
}

// sourceHandler feeds the cache and keeps the Service UIDs for Events.
type sourceHandler struct {
	*cache.Cache
	uids *serviceUIDs
}

func (h sourceHandler) OnService(old, cur *v1.Service) {
	h.uids.update(old, cur)
	h.Cache.OnService(old, cur)
}
