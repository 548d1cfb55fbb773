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

// TestUpstreamHelpHasStabilityLevel: upstream registers its metrics through
// component-base, which prefixes each help text with the stability level
// ("[ALPHA] " for every kubeproxy_* metric of v1.37); kproxy's own metrics
// have none.
func TestUpstreamHelpHasStabilityLevel(t *testing.T) {
	for _, mode := range []string{ModeIPTables, ModeKernelspace} {
		m := New(Options{Mode: mode, Pending: func() (int, int) { return 0, 0 }, FrontendConflicts: func() int { return 0 }})
		if mode == ModeIPTables {
			m.IPTablesPacketCounters(func() (PacketCounters, error) { return PacketCounters{}, nil })
		}
		text := scrape(t, m)
		upstreamSeen := 0
		for _, l := range strings.Split(text, "\n") {
			rest, ok := strings.CutPrefix(l, "# HELP ")
			if !ok {
				continue
			}
			name, help, _ := strings.Cut(rest, " ")
			switch {
			case strings.HasPrefix(name, "kubeproxy_"):
				upstreamSeen++
				if !strings.HasPrefix(help, "[ALPHA] ") {
					t.Errorf("%s: %s: help %q lacks upstream's [ALPHA] prefix", mode, name, help)
				}
			case strings.HasPrefix(name, "kproxy_") && strings.HasPrefix(help, "["):
				t.Errorf("%s: %s: kproxy's own metric has a stability prefix: %q", mode, name, help)
			}
		}
		if upstreamSeen < 4 { // vectors without a child are not scraped
			t.Errorf("%s: only %d kubeproxy_* metrics scraped", mode, upstreamSeen)
		}
		if mode != ModeIPTables {
			continue
		}
		for _, want := range []string{
			"# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total [ALPHA] packets dropped by iptables to work around conntrack problems\n",
			"# HELP kubeproxy_iptables_localhost_nodeports_accepted_packets_total [ALPHA] Number of packets accepted on nodeports of loopback interface\n",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("want %q in:\n%s", want, grepLines(text, "_packets_total"))
			}
		}
	}
}
