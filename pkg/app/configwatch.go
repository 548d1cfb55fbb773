package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// configWatchInterval is how often the --config file is compared with what
// kproxy started with.
const configWatchInterval = 2 * time.Second

// ErrConfigChanged is returned by Run when the --config file changed: as
// upstream kube-proxy, kproxy exits so that its DaemonSet restarts it with
// the new configuration (an edited ConfigMap reaches the file within about
// a minute).
var ErrConfigChanged = errors.New("the configuration file changed: exiting to restart with it")

// watchConfigFile sends one error on the returned channel when the content
// of path differs from what it was at the call (a removed file counts as a
// change only once it comes back different: a ConfigMap update swaps a
// symlink, and a read in between may fail). It reads the file every
// interval until ctx is done. Content, not modification times, is compared,
// so a rewrite with the same bytes is no change.
func watchConfigFile(ctx context.Context, path string, interval time.Duration) (<-chan error, error) {
	initial, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("watching the configuration file: %w", err)
	}
	ch := make(chan error, 1)
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now, err := os.ReadFile(path)
			if err != nil || bytes.Equal(now, initial) {
				continue
			}
			ch <- fmt.Errorf("%s: %w", path, ErrConfigChanged)
			return
		}
	}()
	return ch, nil
}
