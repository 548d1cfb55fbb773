package nft_test

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// TestString: values, expressions, statements, rules, elements and base
// chains write the text nft reads.
func TestString(t *testing.T) {
	tcp, _ := nft.Proto("tcp")
	dnat, _ := nft.CTStatus("dnat")
	mark := nft.Hex32(0x4000)
	saddr := &nft.Payload{Base: "ip6", Field: "saddr"}
	masked := &nft.Match{Left: []nft.Expr{&nft.Meta{Key: "mark"}}, Mask: &mark, Op: nft.OpEq, Right: []nft.Key{{nft.Num(0)}}}
	for _, c := range []struct {
		got  interface{ String() string }
		want string
	}{
		{nft.Num(80), "80"},
		{mark, "0x00004000"},
		{nft.Value{Kind: nft.KindNum, Num: 0xff, Hex: 2}, "0xff"},
		{nft.Value{Kind: nft.KindNum, Num: 0x12345, Hex: 2}, "0x12345"},
		{nft.Hex32(0), "0x00000000"},
		{nft.Hex32(0xffffffff), "0xffffffff"},
		{tcp, "tcp"},
		{dnat, "dnat"},
		{nft.Addr(netip.MustParseAddr("fd00::1")), "fd00::1"},
		{nft.Prefix(netip.MustParsePrefix("10.0.0.0/8")), "10.0.0.0/8"},
		{nft.Quoted(`veth*`), `"veth*"`},
		{nft.Quoted(`a"b`), `"a\"b"`},
		{nft.Name("local"), "local"},
		{nft.Key{nft.Addr(netip.MustParseAddr("10.0.0.1")), tcp, nft.Num(80)}, "10.0.0.1 . tcp . 80"},
		{&nft.Meta{Key: "iifname"}, "iifname"},
		{&nft.Meta{Key: "l4proto"}, "meta l4proto"},
		{&nft.Fib{Addr: "daddr"}, "fib daddr type"},
		{&nft.Numgen{Mode: "inc", Mod: 3, Offset: 1}, "numgen inc mod 3 offset 1"},
		{&nft.Jhash{Of: saddr, Mod: 32, Seed: 0x6b707278}, "jhash ip6 saddr mod 32 seed 0x6b707278"},
		{masked, "meta mark & 0x00004000 == 0"},
		{&nft.Match{Left: []nft.Expr{&nft.CT{Key: "status"}}, Right: []nft.Key{{dnat}}}, "ct status dnat"},
		{&nft.Match{Left: []nft.Expr{saddr}, Op: nft.OpNe, Set: "pod-cidrs"}, "ip6 saddr != @pod-cidrs"},
		{&nft.Match{Left: []nft.Expr{&nft.CT{Key: "state"}}, Op: nft.OpNe, Anon: true, Right: []nft.Key{{nft.Name("established")}, {nft.Name("related")}}},
			"ct state != { established, related }"},
		{&nft.Match{Left: []nft.Expr{&nft.Numgen{Mode: "random", Mod: 1 << 31}}, Op: nft.OpLt, Right: []nft.Key{{nft.Num(5)}}}, "numgen random mod 2147483648 < 5"},
		{&nft.VMap{Key: []nft.Expr{&nft.Meta{Key: "l4proto"}, &nft.Payload{Base: "th", Field: "dport"}}, Map: "nodeports"}, "meta l4proto . th dport vmap @nodeports"},
		{&nft.DNAT{Family: "ip6", Addr: netip.MustParseAddr("fd00::1"), Port: 8080}, "dnat ip6 to [fd00::1]:8080"},
		{&nft.DNAT{Addr: netip.MustParseAddr("10.0.0.1")}, "dnat to 10.0.0.1"},
		{&nft.DNAT{Family: "ip", Key: []nft.Expr{&nft.Payload{Base: "tcp", Field: "dport"}, &nft.Numgen{Mode: "random", Mod: 2}}, Map: "cluster-np-tcp"},
			"dnat ip to tcp dport . numgen random mod 2 map @cluster-np-tcp"},
		{&nft.Masquerade{Flags: []string{"fully-random"}}, "masquerade fully-random"},
		{&nft.Reject{}, "reject"},
		{&nft.Reject{With: "tcp reset"}, "reject with tcp reset"},
		{&nft.MarkSet{Op: "|", Val: mark}, "meta mark set meta mark | 0x00004000"},
		{&nft.MarkSet{Val: nft.Num(1)}, "meta mark set 1"},
		{&nft.Update{Set: "aff-x", Key: saddr}, "update @aff-x { ip6 saddr }"},
		{nft.Rule{masked, &nft.Verdict{Kind: "return"}}, "meta mark & 0x00004000 == 0 return"},
		{nft.Goto("reject-chain"), "goto reject-chain"},
		{nft.BaseChain{Type: "nat", Hook: "prerouting", Priority: -100}, "type nat hook prerouting priority -100"},
		{nft.BaseChain{Type: "filter", Hook: "input", Policy: "drop"}, "type filter hook input priority 0 ; policy drop"},
		{nft.Elem{Key: nft.Key{tcp, nft.Num(30000)}, Verdict: nft.Jump("x")}, "tcp . 30000 : jump x"},
		{nft.Elem{Key: nft.Key{nft.Num(0)}, Data: nft.Key{nft.Addr(netip.MustParseAddr("10.0.0.1")), nft.Num(80)}}, "0 : 10.0.0.1 . 80"},
		{nft.Elem{Key: nft.Key{nft.Addr(netip.MustParseAddr("10.0.0.1"))}}, "10.0.0.1"},
	} {
		if s := c.got.String(); s != c.want {
			t.Errorf("%#v: %q, want %q", c.got, s, c.want)
		}
	}
	if !nft.Terminal(&nft.DNAT{}) || nft.Terminal(&nft.Update{}) || nft.Terminal(masked) {
		t.Error("Terminal: DNAT ends a rule, an update or a match does not")
	}
}

// TestAppend: Append appends what String returns, after what b holds.
func TestAppend(t *testing.T) {
	tcp, _ := nft.Proto("tcp")
	a := nft.Addr(netip.MustParseAddr("10.0.0.1"))
	for _, c := range []struct {
		app  func([]byte) []byte
		want string
	}{
		{nft.Hex32(0x4000).Append, "0x00004000"},
		{nft.Key{a, tcp, nft.Num(80)}.Append, "10.0.0.1 . tcp . 80"},
		{nft.Key{}.Append, ""},
		{nft.Goto("x").Append, "goto x"},
		{(&nft.Verdict{Kind: "drop"}).Append, "drop"},
		{nft.Elem{Key: nft.Key{tcp, nft.Num(1)}, Verdict: nft.Goto("y")}.Append, "tcp . 1 : goto y"},
		{nft.Elem{Key: nft.Key{a}, Data: nft.Key{a, nft.Num(8080)}}.Append, "10.0.0.1 : 10.0.0.1 . 8080"},
	} {
		if got := string(c.app([]byte("> "))); got != "> "+c.want {
			t.Errorf("%q, want %q", got, "> "+c.want)
		}
	}
}
