package nftables

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

func a(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
func n(v uint64) nft.Value { return nft.Num(v) }

var tcpV, _ = nft.Proto("tcp")

// TestElemLayouts: an element of each layout made from nft values writes
// the text nft writes for those values, gives them back, and is the
// element the renderer makes of the same parts.
func TestElemLayouts(t *testing.T) {
	drop := &nft.Verdict{Kind: "drop"}
	for _, c := range []struct {
		set      string
		e        nft.Elem
		text     string
		renderer Elem
	}{
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.96.0.1"), tcpV, n(80)}, Verdict: nft.Goto("dnat-cluster-ip-tcp-r2")},
			"10.96.0.1 . tcp . 80 : goto dnat-cluster-ip-tcp-r2", dispatchElem(netip.MustParseAddr("10.96.0.1"), tcp, 80, nft.Goto("dnat-cluster-ip-tcp-r2"))},
		{MapFrontends, nft.Elem{Key: nft.Key{a("::"), n(47), n(0)}, Verdict: drop}, ":: . 47 . 0 : drop", dispatchElem(netip.IPv6Unspecified(), 47, 0, drop)},
		{MapNodePorts, nft.Elem{Key: nft.Key{tcpV, n(30001)}, Verdict: nft.Jump("x")}, "tcp . 30001 : jump x", dispatchElem(netip.Addr{}, tcp, 30001, nft.Jump("x"))},
		{SetNodePortRejects, nft.Elem{Key: nft.Key{tcpV, n(65535)}}, "tcp . 65535", rejectElem(tcp, 65535)},
		{"local-ip-sctp", nft.Elem{Key: nft.Key{a("fd00::1"), n(443), n(31)}, Data: nft.Key{a("fd00:1::5"), n(8443)}}, "fd00::1 . 443 . 31 : fd00:1::5 . 8443",
			slotElem(slots("local-ip-sctp"), netip.MustParseAddr("fd00::1"), 443, 31, netip.MustParseAddrPort("[fd00:1::5]:8443"))},
		{"cluster-np-udp", nft.Elem{Key: nft.Key{n(30053), n(4294967295)}, Data: nft.Key{a("10.244.1.6"), n(53)}}, "30053 . 4294967295 : 10.244.1.6 . 53",
			slotElem(slots("cluster-np-udp"), netip.Addr{}, 30053, 4294967295, netip.MustParseAddrPort("10.244.1.6:53"))},
		{SetHairpin, nft.Elem{Key: nft.Key{a("10.244.1.5"), a("10.244.1.5")}}, "10.244.1.5 . 10.244.1.5", hairpinElem(netip.MustParseAddr("10.244.1.5"))},
		{SetNodePorts, nft.Elem{Key: nft.Key{a("fd00::2")}}, "fd00::2", nodePortIPElem(netip.MustParseAddr("fd00::2"))},
		{SetPodCIDRs, nft.Elem{Key: nft.Key{nft.Prefix(netip.MustParsePrefix("10.244.0.0/16"))}}, "10.244.0.0/16", podCIDRElem(netip.MustParsePrefix("10.244.0.0/16"))},
	} {
		e, err := NewElem(c.set, c.e)
		if err != nil {
			t.Errorf("%s %s: %v", c.set, c.e, err)
			continue
		}
		if got := e.String(); got != c.text || c.e.String() != c.text {
			t.Errorf("%s: %q (nft writes %q), want %q", c.set, got, c.e, c.text)
		}
		if got := e.NFT().String(); got != c.text {
			t.Errorf("%s: NFT() %q, want %q", c.set, got, c.text)
		}
		if e.Set() != c.set {
			t.Errorf("%s: set %q", c.set, e.Set())
		}
		if e.id() != c.renderer.id() || !e.sameValue(&c.renderer) {
			t.Errorf("%s %s: the renderer's element is another: %s", c.set, c.text, c.renderer)
		}
	}
}

// NewElem refuses what does not fit the set's layout.
func TestNewElemRefuses(t *testing.T) {
	drop := &nft.Verdict{Kind: "drop"}
	data := nft.Key{a("10.0.0.2"), n(80)}
	zoned := nft.Addr(netip.MustParseAddr("fe80::1%eth0"))
	for _, c := range []struct {
		set string
		e   nft.Elem
	}{
		{"aff-abcdefgh", nft.Elem{Key: nft.Key{a("10.0.0.1")}}},
		{"cluster-xx-tcp", nft.Elem{Key: nft.Key{a("10.0.0.1"), n(80), n(0)}, Data: data}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV}, Verdict: drop}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80), n(1)}, Verdict: drop}},
		{MapFrontends, nft.Elem{Key: nft.Key{tcpV, a("10.0.0.1"), n(80)}, Verdict: drop}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), n(256), n(80)}, Verdict: drop}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(65536)}, Verdict: drop}},
		{MapFrontends, nft.Elem{Key: nft.Key{zoned, tcpV, n(80)}, Verdict: drop}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}, Data: data}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}, Verdict: &nft.Verdict{Kind: "dnat"}}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}, Verdict: nft.Goto("")}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}, Verdict: &nft.Verdict{Kind: "drop", Chain: "x"}}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}, Verdict: nft.Goto(rolePrefix + "fw-x")}},
		{MapFrontends, nft.Elem{Key: nft.Key{a("10.0.0.1"), tcpV, n(80)}, Verdict: nft.Goto(strings.Repeat("c", 256))}},
		{MapNodePorts, nft.Elem{Key: nft.Key{nft.Name("tcp"), n(80)}, Verdict: drop}},
		{"cluster-ip-tcp", nft.Elem{Key: nft.Key{a("10.0.0.1"), n(80), n(1 << 32)}, Data: data}},
		{"cluster-ip-tcp", nft.Elem{Key: nft.Key{a("10.0.0.1"), n(80), n(0)}}},
		{"cluster-ip-tcp", nft.Elem{Key: nft.Key{a("10.0.0.1"), n(80), n(0)}, Verdict: drop}},
		{"cluster-ip-tcp", nft.Elem{Key: nft.Key{a("10.0.0.1"), n(80), n(0)}, Data: nft.Key{a("10.0.0.2")}}},
		{"cluster-ip-tcp", nft.Elem{Key: nft.Key{a("10.0.0.1"), n(80), n(0)}, Data: nft.Key{a("fd00::2"), n(80)}}},
		{"cluster-np-tcp", nft.Elem{Key: nft.Key{n(80), n(0)}, Data: nft.Key{n(80), a("10.0.0.2")}}},
		{SetHairpin, nft.Elem{Key: nft.Key{a("10.0.0.1"), a("fd00::1")}}},
		{SetHairpin, nft.Elem{Key: nft.Key{a("10.0.0.1"), a("10.0.0.1")}, Verdict: drop}},
		{SetNodePorts, nft.Elem{Key: nft.Key{nft.Prefix(netip.MustParsePrefix("10.0.0.0/8"))}}},
		{SetPodCIDRs, nft.Elem{Key: nft.Key{a("10.0.0.1")}}},
		{SetNodePortRejects, nft.Elem{Key: nft.Key{tcpV, n(80)}, Data: data}},
	} {
		if e, err := NewElem(c.set, c.e); err == nil || !errors.Is(err, errBadElem) {
			t.Errorf("%s %s: %v, %v; want refused", c.set, c.e, e, err)
		}
	}
}
