package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PacketCounters are the packet counters of the iptables rules behind
// upstream kube-proxy's packet metrics, as read from the kernel now, by
// source (one per IP family and rule). A source that is absent was not read.
type PacketCounters struct {
	// InvalidDropped: the rule dropping forwarded packets conntrack marks
	// INVALID.
	InvalidDropped map[string]uint64
	// LocalhostNodePortsAccepted: the rule counting localhost NodePort
	// connections DNATed to an endpoint.
	LocalhostNodePortsAccepted map[string]uint64
}

var (
	invalidDroppedDesc = prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		alpha+"packets dropped by iptables to work around conntrack problems", nil, nil)
	localhostAcceptedDesc = prometheus.NewDesc("kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
		alpha+"Number of packets accepted on nodeports of loopback interface", nil, nil)
)

// IPTablesPacketCounters serves upstream's two iptables packet counters
// (iptables mode), read at every scrape by read. Rule counters restart at
// zero when kproxy rewrites their chain (rarely: only when its content
// changes); the served counters never go back: a counter read lower than
// before is taken as restarted and added to what was served. A failed read
// serves the last values.
func (m *Metrics) IPTablesPacketCounters(read func() (PacketCounters, error)) {
	if m == nil || read == nil {
		return
	}
	m.reg.MustRegister(&packetCollector{read: read,
		invalid: newMonotonic(), localhost: newMonotonic()})
}

type packetCollector struct {
	read func() (PacketCounters, error)

	mu                 sync.Mutex
	invalid, localhost *monotonic
}

func (c *packetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- invalidDroppedDesc
	ch <- localhostAcceptedDesc
}

func (c *packetCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc, err := c.read(); err == nil {
		c.invalid.update(pc.InvalidDropped)
		c.localhost.update(pc.LocalhostNodePortsAccepted)
	}
	ch <- prometheus.MustNewConstMetric(invalidDroppedDesc, prometheus.CounterValue, float64(c.invalid.total()))
	ch <- prometheus.MustNewConstMetric(localhostAcceptedDesc, prometheus.CounterValue, float64(c.localhost.total()))
}

// monotonic sums raw counters by source into a counter that never goes
// back when a source restarts from zero.
type monotonic struct {
	last, base map[string]uint64
}

func newMonotonic() *monotonic {
	return &monotonic{last: map[string]uint64{}, base: map[string]uint64{}}
}

func (m *monotonic) update(raw map[string]uint64) {
	for src, v := range raw {
		if v < m.last[src] {
			m.base[src] += m.last[src]
		}
		m.last[src] = v
	}
}

func (m *monotonic) total() uint64 {
	var t uint64
	for src, v := range m.last {
		t += v + m.base[src]
	}
	for src, b := range m.base {
		if _, ok := m.last[src]; !ok {
			t += b
		}
	}
	return t
}
