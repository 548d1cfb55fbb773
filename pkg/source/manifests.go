package source

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/klog/v2"
)

// RunManifests delivers the Services, EndpointSlices and this node's Node
// defined in the manifest files of dir to h, following edits, until ctx is
// done (see the package documentation for the file rules).
//
// It reads the directory once before returning an error if it cannot (or if
// nodeName is empty); otherwise it returns nil when ctx is done. Problems
// with individual files are reported through the logger in ctx and never
// end the source.
func RunManifests(ctx context.Context, dir, nodeName string, h Handler) error {
	if nodeName == "" {
		return errors.New("source: node name is empty")
	}
	s := newManifestStore(dir, klog.FromContext(ctx))
	if err := s.scan(false); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.poll(ctx, pollInterval) })
	return run(ctx, s.listerWatcher, runOptions{nodeName: nodeName, awaitNode: true}, h)
}
