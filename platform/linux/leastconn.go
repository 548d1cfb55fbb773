package linux

import (
	"maps"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// LeastConnRefresh is how often the established connections of the
// least-connection service ports' endpoints are read from conntrack, at
// most: a read costs a dump of the whole conntrack table of the family, so
// the next read waits at least leastConnCostFactor times as long as the last
// one took (reading then takes at most a tenth of one core).
const LeastConnRefresh = 5 * time.Second

const leastConnCostFactor = 10

// leastConnPort reports whether sp's endpoints need connection counts: a
// least-connection TCP port (only TCP has connections conntrack calls
// established: UDP and SCTP least-connection ports spread evenly).
func leastConnPort(sp *proxy.ServicePort) bool {
	return sp != nil && sp.EffectiveAlgorithm() == proxy.AlgorithmLeastConnection && sp.Protocol == v1.ProtocolTCP
}

// leastConn holds the established connections per endpoint of one
// family's least-connection service ports, read from conntrack: the
// weights both Linux modes render. It is not safe for concurrent use (the
// Driver's lock guards it).
type leastConn struct {
	family v1.IPFamily
	ct     Conntrack
	log    klog.Logger
	// conns are the counts per port, read at at in cost.
	conns map[proxy.ServicePortName]map[netip.AddrPort]int
	at    time.Time
	cost  time.Duration
	// view is the view ports was last updated to; ports its
	// least-connection ports, kept from the changed ports only (a
	// partial sync does not walk every port).
	view  *proxy.FamilyView
	ports map[proxy.ServicePortName]*proxy.ServicePort
}

// track updates b.ports to view. ch names every port that differs between
// b.view and view (the cache's changes since the last acknowledged
// snapshot do: b.view is never older).
func (b *leastConn) track(view *proxy.FamilyView, ch proxy.Changes) {
	if b.view == nil || ch.Full {
		b.ports = map[proxy.ServicePortName]*proxy.ServicePort{}
		for sp := range view.All() {
			if leastConnPort(sp) {
				b.ports[sp.Name] = sp
			}
		}
	} else {
		ch.Differences(b.view, view, func(n proxy.ServicePortName, _, sp *proxy.ServicePort) {
			if leastConnPort(sp) {
				b.ports[n] = sp
			} else {
				delete(b.ports, n)
			}
		})
	}
	b.view = view
}

// refresh reads the connection counts of the least-connection ports
// when they are due (every LeastConnRefresh, or at once when ch changes one
// of them: new endpoints get counts from the start; both within the cost
// cap) and returns the ports whose counts changed (to be re-rendered).
func (b *leastConn) refresh(view *proxy.FamilyView, ch proxy.Changes, now time.Time) map[proxy.ServicePortName]struct{} {
	b.track(view, ch)
	if len(b.ports) == 0 {
		b.conns = nil
		return nil
	}
	due := b.due(now)
	if !due && now.Sub(b.at) >= leastConnCostFactor*b.cost {
		for n := range b.ports {
			if ch.Changed(n) {
				due = true
				break
			}
		}
	}
	if !due {
		// Keep the counts of the ports still there; new ones spread evenly
		// until the next read.
		return nil
	}
	ports := make(map[proxy.ServicePortName][]proxy.Endpoint, len(b.ports))
	want := map[netip.AddrPort]bool{}
	for n, sp := range b.ports {
		ports[n] = sp.AllReachableEndpoints()
		for _, ep := range ports[n] {
			want[ep.AddrPort()] = true
		}
	}
	begin := time.Now()
	counts, err := b.ct.CountEstablished(b.family, want)
	b.cost = time.Since(begin)
	b.at = now
	if err != nil {
		// Keep the last counts: least connection degrades to stale weights.
		b.log.Error(err, "Reading connection counts for least-connection Services failed", "family", b.family)
		return nil
	}
	next := make(map[proxy.ServicePortName]map[netip.AddrPort]int, len(ports))
	changed := map[proxy.ServicePortName]struct{}{}
	for n, eps := range ports {
		m := make(map[netip.AddrPort]int, len(eps))
		for _, ep := range eps {
			if c := counts[ep.AddrPort()]; c > 0 {
				m[ep.AddrPort()] = c
			}
		}
		next[n] = m
		if !maps.Equal(m, b.conns[n]) {
			changed[n] = struct{}{}
		}
	}
	b.conns = next
	b.log.V(4).Info("Read least-connection counts", "family", b.family, "ports", len(ports), "endpoints", len(want),
		"changed", len(changed), "took", b.cost)
	return changed
}

// due reports whether the periodic read of the counts is due.
func (b *leastConn) due(now time.Time) bool {
	return b.at.IsZero() || now.Sub(b.at) >= max(LeastConnRefresh, leastConnCostFactor*b.cost)
}

// active reports whether some port asks for least connection.
func (b *leastConn) active() bool { return b.conns != nil }
