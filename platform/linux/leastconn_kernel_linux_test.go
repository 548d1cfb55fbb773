package linux

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	v1 "k8s.io/api/core/v1"
)

// ctFlow builds a TCP flow from client:sport to vip:80, DNATed to ep, in
// the given TCP state.
func ctFlow(client netip.Addr, sport uint16, ep netip.AddrPort, state uint8) *netlink.ConntrackFlow {
	f := &netlink.ConntrackFlow{FamilyType: netlink.FAMILY_V4, TimeOut: 600}
	f.Forward = netlink.IPTuple{Protocol: 6, SrcIP: client.AsSlice(), SrcPort: sport, DstIP: net.ParseIP("10.96.0.1"), DstPort: 80}
	f.Reverse = netlink.IPTuple{Protocol: 6, SrcIP: ep.Addr().AsSlice(), SrcPort: ep.Port(), DstIP: client.AsSlice(), DstPort: sport}
	f.ProtoInfo = &netlink.ProtoInfoTCP{State: state}
	return f
}

// TestKernelCountEstablished: the netlink seam counts only established TCP
// flows, per reply source, among the endpoints asked for.
func TestKernelCountEstablished(t *testing.T) {
	inNetns(t, func() {
		a := netip.MustParseAddrPort("10.244.2.10:8080")
		b := netip.MustParseAddrPort("10.244.2.11:8080")
		other := netip.MustParseAddrPort("10.244.2.12:8080")
		client := netip.MustParseAddr("10.244.1.100")
		var flows []*netlink.ConntrackFlow
		for i := range 5 {
			flows = append(flows, ctFlow(client, uint16(1000+i), a, nl.TCP_CONNTRACK_ESTABLISHED))
		}
		flows = append(flows,
			ctFlow(client, 2000, b, nl.TCP_CONNTRACK_ESTABLISHED),
			ctFlow(client, 2001, b, nl.TCP_CONNTRACK_TIME_WAIT),
			ctFlow(client, 2002, other, nl.TCP_CONNTRACK_ESTABLISHED))
		for i, f := range flows {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, f); err != nil {
				t.Fatalf("creating flow %d: %v", i, err)
			}
		}
		got, err := netlinkConntrack{}.CountEstablished(v1.IPv4Protocol, map[netip.AddrPort]bool{a: true, b: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[a] != 5 || got[b] != 1 {
			t.Errorf("counts %v, want %s=5 %s=1", got, a, b)
		}
	})
}

// BenchmarkKernelCountEstablished reads a conntrack table of 100,000
// established TCP flows (in a throwaway namespace) and counts those of 10
// endpoints: the cost of one least-connection refresh. Run with
// -benchtime 5x.
func BenchmarkKernelCountEstablished(b *testing.B) {
	inNetns(b, func() {
		const n = 100_000
		eps := map[netip.AddrPort]bool{}
		var list []netip.AddrPort
		for i := range 10 {
			ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 2, byte(10 + i)}), 8080)
			eps[ap] = true
			list = append(list, ap)
		}
		begin := time.Now()
		for i := range n {
			client := netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)})
			f := ctFlow(client, uint16(1024+i%50000), list[i%len(list)], nl.TCP_CONNTRACK_ESTABLISHED)
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, f); err != nil {
				b.Fatalf("creating flow %d: %v", i, err)
			}
		}
		b.Logf("created %d flows in %v", n, time.Since(begin).Round(time.Millisecond))
		b.ResetTimer()
		for range b.N {
			got, err := netlinkConntrack{}.CountEstablished(v1.IPv4Protocol, eps)
			if err != nil {
				b.Fatal(err)
			}
			total := 0
			for _, c := range got {
				total += c
			}
			if total != n {
				b.Fatalf("counted %d, want %d", total, n)
			}
		}
		b.ReportMetric(float64(n), "flows")
	})

}
