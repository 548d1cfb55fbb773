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
	return RunManifestsWith(ctx, dir, nodeName, h, ManifestOptions{})
}

// ManifestOptions are the options of RunManifestsWith.
type ManifestOptions struct {
	// Strict makes the first read of the directory fail when a manifest
	// file does not parse (a dry run, which must not print the rules of a
	// directory it read only in part): the error names every such file,
	// the line and the problem. Objects skipped inside a file that parses,
	// and files skipped unread (a named pipe, an oversized file), are
	// still only logged. Later reads are never strict.
	Strict bool
}

// RunManifestsWith is RunManifests with options.
func RunManifestsWith(ctx context.Context, dir, nodeName string, h Handler, o ManifestOptions) error {
	if nodeName == "" {
		return errors.New("source: node name is empty")
	}
	s := newManifestStore(dir, klog.FromContext(ctx))
	s.strict = o.Strict
	if err := s.scan(false); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if len(s.fileErrs) > 0 {
		return fmt.Errorf("%d manifest file(s) in %s do not parse: %w", len(s.fileErrs), dir, errors.Join(s.fileErrs...))
	}
	s.strict = false
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.poll(ctx, pollInterval) })
	return run(ctx, s.listerWatcher, runOptions{nodeName: nodeName, awaitNode: true}, h)
}
