package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/intent"
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
	p       *intent.Port // the version that was rejected
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
func overBudget(v *intent.View, budget int) map[proxy.ServicePortName]string {
	if v == nil || budget <= 0 {
		return nil
	}
	perSvc := map[types.NamespacedName]int{}
	for _, p := range v.Sorted() {
		perSvc[p.Name.NamespacedName] += iptables.EstimateRules(p.From)
	}
	var out map[proxy.ServicePortName]string
	for _, p := range v.Sorted() {
		n := p.Name
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
// kernel now accepts are released.
func (m *iptMode) exclusions(ctx context.Context, v *intent.View, now time.Time) map[proxy.ServicePortName]bool {
	m.budgeted = overBudget(v, m.opts.RuleBudget)
	var due []*intent.Port
	for n, q := range m.quarantine {
		p := v.Port(n)
		switch {
		case p == nil:
			delete(m.quarantine, n) // gone
		case p != q.p || !now.Before(q.retry):
			due = append(due, p)
		}
	}
	if len(due) > 0 {
		bad, err := m.isolateRejected(ctx, due)
		switch {
		case err != nil:
			m.log.Error(err, "Retrying quarantined service ports failed; keeping them out", "family", m.family, "ports", len(due))
			for _, p := range due {
				m.requeue(p, m.quarantine[p.Name].reason, now)
			}
		default:
			for _, p := range due {
				if reason, ok := bad[p.Name]; ok {
					m.requeue(p, reason, now)
					continue
				}
				m.log.Info("The kernel accepts a quarantined service port again", "servicePort", p.Name, "family", m.family)
				delete(m.quarantine, p.Name)
			}
		}
	}
	out := make(map[proxy.ServicePortName]bool, len(m.budgeted)+len(m.quarantine))
	for n := range m.budgeted {
		out[n] = true
	}
	for n := range m.quarantine {
		out[n] = true
	}
	return out
}

// requeue puts p (back) in quarantine with the next backoff.
func (m *iptMode) requeue(p *intent.Port, reason string, now time.Time) {
	q := m.quarantine[p.Name]
	if q == nil {
		q = &quarantined{since: now}
		m.quarantine[p.Name] = q
	}
	if q.p == p && q.backoff > 0 {
		q.backoff = min(2*q.backoff, quarantineMaxBackoff)
	} else {
		q.backoff = quarantineMinBackoff
	}
	q.p, q.reason, q.retry = p, reason, now.Add(q.backoff)
}

// quarantineFailure looks for the service ports that make the kernel reject
// a restore, among the ports of view not already excluded, and quarantines
// them. It returns how many it found (0: the failure is not a port's).
func (m *iptMode) quarantineFailure(ctx context.Context, v *intent.View, exclude map[proxy.ServicePortName]bool, now time.Time) int {
	var ports []*intent.Port
	for _, p := range v.Sorted() {
		if !exclude[p.Name] {
			ports = append(ports, p)
		}
	}
	start := time.Now()
	if err := m.probe(ctx, nil); err != nil {
		// Even an empty probe fails: nothing to blame on a port.
		m.log.V(2).Info("Not isolating: iptables-restore fails without any service port", "family", m.family, "err", err)
		return 0
	}
	bad, err := m.isolateRejected(ctx, ports)
	if err != nil {
		m.log.Error(err, "Could not isolate what the kernel rejects", "family", m.family)
		return 0
	}
	for _, p := range ports {
		if reason, ok := bad[p.Name]; ok {
			m.requeue(p, reason, now)
			m.log.Error(errors.New(reason), "The kernel rejects the rules of a service port; leaving it out and programming the rest",
				"servicePort", p.Name, "family", m.family, "retry", m.quarantine[p.Name].retry)
		}
	}
	m.log.V(2).Info("Isolated rejected service ports", "family", m.family, "ports", len(ports), "rejected", len(bad), "took", time.Since(start))
	return len(bad)
}

// isolateRejected finds, by bisection over probes (iptables.Planner.Probe: the ports'
// rules written into scratch chains nothing jumps to), the ports whose
// rules the kernel rejects, with the kernel's error. One bad port among n
// costs about 2·log2(n) restores.
func (m *iptMode) isolateRejected(ctx context.Context, ports []*intent.Port) (map[proxy.ServicePortName]string, error) {
	bad := map[proxy.ServicePortName]string{}
	var walk func(ports []*intent.Port) error
	walk = func(ports []*intent.Port) error {
		if len(ports) == 0 {
			return nil
		}
		err := m.probe(ctx, ports)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if len(ports) == 1 {
			// Blame the port only if a restore without it works.
			if m.probe(ctx, nil) != nil {
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
func (m *iptMode) probe(ctx context.Context, ports []*intent.Port) error {
	create, remove := m.planner.Probe(ports)
	if err := m.opts.Iptables.Restore(ctx, create); err != nil {
		return err
	}
	if err := m.opts.Iptables.Restore(ctx, remove); err != nil {
		// Harmless: scratch chains are owned, the next full sync deletes them.
		m.log.Error(err, "Removing probe chains failed", "family", m.family)
	}
	return nil
}

// quarantined lists the service ports the last sync left out.
func (m *iptMode) quarantined() []proxy.QuarantinedPort {
	out := make([]proxy.QuarantinedPort, 0, len(m.quarantine)+len(m.budgeted))
	for n, q := range m.quarantine {
		out = append(out, proxy.QuarantinedPort{Name: n, Family: m.family, Reason: q.reason, Since: q.since, Retry: q.retry})
	}
	for n, reason := range m.budgeted {
		if _, ok := m.quarantine[n]; !ok {
			out = append(out, proxy.QuarantinedPort{Name: n, Family: m.family, Reason: reason})
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
