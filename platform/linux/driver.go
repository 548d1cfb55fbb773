package linux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
)

// mode is what differs between the two Linux modes behind the one Driver:
// how a View becomes rules in the kernel. Its methods are called with the
// Driver's lock held.
type mode interface {
	// apply renders v against the mode's record of what the kernel holds
	// (every port when full, v's changed ports otherwise), runs the one
	// transaction that takes the kernel there, and commits the record
	// only when it succeeded.
	apply(ctx context.Context, v *intent.View, full bool) (applied, error)
	// check verifies, after a partial sync that wrote nothing, that the
	// kernel still holds the mode's fixed rules (someone may have flushed
	// them): an error makes the Driver sync in full at once.
	check(ctx context.Context) error
	// isolate is called after a full apply failed: the mode may find and
	// quarantine what the kernel rejects, and reports whether applying
	// again may succeed.
	isolate(ctx context.Context, v *intent.View, err error) bool
	// failed records a failed transaction (partial: of a partial sync,
	// which is then retried in full).
	failed(err error, partial bool)
	// synced runs after a successful sync (the take-over of another
	// proxy's rules, metrics of what the kernel holds).
	synced(ctx context.Context, full bool)
	// dryRun writes what a full sync of v would run on a node without
	// kproxy's rules; it changes nothing.
	dryRun(w io.Writer, v *intent.View) error
	// cleanup removes everything the mode owns in the kernel and forgets
	// its record.
	cleanup(ctx context.Context) error
}

// applied is what one successful apply did.
type applied struct {
	// full: the mode synced in full although asked for a partial sync
	// (what it leaves out changed, say).
	full bool
	// wrote: the transaction changed something (a partial sync that
	// wrote nothing checks the kernel instead).
	wrote bool
	// routeLocalnet: localhost NodePorts are on; a full sync sets
	// net.ipv4.conf.all.route_localnet=1.
	routeLocalnet bool
	// log holds key/value pairs for the sync's log line.
	log []any
}

// Driver is the Linux backend, one per IP family, whichever the mode: it
// owns the sync protocol both modes share and calls its mode for what
// differs. It implements intent.Backend, intent.DryRunner and
// intent.ConnectionCounter.
//
// The protocol of a sync: the first sync, any sync after a failure and the
// app's periodic full syncs are full; a partial sync writes only the ports
// the View says changed, and when it has nothing to write the mode checks
// that the kernel still holds its fixed rules. A partial transaction the
// kernel refuses (someone changed kproxy's rules) is followed at once by a
// full one; a full one the kernel refuses lets the mode isolate what it
// rejects and try once more. Once the rules are in place, stale UDP flows
// of the changed ports are deleted from conntrack (a failure is retried
// with the next sync, never fails one), and a full sync enables localhost
// NodePorts' route_localnet when they are on.
type Driver struct {
	mode   mode
	family v1.IPFamily
	log    klog.Logger
	ct     Conntrack
	host   Host
	// ctMetrics records one round of conntrack cleanup.
	ctMetrics func(deleted int, d time.Duration, failed bool)

	mu       sync.Mutex
	needFull bool
	// last is the View of the last successful sync.
	last      *intent.View
	pendingCT conntrackQueue
	lc        leastConn
	result    Result
}

// Result describes the last successful sync, for logs and tests.
type Result struct {
	Full             bool
	Duration         time.Duration
	ConntrackDeleted int
}

var (
	_ intent.Backend           = (*Driver)(nil)
	_ intent.DryRunner         = (*Driver)(nil)
	_ intent.ConnectionCounter = (*Driver)(nil)
)

func newDriver(m mode, family v1.IPFamily, log klog.Logger, ct Conntrack, host Host, ctMetrics func(int, time.Duration, bool)) *Driver {
	if log.GetSink() == nil {
		log = klog.Background()
	}
	if ctMetrics == nil {
		ctMetrics = func(int, time.Duration, bool) {}
	}
	return &Driver{mode: m, family: family, log: log, ct: ct, host: host, ctMetrics: ctMetrics, needFull: true,
		lc: leastConn{family: family, ct: ct, log: log}}
}

// Family returns the driver's IP family.
func (d *Driver) Family() v1.IPFamily { return d.family }

// Result returns what the last successful sync did.
func (d *Driver) Result() Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.result
}

// Sync makes the kernel match v (see intent.Backend and Driver).
func (d *Driver) Sync(ctx context.Context, v *intent.View) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	full := v.Full || d.needFull || d.last == nil
	res, err := d.mode.apply(ctx, v, full)
	full = full || res.full
	if err == nil && !full && !res.wrote {
		err = d.mode.check(ctx)
	}
	if err != nil && ctx.Err() != nil {
		// kproxy is stopping: the transaction was interrupted, not
		// refused. No retry, no failure counted.
		d.needFull = true
		return fmt.Errorf("sync interrupted (%w): %w", context.Cause(ctx), err)
	}
	if err != nil && !full {
		d.mode.failed(err, true)
		d.log.Info("Partial sync failed (kproxy's rules changed behind its back?): full sync", "family", d.family, "err", err)
		full = true
		res, err = d.mode.apply(ctx, v, true)
	}
	if err != nil && ctx.Err() == nil {
		d.mode.failed(err, false)
		if d.mode.isolate(ctx, v, err) {
			if res, err = d.mode.apply(ctx, v, true); err != nil {
				d.mode.failed(err, false)
			}
		}
	}
	if err != nil {
		d.needFull = true
		return err
	}
	var errs []error
	if full && res.routeLocalnet {
		if err := d.host.SetSysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
			errs = append(errs, fmt.Errorf("enabling localhost NodePorts: %w", err))
		}
	}
	deleted := d.cleanConntrack(d.staleFlows(v, full))
	d.mode.synced(ctx, full)
	d.last = v
	d.needFull = len(errs) > 0
	d.result = Result{Full: full, Duration: time.Since(start), ConntrackDeleted: deleted}
	d.log.V(2).Info("Synced", append([]any{"family", d.family, "full", full, "servicePorts", v.Len(),
		"changedPorts", v.NumChanged(), "conntrackDeleted", deleted, "duration", d.result.Duration}, res.log...)...)
	return errors.Join(errs...)
}

// staleFlows lists the conntrack filters of the UDP ports whose intent
// changed since the last successful sync: on the first sync every port
// (flows may predate kproxy), then the changed ones (every port of a full
// sync whose intent is not the one last programmed).
func (d *Driver) staleFlows(v *intent.View, full bool) []conntrack.Filter {
	var out []conntrack.Filter
	local := v.LocalAddrs
	if d.last == nil {
		for _, p := range v.Sorted() {
			out = append(out, conntrack.StaleFlows(nil, p, local)...)
		}
		return out
	}
	visit := func(n proxy.ServicePortName) {
		if old, cur := d.last.Port(n), v.Port(n); old != cur {
			out = append(out, conntrack.StaleFlows(old, cur, local)...)
		}
	}
	if !full {
		v.ChangedPorts(func(n proxy.ServicePortName, _ *intent.Port) { visit(n) })
		return out
	}
	for _, p := range v.Sorted() {
		visit(p.Name)
	}
	for _, p := range d.last.Sorted() {
		if v.Port(p.Name) == nil {
			visit(p.Name)
		}
	}
	return out
}

// cleanConntrack deletes stale flows once the rules are in place and
// returns how many it deleted. A failure (netlink's dump interrupted by a
// busy table, say) never fails the sync: it is logged and counted, and the
// filters wait, merged per frontend, for the next sync.
func (d *Driver) cleanConntrack(filters []conntrack.Filter) int {
	d.pendingCT.add(filters)
	if d.pendingCT.empty() {
		return 0
	}
	start := time.Now()
	m := conntrack.NewMatcher(d.pendingCT.filters())
	n, err := d.ct.DeleteFlows(d.family, m.Match)
	d.ctMetrics(n, time.Since(start), err != nil)
	if err != nil {
		d.log.Error(err, "Deleting stale conntrack flows failed; retrying with the next sync", "family", d.family,
			"frontends", d.pendingCT.len(), "deleted", n)
		return n
	}
	d.pendingCT.clear()
	return n
}

// Connections returns the established connections of the least-connection
// ports' endpoints (see intent.ConnectionCounter and leastConn).
func (d *Driver) Connections(ports *proxy.FamilyView, ch proxy.Changes) (map[proxy.ServicePortName]map[netip.AddrPort]int, map[proxy.ServicePortName]struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := d.lc.refresh(ports, ch, time.Now())
	return d.lc.conns, changed
}

// ConnectionsDue reports whether the periodic read of the connection
// counts is due (some port balances by least connection).
func (d *Driver) ConnectionsDue() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.needFull && d.lc.active() && d.lc.due(time.Now())
}

// DryRun writes exactly what a full sync of v would run on a node without
// kproxy's rules (see intent.DryRunner). It changes nothing.
func (d *Driver) DryRun(w io.Writer, v *intent.View) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mode.dryRun(w, v)
}

// Cleanup removes everything kproxy owns in this family's kernel state;
// the next sync is full.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.needFull, d.last = true, nil
	return d.mode.cleanup(ctx)
}
