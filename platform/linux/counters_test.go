package linux

import "testing"

// TestParsePacketCounters reads the two rules' packet counters from
// "iptables -S CHAIN -v" output and ignores every other rule.
func TestParsePacketCounters(t *testing.T) {
	out := `-N KPROXY-FORWARD
-A KPROXY-FORWARD -c 100 6000 -j KPROXY-FIREWALL
-A KPROXY-FORWARD -m conntrack --ctstate INVALID -c 12 720 -j DROP
-A KPROXY-FORWARD -m mark --mark 0x4000/0xc000 -c 9 540 -j ACCEPT
-N KPROXY-FIREWALL
-A KPROXY-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -c 4 240 -j DROP
-A KPROXY-FIREWALL -s 127.0.0.0/8 -m addrtype ! --dst-type LOCAL -m conntrack --ctstate NEW -m conntrack --ctstate DNAT -m comment --comment "kproxy localhost nodeports" -c 3 180
`
	got := ParsePacketCounters([]byte(out))
	want := PacketCounters{InvalidDropped: 12, LocalhostNodePortsAccepted: 3, FoundInvalidDropped: true, FoundLocalhostNodePortsAccepted: true}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := ParsePacketCounters([]byte("-N KPROXY-FORWARD\n-A KPROXY-FORWARD -c 1 60 -j KPROXY-FIREWALL\n")); got != (PacketCounters{}) {
		t.Errorf("without the rules: %+v", got)
	}
}
