// Package app wires kproxy together: configuration, a source (API server or
// manifest directory), the shared cache, a platform backend and the runner.
// It holds no proxy logic; the platform is injected by cmd/kproxy, so this
// package never imports platform/.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/pkg/runner"
	"github.com/kproxy/kproxy/pkg/source"
)

// Env is what the app hands a backend besides the configuration.
type Env struct {
	// NodeName is this node's name.
	NodeName string
	// Warn reports, once per Service, something the platform cannot do for
	// it (it becomes a warning log and an Event on the Service).
	Warn func(svc types.NamespacedName, reason, message string)
}

// Mode is one proxy mode as provided by a platform.
type Mode struct {
	// NewBackend builds the backend that programs this node. nil when the
	// mode cannot run on this OS.
	NewBackend func(ctx context.Context, o *config.Options, env Env) (proxy.Backend, error)
	// NewDryRun builds a side-effect-free renderer of what the backend would
	// program; it works on any OS.
	NewDryRun func(o *config.Options) (proxy.DryRunner, error)
	// Cleanup removes everything this mode programmed. nil when the mode
	// cannot run on this OS.
	Cleanup func(ctx context.Context, o *config.Options) error
}

// Modes maps a proxy mode name (config.ModeIPTables, config.ModeKernelspace)
// to its implementation.
type Modes map[string]Mode

// Run runs kproxy until ctx is done. With o.Cleanup it removes what the mode
// programmed; with o.DryRun it prints what would be programmed to stdout.
// Both then return.
func Run(ctx context.Context, o *config.Options, modes Modes, stdout io.Writer) error {
	logger := klog.FromContext(ctx)
	name := string(o.ProxyMode())
	mode, ok := modes[name]
	if !ok {
		return fmt.Errorf("proxy mode %q is not available in this build", name)
	}
	if o.Cleanup {
		if mode.Cleanup == nil {
			return fmt.Errorf("--cleanup: proxy mode %q cannot run on this OS", name)
		}
		return mode.Cleanup(ctx, o)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The runner exists only once the initial lists are in; until then
	// notifications have nothing to wake (the first run is immediate).
	var trigger atomic.Pointer[func()]
	c := cache.New(cache.Options{NodeName: o.NodeName, Notify: func() {
		if t := trigger.Load(); t != nil {
			(*t)()
		}
	}})
	srcErr := make(chan error, 1)
	go func() { srcErr <- runSource(ctx, o, c) }()

	if err := waitSynced(ctx, c, srcErr); err != nil {
		return err
	}
	if o.DryRun {
		snap, _ := c.Snapshot()
		return dryRun(o, mode, snap, stdout)
	}

	if mode.NewBackend == nil {
		return fmt.Errorf("proxy mode %q cannot run on this OS (it works here only with --dry-run)", name)
	}
	env := Env{NodeName: o.NodeName, Warn: newWarner(logger)}
	backend, err := mode.NewBackend(ctx, o, env)
	if err != nil {
		return fmt.Errorf("starting the %s backend: %w", name, err)
	}
	s := &syncer{cache: c, backend: backend, log: logger}
	r := runner.New(s.sync, runner.Options{
		MinInterval:  o.MinSyncPeriod(),
		MaxInterval:  o.SyncPeriod(),
		FullInterval: o.FullSyncPeriod,
	})
	kick := r.Trigger
	trigger.Store(&kick)
	logger.Info("Starting kproxy", "node", o.NodeName, "mode", name, "minSyncPeriod", o.MinSyncPeriod(), "syncPeriod", o.SyncPeriod())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	select {
	case err := <-srcErr:
		cancel()
		<-done
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		return nil
	case <-ctx.Done():
		<-done
		return nil
	}
}

// waitSynced waits for the initial lists, or for the source to fail.
func waitSynced(ctx context.Context, c *cache.Cache, srcErr <-chan error) error {
	select {
	case <-c.Synced():
		return nil
	case err := <-srcErr:
		if err == nil {
			err = errors.New("stopped before the initial lists were delivered")
		}
		return fmt.Errorf("source: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func runSource(ctx context.Context, o *config.Options, h source.Handler) error {
	if o.Manifests != "" {
		return source.RunManifests(ctx, o.Manifests, o.NodeName, h)
	}
	client, err := newClient(o.ClientConnection())
	if err != nil {
		return err
	}
	return source.RunAPIServer(ctx, client, o.NodeName, o.ConfigSyncPeriod(), h)
}

func dryRun(o *config.Options, mode Mode, snap *proxy.Snapshot, w io.Writer) error {
	if o.DryRunOutput == config.DryRunState || mode.NewDryRun == nil {
		return proxy.WriteYAML(w, snap)
	}
	d, err := mode.NewDryRun(o)
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	return d.DryRun(w, snap)
}

// LogOnlyBackend is the backend of a mode with no platform backend yet: it
// programs nothing; the syncer logs the desired state of every change at -v=2.
func LogOnlyBackend(context.Context, *config.Options, Env) (proxy.Backend, error) {
	return logOnly{}, nil
}

type logOnly struct{}

func (logOnly) Sync(context.Context, *proxy.Snapshot, proxy.Changes) error { return nil }

// syncer is one runner step: snapshot, sync, acknowledge.
type syncer struct {
	cache   *cache.Cache
	backend proxy.Backend
	log     klog.Logger
}

// maxLoggedPorts bounds how many changed ports one sync logs at -v=2.
const maxLoggedPorts = 50

func (s *syncer) sync(ctx context.Context, full bool) error {
	snap, ch := s.cache.Snapshot()
	ch.Full = ch.Full || full
	start := time.Now()
	err := s.backend.Sync(ctx, snap, ch)
	took := time.Since(start)
	if err != nil {
		return fmt.Errorf("sync of generation %d (full=%v): %w", snap.Generation, ch.Full, err)
	}
	s.cache.Ack(snap)
	s.log.V(2).Info("Synced", "generation", snap.Generation, "full", ch.Full, "changedPorts", len(ch.Ports),
		"ipv4Ports", snap.IPv4.Len(), "ipv6Ports", snap.IPv6.Len(), "took", took)
	if v := s.log.V(2); v.Enabled() {
		logChanges(s.log, snap, ch)
	}
	return nil
}
