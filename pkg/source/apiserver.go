package source

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// RunAPIServer delivers the Services, EndpointSlices and this node's Node
// from the API server behind client to h, until ctx is done. resync is the
// informers' resync period (config-sync-period; 0 disables resyncs).
//
// It returns nil when ctx is done, and an error only for invalid arguments
// (an empty nodeName, a negative resync). API-server errors are retried by
// the informers and never end the source.
func RunAPIServer(ctx context.Context, client kubernetes.Interface, nodeName string, resync time.Duration, h Handler) error {
	return run(ctx, apiServerLW(client), runOptions{nodeName: nodeName, resync: resync}, h)
}

// RunAPIServerAwaitingNode is RunAPIServer for a reader that takes one
// snapshot (kproxy explain): h.OnSynced waits for the Node's initial list
// too, so that the snapshot knows the node's addresses, pod CIDR and zone.
// (The proxy itself does not wait: a Node seen later triggers a sync.)
func RunAPIServerAwaitingNode(ctx context.Context, client kubernetes.Interface, nodeName string, h Handler) error {
	return run(ctx, apiServerLW(client), runOptions{nodeName: nodeName, awaitNode: true}, h)
}

// apiServerLW builds the ListerWatchers over client.
func apiServerLW(client kubernetes.Interface) lwFactory {
	return func(k kind, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
		var (
			list func(context.Context, metav1.ListOptions) (runtime.Object, error)
			wtch func(context.Context, metav1.ListOptions) (watch.Interface, error)
		)
		switch k {
		case kindService:
			c := client.CoreV1().Services(metav1.NamespaceAll)
			list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }
			wtch = c.Watch
		case kindEndpointSlice:
			c := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
			list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }
			wtch = c.Watch
		default:
			c := client.CoreV1().Nodes()
			list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }
			wtch = c.Watch
		}
		// Each kind remembers the cluster it follows: after an outage, the
		// first kind to see a new cluster must not make the others resume.
		rc := newReconnector(k.String(), &clusterIdentity{probe: kubernetesServiceUID(client)})
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				tweak(&o)
				return rc.list(ctx, func() (runtime.Object, error) { return list(ctx, o) })
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				tweak(&o)
				return rc.watch(ctx, o, func() (watch.Interface, error) { return wtch(ctx, o) })
			},
		}
		// Real clients stream the initial list through a watch; fake
		// clientsets say they cannot, and the reflector falls back to list.
		return cache.ToListWatcherWithWatchListSemantics(lw, client)
	}
}
