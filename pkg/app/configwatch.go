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
// kproxy started with (Deps.ConfigWatchInterval overrides it).
const configWatchInterval = 2 * time.Second

// ErrConfigChanged is returned by Run when the --config file changed: as
// upstream kube-proxy, kproxy exits so that its DaemonSet restarts it with
// the new configuration (an edited ConfigMap reaches the file within about
// a minute).
var ErrConfigChanged = errors.New("the configuration file changed: exiting to restart with it")

// watchConfigFile sends one error on the returned channel when the content
// of path differs from loaded, the bytes the running configuration was
// decoded from (read again now when loaded is nil), so that an edit made
// while kproxy was starting is not missed. A file that cannot be read
// counts as a change only once it comes back different: a ConfigMap update
// swaps a symlink, and a read in between may fail. It reads the file every
// interval until ctx is done. Content, not modification times, is
// compared, so a rewrite with the same bytes is no change; and new content
// counts once two reads in a row return it, so that a read in the middle
// of an in-place rewrite (truncated, then written) is not taken for a
// change.
func watchConfigFile(ctx context.Context, path string, loaded []byte, interval time.Duration) (<-chan error, error) {
	initial := loaded
	if initial == nil {
		var err error
		if initial, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("watching the configuration file: %w", err)
		}
	}
	ch := make(chan error, 1)
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		d := changeDetector{initial: initial}
		for {
			if d.changed(os.ReadFile(path)) {
				ch <- fmt.Errorf("%s: %w", path, ErrConfigChanged)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ch, nil
}

// changeDetector decides, one read of the file after the other, when its
// content has changed from initial: when two reads in a row return the
// same other content. A failed read changes nothing.
type changeDetector struct {
	initial []byte
	seen    []byte // the other content the last read returned, if any
}

func (d *changeDetector) changed(now []byte, err error) bool {
	switch {
	case err != nil:
		return false
	case bytes.Equal(now, d.initial):
		d.seen = nil
		return false
	case d.seen != nil && bytes.Equal(now, d.seen):
		return true
	}
	d.seen = append([]byte{}, now...) // non-nil, even for an empty file
	return false
}
