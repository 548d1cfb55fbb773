// Package app wires kproxy together: configuration, a source (API server or
// manifest directory), the shared cache, a platform backend per IP family,
// the runner, and the servers around them (metrics, health, health check
// node ports) and Events. It holds no proxy logic; the platform is injected
// by cmd/kproxy, so this package never imports platform/.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/healthcheck"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/logging"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/pkg/runner"
	"github.com/kproxy/kproxy/pkg/source"
	"github.com/kproxy/kproxy/pkg/version"
)

// Env is what the app hands a backend besides the configuration.
type Env struct {
	// NodeName is this node's name.
	NodeName string
	// Logger is the app's logger, for the backend's log lines.
	Logger klog.Logger
	// Metrics records what only the platform sees: Metrics.IPTables(family)
	// for the Linux backend, HNSCall/HNSError (platform/windows.Metrics) for
	// the Windows one. nil in dry runs and cleanups.
	Metrics *metrics.Metrics
}

// FamilyBackend is the backend of one IP family, which programs the family
// from the intent View the app builds at each sync.
type FamilyBackend struct {
	Family  v1.IPFamily
	Backend intent.Backend
}

// Backends are a mode's backends, one per IP family the node proxies, in
// the order they sync.
type Backends []FamilyBackend

// Families lists the backends' families.
func (b Backends) Families() []v1.IPFamily {
	out := make([]v1.IPFamily, len(b))
	for i, fb := range b {
		out[i] = fb.Family
	}
	return out
}

// Mode is one proxy mode as provided by a platform.
type Mode struct {
	// NewBackend builds the backends that program this node. nil when the
	// mode cannot run on this OS.
	NewBackend func(ctx context.Context, o *config.Options, env Env) (Backends, error)
	// NewDryRun builds side-effect-free renderers of what the backends
	// would program, one per family (each Backend an intent.DryRunner); it
	// works on any OS.
	NewDryRun func(o *config.Options) (Backends, error)
	// LocalAddrs lists the addresses on the node's interfaces (every
	// family), read once per sync: the node's own addresses in the
	// intent, and where NodePorts answer. nil: none are known (dry runs
	// of a mode on another OS).
	LocalAddrs func() ([]netip.Addr, error)
	// PodsAlwaysKnown: the platform tells pods from other clients whatever
	// the detect-local setting (see intent.Settings).
	PodsAlwaysKnown bool
	// PreserveDestination: the platform honours the Service annotation
	// preserve-destination (see intent.Settings).
	PreserveDestination bool
	// Cleanup removes everything this mode programmed. nil when the mode
	// cannot run on this OS.
	Cleanup func(ctx context.Context, o *config.Options) error
	// Init does what needs full privileges (--init-only). nil when the mode
	// needs nothing of the kind.
	Init func(ctx context.Context, o *config.Options) error
	// ClassifyError names the cause of a backend's sync error when the
	// platform recognises it ("" otherwise); see metrics.Classify. May be nil.
	ClassifyError func(error) metrics.Cause
}

// Modes maps a proxy mode name (config.ModeIPTables, config.ModeKernelspace)
// to its implementation.
type Modes map[string]Mode

// Deps are Run's dependencies besides the configuration. Only Modes is
// required; the rest are seams for tests.
type Deps struct {
	Modes Modes
	// Stdout receives dry runs (default: discarded).
	Stdout io.Writer
	// Listen opens the metrics, healthz and health check node port sockets
	// (default net.Listen).
	Listen func(network, address string) (net.Listener, error)
	// HealthCheckIPs are the addresses health check node ports listen on
	// (default: chosen from nodePortAddresses as upstream does, see
	// healthCheckIPs).
	HealthCheckIPs []netip.Addr
	// InterfaceAddrs lists the node's local addresses, for nodePortAddresses
	// CIDRs (default net.InterfaceAddrs).
	InterfaceAddrs func() ([]netip.Addr, error)
	// Client replaces the API server client built from the configuration.
	Client kubernetes.Interface
	// Events replaces the recorder built on the API server client; it is
	// used even with --manifests (which otherwise only logs).
	Events events.EventRecorder
	// Clock is the health checks' and metrics' clock (default: the real
	// clock; the runner always uses the real one).
	Clock clock.PassiveClock
	// OnListen, when set, is told the address each server ("metrics",
	// "healthz") listens on.
	OnListen func(server string, addr net.Addr)
	// AfterSync, when set, is called after every sync with its snapshot and
	// result, once metrics, health and health check node ports are updated.
	AfterSync func(snap *proxy.Snapshot, err error)
	// OnRetryScheduled, when set, is told each delay the app asks the
	// runner to wait before the sync that retries a quarantined port.
	OnRetryScheduled func(d time.Duration)
	// ConfigWatchInterval is how often the --config file is compared with
	// the bytes it was loaded from (default configWatchInterval).
	ConfigWatchInterval time.Duration
	// InitialListTimeout bounds a dry run's wait for the API server's
	// initial lists (default DefaultInitialListTimeout).
	InitialListTimeout time.Duration
	// CollectAfterFullSync runs a garbage collection right after each full
	// sync, and returns the freed memory to the OS (debug.FreeOSMemory). A
	// full sync holds every port's rendering at once (at 10,000 Services
	// some 30 MB on a live heap of 70); a collection during it sets the
	// next target from that peak, and the heap then grows up to it before
	// the next one. Collecting once the sync is over sets the target from
	// what stays; returning the pages at once brings the resident memory
	// down to it, where the scavenger would take minutes.
	CollectAfterFullSync bool
}

// DefaultInitialListTimeout is how long a dry run (and kproxy explain)
// waits for the initial lists of the API server before giving up. A
// running proxy waits as long as it takes, as upstream, retrying with
// backoff and logging each failure.
const DefaultInitialListTimeout = 30 * time.Second

// RunWith runs kproxy until ctx is done, with the dependencies d gives.
// With o.Cleanup it removes what the mode programmed; with o.DryRun it
// prints what would be programmed to d.Stdout. Both then return.
func RunWith(ctx context.Context, o *config.Options, d Deps) error {
	logger := klog.FromContext(ctx)
	name := string(o.ProxyMode())
	mode, ok := d.Modes[name]
	if !ok {
		return fmt.Errorf("proxy mode %q is not available in this build", name)
	}
	if o.Cleanup {
		if mode.Cleanup == nil {
			return fmt.Errorf("--cleanup: proxy mode %q cannot run on this OS", name)
		}
		return mode.Cleanup(ctx, o)
	}
	if o.InitOnly {
		if mode.Init == nil {
			logger.Info("--init-only: nothing to initialize in this proxy mode", "mode", name)
			return nil
		}
		return mode.Init(ctx, o)
	}
	if d.Stdout == nil {
		d.Stdout = io.Discard
	}
	if d.Listen == nil {
		d.Listen = net.Listen
	}
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}

	started := d.Clock.Now()
	srv := newServers(logger, d.Listen, d.OnListen, o.BindAddressHardFail())
	defer srv.wait() // after cancel: deferred calls run last-in first-out
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	client, server := d.Client, "(injected client)"
	if client == nil && o.Manifests == "" {
		var err error
		if client, server, err = newClient(o.ClientConnection()); err != nil {
			return err
		}
	}
	q := &queue{}
	// Frontend conflicts found by the cache become warnings (log + Event)
	// once the reporter exists; until then (dry run) the cache's log says it.
	var warn atomic.Pointer[reporter]
	defAlg := defaultAlgorithm(logger, o)
	c := cache.New(cache.Options{NodeName: o.NodeName, Notify: q.notify, DefaultAlgorithm: defAlg,
		Conflict: func(svc types.NamespacedName, reason, message string) {
			if r := warn.Load(); r != nil {
				r.warn(svc, reason, message)
			}
		}})
	uids := newServiceUIDs()
	srcErr := make(chan error, 1)
	go func() { srcErr <- runSource(ctx, o, client, sourceHandler{Cache: c, uids: uids}) }()

	if o.DryRun {
		wait := waitSynced
		if o.Manifests == "" {
			wait = boundedWait(d.InitialListTimeout, server)
		}
		if err := wait(ctx, c, srcErr, nil); err != nil {
			return err
		}
		snap, _ := c.Snapshot()
		return dryRun(o, mode, withBindAddress(snap, o.BindAddress()), d.Stdout)
	}
	if mode.NewBackend == nil {
		return fmt.Errorf("proxy mode %q cannot run on this OS (it works here only with --dry-run)", name)
	}

	// Like upstream, the health and metrics ports open at start, before the
	// initial lists and the first sync: /livez answers 200 (no family has
	// synced yet, so none is late) and /healthz 503 until the Node is seen.
	m := metrics.New(metrics.Options{Mode: name, Version: buildVersion(), Pending: c.Pending, FrontendConflicts: c.FrontendConflicts, Clock: d.Clock})
	health := healthcheck.NewProxyHealth(2*o.SyncPeriod(), d.Clock)
	if addr, ok := o.MetricsBindAddress(); ok {
		srv.start(ctx, "metrics", addr.String(), metricsMux(o, m))
	}
	if addr, ok := o.HealthzBindAddress(); ok {
		srv.start(ctx, "healthz", addr.String(), health.Handler(m.Served))
	}
	// The backends are created while the initial lists come: creating
	// them reads the kernel's state and opens sockets (some 50 ms at
	// 10,000 Services), nothing that needs the lists, and programs nothing
	// before the first sync. They are awaited on every path out.
	type created struct {
		backends Backends
		err      error
	}
	creating := make(chan created, 1)
	go func() {
		b, err := mode.NewBackend(ctx, o, Env{NodeName: o.NodeName, Metrics: m, Logger: logger})
		creating <- created{b, err}
	}()
	awaitBackends := sync.OnceValues(func() (Backends, error) { r := <-creating; return r.backends, r.err })
	defer func() { _, _ = awaitBackends() }()
	if err := waitSynced(ctx, c, srcErr, srv.fatal); err != nil {
		return err
	}
	if o.Manifests == "" {
		if err := waitNode(ctx, logger, c.Node, o.NodeName, o.Config.DetectLocalMode == config.LocalModeNodeCIDR, clock.RealClock{}, nodeWait); err != nil {
			return err
		}
	}

	recorder := d.Events
	if recorder == nil && o.Manifests == "" {
		var err error
		if recorder, err = newRecorder(ctx, client); err != nil {
			return fmt.Errorf("starting the event recorder: %w", err)
		}
	}
	rep := newReporter(logger, recorder, o.NodeName, uids)
	warn.Store(rep)
	backends, err := awaitBackends()
	if err != nil {
		return fmt.Errorf("starting the %s backend: %w", name, err)
	}
	if len(backends) == 0 {
		return fmt.Errorf("proxy mode %q has no backend for any IP family", name)
	}
	fams := backends.Families()
	m.Families(fams...)

	hc := healthcheck.NewServiceServers(healthcheck.ServiceOptions{IPs: d.HealthCheckIPs, Listen: d.Listen,
		Healthy: health.Healthy, Report: rep.healthCheckFailed, Logger: &logger})
	defer hc.Close()

	s := &syncer{cache: c, backends: backends, log: logger, clock: d.Clock, metrics: m, health: health, services: hc,
		reporter: rep, classify: func(err error) metrics.Cause { return metrics.Classify(err, mode.ClassifyError) }, afterSync: d.AfterSync, started: started, collect: d.CollectAfterFullSync,
		bind: o.BindAddress(), settings: Settings(o, mode), localAddrs: mode.LocalAddrs}
	if d.HealthCheckIPs == nil {
		if d.InterfaceAddrs == nil {
			d.InterfaceAddrs = interfaceAddrs
		}
		np := o.NodePortAddresses()
		s.listenIPs = func(node proxy.Node) []netip.Addr {
			local, err := d.InterfaceAddrs()
			if err != nil {
				// As upstream: without the local addresses, listen on all.
				logger.Error(err, "Cannot list the node's addresses; health check node ports listen on every address")
				np = config.NodePortAddresses{}
			}
			ips := healthCheckIPs(np, fams, node, local)
			logger.V(2).Info("Health check node ports listen on", "addresses", ips, "nodePortAddresses", o.Config.NodePortAddresses)
			return ips
		}
	}
	r := runner.New(s.run, runner.Options{
		MinInterval:  o.MinSyncPeriod(),
		MaxInterval:  o.SyncPeriod(),
		FullInterval: o.FullSyncPeriod,
	})
	s.runAfter = r.TriggerAfter
	if d.OnRetryScheduled != nil {
		s.runAfter = func(delay time.Duration) {
			d.OnRetryScheduled(delay)
			r.TriggerAfter(delay)
		}
	}
	logger.Info("Starting kproxy", "node", o.NodeName, "mode", name, "families", fams,
		"minSyncPeriod", o.MinSyncPeriod(), "syncPeriod", o.SyncPeriod())
	rep.starting()
	if msg := o.ModeWarning(); msg != "" {
		rep.nodeWarning("ProxyModeNotImplemented", msg)
	}
	var configChanged <-chan error
	if o.ConfigFile != "" {
		if d.ConfigWatchInterval <= 0 {
			d.ConfigWatchInterval = configWatchInterval
		}
		// Compared with the bytes the configuration was decoded from, so
		// that an edit made while kproxy was starting counts.
		if configChanged, err = watchConfigFile(ctx, o.ConfigFile, o.ConfigData, d.ConfigWatchInterval); err != nil {
			return err
		}
	}
	q.start(r.Trigger, fams, health, m)
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	go runLeastConnection(ctx, s, r.Trigger)
	select {
	case err := <-srcErr:
		cancel()
		<-done
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
		return nil
	case err := <-srv.fatal:
		cancel()
		<-done
		return err
	case err := <-configChanged:
		cancel()
		<-done
		return err
	case <-ctx.Done():
		<-done
		return nil
	}
}

// boundedWait is waitSynced bounded by timeout (DefaultInitialListTimeout
// when 0), for the runs that end after one look at the API server (dry
// run, explain): an unreachable server is an error naming it, instead of
// a wait without end.
func boundedWait(timeout time.Duration, server string) func(ctx context.Context, c *cache.Cache, srcErr <-chan error, fatal <-chan error) error {
	if timeout <= 0 {
		timeout = DefaultInitialListTimeout
	}
	return func(ctx context.Context, c *cache.Cache, srcErr <-chan error, fatal <-chan error) error {
		bounded, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		err := waitSynced(bounded, c, srcErr, fatal)
		if err != nil && ctx.Err() == nil && bounded.Err() != nil {
			return fmt.Errorf("no initial lists from the API server %s within %s: is it reachable, and are the credentials valid? (each failed request is logged)", server, timeout)
		}
		return err
	}
}

// waitSynced waits for the initial lists, or for the source or (with
// --bind-address-hard-fail) a server to fail.
func waitSynced(ctx context.Context, c *cache.Cache, srcErr <-chan error, fatal <-chan error) error {
	select {
	case err := <-fatal:
		return err
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

// defaultAlgorithm is the node-wide load-balancing algorithm of Services
// without the kproxy.io/load-balancing annotation: from ipvs.scheduler in
// mode ipvs, none (random) otherwise. It logs what it chose.
func defaultAlgorithm(logger klog.Logger, o *config.Options) proxy.Algorithm {
	alg, known := SchedulerAlgorithm(o.IPVSScheduler())
	if !known {
		logging.Warning(logger, "The ipvs.scheduler has no kproxy equivalent; Services without the kproxy.io/load-balancing annotation are balanced at random",
			"scheduler", o.IPVSScheduler())
	} else if alg != "" {
		logger.Info("Node-wide load-balancing algorithm from ipvs.scheduler", "scheduler", o.IPVSScheduler(), "algorithm", alg)
	}
	return alg
}

// SchedulerAlgorithm maps an IPVS scheduler name (ipvs.scheduler in mode
// ipvs) to kproxy's load-balancing algorithm: rr → round robin, sh → source
// hash, lc → least connection; "" → none (random). Any other scheduler is
// not known (random, warned).
func SchedulerAlgorithm(s string) (proxy.Algorithm, bool) {
	switch s {
	case "":
		return "", true
	case "rr":
		return proxy.AlgorithmRoundRobin, true
	case "sh":
		return proxy.AlgorithmSourceHash, true
	case "lc":
		return proxy.AlgorithmLeastConnection, true
	}
	return proxy.AlgorithmRandom, false
}

// nodeWait bounds how long kproxy waits for its Node object at start: for
// the Node (with addresses), and with detect-local mode NodeCIDR for its pod
// CIDRs, as upstream kube-proxy does.
var nodeWait = struct{ node, podCIDRs, poll time.Duration }{30 * time.Second, 5 * time.Minute, time.Second}

// waitNode waits, bounded, for the Node object before the first sync, so
// that a restarting kproxy does not replace the rules of the previous run
// with a plan made without the node's facts (NodePort addresses, node IPs
// in source ranges). Without the Node after the first bound, kproxy goes on
// (the Node may be unreadable) and says so; the Linux backend then keeps
// the NodePort address the kernel's rules already use where the plan needs
// the Node's primary address (platform/linux/nodeunknown.go). With NodeCIDR
// detection, the
// pod CIDRs decide what is masqueraded: without them after the second
// bound kproxy stops with an error (the DaemonSet retries), and the rules
// of the previous run stay in place meanwhile.
func waitNode(ctx context.Context, log klog.Logger, node func() proxy.Node, nodeName string, needCIDRs bool, clk clock.Clock, bounds struct{ node, podCIDRs, poll time.Duration }) error {
	known := func() (proxy.Node, bool) {
		n := node()
		return n, n.Known && len(n.Addresses) > 0
	}
	poll := func(limit time.Duration, done func() bool) bool {
		deadline := clk.Now().Add(limit)
		for !done() {
			if !clk.Now().Before(deadline) {
				return false
			}
			select {
			case <-ctx.Done():
				return false
			case <-clk.After(bounds.poll):
			}
		}
		return true
	}
	if _, ok := known(); !ok {
		log.Info("Waiting for this node's Node object", "node", nodeName, "timeout", bounds.node)
		if !poll(bounds.node, func() bool { _, ok := known(); return ok }) && ctx.Err() == nil {
			log.Error(nil, "Timed out waiting for the Node object (or its addresses); going on without them", "node", nodeName)
		}
	}
	if needCIDRs {
		hasCIDRs := func() bool { n, _ := known(); return len(n.PodCIDRs) > 0 }
		if !hasCIDRs() && !poll(bounds.podCIDRs, hasCIDRs) {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("detect-local mode NodeCIDR: timed out after %v waiting for node %q's pod CIDRs", bounds.podCIDRs, nodeName)
		}
	}
	return ctx.Err()
}

func runSource(ctx context.Context, o *config.Options, client kubernetes.Interface, h source.Handler) error {
	if o.Manifests != "" {
		return source.RunManifestsWith(ctx, o.Manifests, o.NodeName, h, source.ManifestOptions{Strict: o.DryRun})
	}
	return source.RunAPIServer(ctx, client, o.NodeName, o.ConfigSyncPeriod(), h)
}

// buildVersion is the version label of kproxy_build_info ("v0.1.0", "dev").
func buildVersion() string {
	// version.String() is "kproxy VERSION (commit COMMIT, GOVERSION OS/ARCH)".
	if f := strings.Fields(version.String()); len(f) > 1 {
		return f[1]
	}
	return "dev"
}

// runLeastConnection asks the runner for a sync when a backend's
// least-connection counts are due for a refresh (checked every second,
// until ctx is done): the sync reads them and rebuilds only the ports
// whose counts changed. Nodes without least-connection Services never
// trigger it.
func runLeastConnection(ctx context.Context, s *syncer, trigger func()) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.connectionsDue() {
			trigger()
		}
	}
}
