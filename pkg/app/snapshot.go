package app

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/pkg/source"
)

// Snapshot reads the configured source (--manifests or the API server) once
// and returns this node's desired state, as the first sync would see it
// (bindAddress and the ipvs.scheduler default applied as Run applies them).
// It programs nothing (used by `kproxy explain`). It waits for the API
// server's initial lists at most DefaultInitialListTimeout.
func Snapshot(ctx context.Context, o *config.Options) (*proxy.Snapshot, error) {
	if o.Manifests != "" {
		return snapshot(ctx, o, nil, waitSynced)
	}
	client, server, err := newClient(o.ClientConnection())
	if err != nil {
		return nil, err
	}
	return snapshot(ctx, o, client, boundedWait(DefaultInitialListTimeout, server))
}

// SnapshotFrom is Snapshot reading from client, the API server at server
// (named in errors), whatever o's connection settings say: the kubectl
// plugin's connection, on a workstation.
func SnapshotFrom(ctx context.Context, o *config.Options, client kubernetes.Interface, server string) (*proxy.Snapshot, error) {
	return snapshot(ctx, o, client, boundedWait(DefaultInitialListTimeout, server))
}

func snapshot(ctx context.Context, o *config.Options, client kubernetes.Interface,
	wait func(ctx context.Context, c *cache.Cache, srcErr <-chan error, fatal <-chan error) error) (*proxy.Snapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := cache.New(cache.Options{NodeName: o.NodeName, Notify: func() {}, DefaultAlgorithm: defaultAlgorithm(klog.FromContext(ctx), o),
		Conflict: func(types.NamespacedName, string, string) {}})
	srcErr := make(chan error, 1)
	h := sourceHandler{Cache: c, uids: newServiceUIDs()}
	go func() {
		if o.Manifests != "" {
			srcErr <- runSource(ctx, o, client, h)
			return
		}
		// One snapshot: the Node must be in it (not so for the proxy,
		// which syncs again when the Node arrives).
		srcErr <- source.RunAPIServerAwaitingNode(ctx, client, o.NodeName, h)
	}()
	if err := wait(ctx, c, srcErr, nil); err != nil {
		return nil, err
	}
	snap, _ := c.Snapshot()
	return withBindAddress(snap, o.BindAddress()), nil
}
