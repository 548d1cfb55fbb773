package app

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Snapshot reads the configured source (--manifests or the API server) once
// and returns this node's desired state, as the first sync would see it
// (bindAddress and the ipvs.scheduler default applied as Run applies them).
// It programs nothing (used by `kproxy explain`). It waits for the API
// server's initial lists at most DefaultInitialListTimeout.
func Snapshot(ctx context.Context, o *config.Options) (*proxy.Snapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := cache.New(cache.Options{NodeName: o.NodeName, Notify: func() {}, DefaultAlgorithm: defaultAlgorithm(klog.FromContext(ctx), o),
		Conflict: func(types.NamespacedName, string, string) {}})
	var client kubernetes.Interface
	wait := waitSynced
	if o.Manifests == "" {
		cl, server, err := newClient(o.ClientConnection())
		if err != nil {
			return nil, err
		}
		client = cl
		wait = boundedWait(DefaultInitialListTimeout, server)
	}
	srcErr := make(chan error, 1)
	go func() { srcErr <- runSource(ctx, o, client, sourceHandler{Cache: c, uids: newServiceUIDs()}) }()
	if err := wait(ctx, c, srcErr, nil); err != nil {
		return nil, err
	}
	snap, _ := c.Snapshot()
	return withBindAddress(snap, o.BindAddress()), nil
}
