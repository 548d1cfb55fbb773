package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/iptables"
)

// DefaultRuleBudget is the default per-Service rule budget: a Service whose
// ports would need more rules (iptables.EstimateRules) is not programmed, so
// one object cannot produce millions of rules and slow every sync of the
// node. 50,000 rules is about 25,000 endpoints with session affinity or
// 50,000 without.
const DefaultRuleBudget = 50000

// Quarantine backoff: a service port the kernel rejected is retried after
// quarantineMinBackoff, doubling up to quarantineMaxBackoff.
const (
	quarantineMinBackoff = 5 * time.Second
	quarantineMaxBackoff = 5 * time.Minute
)

// quarantined is a service port left out of the rules because the kernel
// rejected them.
type quarantined struct {
	sp      *proxy.ServicePort // the version that was rejected
	reason  string
	since   time.Time
	retry   time.Time
	backoff time.Duration
}

// errTransient says a probe failed even without any service port: the
// restore itself fails (xtables lock, missing tools), so nothing can be
// blamed on a port.
var errTransient = errors.New("iptables-restore fails even without any service port")

// overBudget returns the ports of Services whose estimated rules exceed the
// budget, with the reason.
func overBudget(view *proxy.FamilyView, budget int) map[proxy.ServicePortName]string {
	if view == nil || budget <= 0 {
		return nil
	}
	perSvc := map[types.NamespacedName]int{}
	for _, sp := range view.Ports {
		perSvc[sp.Name.NamespacedName] += iptables.EstimateRules(sp)
	}
	var out map[proxy.ServicePortName]string
	for n := range view.Ports {
		if est := perSvc[n.NamespacedName]; est > budget {
			if out == nil {
				out = map[proxy.ServicePortName]string{}
			}
			out[n] = fmt.Sprintf("the Service needs about %d iptables rules, over the per-Service budget of %d", est, budget)
		}
	}
	return out
}

// exclusions returns the service ports to leave out of this sync: those
// over the rule budget and those in quarantine. Quarantined ports that are
// due for a retry (or whose Service changed) are probed first: the ones the
// kernel now accepts are released. Called with b.mu held.
func (b *Backend) exclusions(ctx context.Context, view *proxy.FamilyView, now time.Time) map[proxy.ServicePortName]bool {
	b.budgeted = overBudget(view, b.opts.RuleBudget)
	var due []*proxy.ServicePort
	for n, q := range b.quarantine {
		sp := view.Ports[n]
		switch {
		case sp == nil:
			delete(b.quarantine, n) // gone
		case sp != q.sp || !now.Before(q.retry):
			due = append(due, sp)
		}
	}
	if len(due) > 0 {
		bad, err := b.isolate(ctx, due)
		switch {
		case err != nil:
			b.log.Error(err, "Retrying quarantined service ports failed; keeping them out", "family", b.family, "ports", len(due))
			for _, sp := range due {
				b.requeue(sp, b.quarantine[sp.Name].reason, now)
			}
		default:
			for _, sp := range due {
				if reason, ok := bad[sp.Name]; ok {
					b.requeue(sp, reason, now)
					continue
				}
				b.log.Info("The kernel accepts a quarantined service port again", "servicePort", sp.Name, "family", b.family)
				delete(b.quarantine, sp.Name)
			}
		}
	}
	out := make(map[proxy.ServicePortName]bool, len(b.budgeted)+len(b.quarantine))
	for n := range b.budgeted {
		out[n] = true
	}
	for n := range b.quarantine {
		out[n] = true
	}
	return out
}

// requeue puts sp (back) in quarantine with the next backoff.
func (b *Backend) requeue(sp *proxy.ServicePort, reason string, now time.Time) {
	q := b.quarantine[sp.Name]
	if q == nil {
		q = &quarantined{since: now}
		b.quarantine[sp.Name] = q
	}
	if q.sp == sp && q.backoff > 0 {
		q.backoff = min(2*q.backoff, quarantineMaxBackoff)
	} else {
		q.backoff = quarantineMinBackoff
	}
	q.sp, q.reason, q.retry = sp, reason, now.Add(q.backoff)
}

// quarantineFailure looks for the service ports that make the kernel reject
// a restore, among the ports of view not already excluded, and quarantines
// them. It returns how many it found (0: the failure is not a port's).
func (b *Backend) quarantineFailure(ctx context.Context, view *proxy.FamilyView, exclude map[proxy.ServicePortName]bool, now time.Time) int {
	var ports []*proxy.ServicePort
	for _, sp := range view.Sorted() {
		if !exclude[sp.Name] {
			ports = append(ports, sp)
		}
	}
	start := time.Now()
	if err := b.probe(ctx, nil); err != nil {
		// Even an empty probe fails: nothing to blame on a port.
		b.log.V(2).Info("Not isolating: iptables-restore fails without any service port", "family", b.family, "err", err)
		return 0
	}
	bad, err := b.isolate(ctx, ports)
	if err != nil {
		b.log.Error(err, "Could not isolate what the kernel rejects", "family", b.family)
		return 0
	}
	for _, sp := range ports {
		if reason, ok := bad[sp.Name]; ok {
			b.requeue(sp, reason, now)
			b.log.Error(errors.New(reason), "The kernel rejects the rules of a service port; leaving it out and programming the rest",
				"servicePort", sp.Name, "family", b.family, "retry", b.quarantine[sp.Name].retry)
		}
	}
	b.log.V(2).Info("Isolated rejected service ports", "family", b.family, "ports", len(ports), "rejected", len(bad), "took", time.Since(start))
	return len(bad)
}

// isolate finds, by bisection over probes (iptables.Planner.Probe: the ports'
// rules written into scratch chains nothing jumps to), the ports whose
// rules the kernel rejects, with the kernel's error. One bad port among n
// costs about 2·log2(n) restores.
func (b *Backend) isolate(ctx context.Context, ports []*proxy.ServicePort) (map[proxy.ServicePortName]string, error) {
	bad := map[proxy.ServicePortName]string{}
	var walk func(ports []*proxy.ServicePort) error
	walk = func(ports []*proxy.ServicePort) error {
		if len(ports) == 0 {
			return nil
		}
		err := b.probe(ctx, ports)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if len(ports) == 1 {
			// Blame the port only if a restore without it works.
			if b.probe(ctx, nil) != nil {
				return fmt.Errorf("%w: %w", errTransient, err)
			}
			bad[ports[0].Name] = err.Error()
			return nil
		}
		mid := len(ports) / 2
		if err := walk(ports[:mid]); err != nil {
			return err
		}
		return walk(ports[mid:])
	}
	if err := walk(ports); err != nil {
		return nil, err
	}
	return bad, nil
}

// probe commits the rules of ports into scratch chains and removes them.
func (b *Backend) probe(ctx context.Context, ports []*proxy.ServicePort) error {
	create, remove := b.planner.Probe(ports)
	if err := b.opts.Iptables.Restore(ctx, create); err != nil {
		return err
	}
	if err := b.opts.Iptables.Restore(ctx, remove); err != nil {
		// Harmless: scratch chains are owned, the next full sync deletes them.
		b.log.Error(err, "Removing probe chains failed", "family", b.family)
	}
	return nil
}

// Quarantined lists the service ports the last sync left out (see
// proxy.Quarantiner): rejected by the kernel, or over the rule budget.
func (b *Backend) Quarantined() []proxy.QuarantinedPort {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]proxy.QuarantinedPort, 0, len(b.quarantine)+len(b.budgeted))
	for n, q := range b.quarantine {
		out = append(out, proxy.QuarantinedPort{Name: n, Family: b.family, Reason: q.reason, Since: q.since, Retry: q.retry})
	}
	for n, reason := range b.budgeted {
		if _, ok := b.quarantine[n]; !ok {
			out = append(out, proxy.QuarantinedPort{Name: n, Family: b.family, Reason: reason})
		}
	}
	proxy.SortQuarantined(out)
	return out
}

// foreignReferences lists the owned chains that a rule of a chain kproxy
// does not own jumps to, in one table's iptables-save output.
func foreignReferences(save []byte) map[string]bool {
	var out map[string]bool
	for line := range bytes.Lines(save) {
		if !bytes.HasPrefix(line, []byte("-A ")) {
			continue
		}
		fields := bytes.Fields(line)
		if len(fields) < 2 || iptables.Owned(string(fields[1])) {
			continue
		}
		for i := 2; i+1 < len(fields); i++ {
			if (string(fields[i]) == "-j" || string(fields[i]) == "-g") && iptables.Owned(string(fields[i+1])) {
				if out == nil {
					out = map[string]bool{}
				}
				out[string(fields[i+1])] = true
			}
		}
	}
	return out
}

func sameSet(a, b map[proxy.ServicePortName]bool) bool {
	return maps.Equal(a, b)
}

var _ proxy.Quarantiner = (*Backend)(nil)
