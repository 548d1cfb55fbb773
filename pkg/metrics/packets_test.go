package metrics

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestIPTablesPacketCounters checks upstream's names, types and help, the
// sum over sources, a rule counter restarting from zero (the counter goes
// on) and a failed read (the last values stay).
func TestIPTablesPacketCounters(t *testing.T) {
	m := New(Options{Mode: ModeIPTables})
	reads := []struct {
		pc  PacketCounters
		err error
		// want invalid, localhost after the read
		invalid, localhost float64
	}{
		{PacketCounters{InvalidDropped: map[string]uint64{"IPv4": 3, "IPv6": 1}, LocalhostNodePortsAccepted: map[string]uint64{"IPv4": 2}}, nil, 4, 2},
		{PacketCounters{InvalidDropped: map[string]uint64{"IPv4": 5, "IPv6": 1}, LocalhostNodePortsAccepted: map[string]uint64{"IPv4": 7}}, nil, 6, 7},
		{PacketCounters{}, errors.New("iptables: lock held"), 6, 7},
		// The IPv4 chain was rewritten: its counters restarted.
		{PacketCounters{InvalidDropped: map[string]uint64{"IPv4": 1, "IPv6": 2}, LocalhostNodePortsAccepted: map[string]uint64{"IPv4": 0}}, nil, 8, 7},
		{PacketCounters{InvalidDropped: map[string]uint64{"IPv4": 4, "IPv6": 2}, LocalhostNodePortsAccepted: map[string]uint64{"IPv4": 1}}, nil, 11, 8},
	}
	i := 0
	m.IPTablesPacketCounters(func() (PacketCounters, error) { r := reads[i]; return r.pc, r.err })
	for ; i < len(reads); i++ {
		want := reads[i]
		text := scrape(t, m)
		for name, v := range map[string]float64{
			"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     want.invalid,
			"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": want.localhost,
		} {
			line := fmt.Sprintf("%s %g", name, v)
			if !strings.Contains(text, "\n"+name+" ") || !strings.Contains(text, "# TYPE "+name+" counter") {
				t.Fatalf("read %d: %s missing or not a counter:\n%s", i, name, text)
			}
			if !strings.Contains(text, "\n"+line+"\n") {
				t.Errorf("read %d: want %q in:\n%s", i, line, grepLines(text, name))
			}
		}
	}
}

func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
