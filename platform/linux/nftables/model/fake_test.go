package model_test

import (
	"context"
	"errors"
	"testing"

	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"

	"github.com/kproxy/kproxy/platform/linux/nftables"
	"sigs.k8s.io/knftables"
)

// TestFakeBusyChainOfVerdictElement: the kernel refuses to delete a chain
// that a verdict map element points at (EBUSY), as it refuses one a rule
// points at; the Fake must too, or a plan deleting a chain before the
// element that jumps to it passes the tests and fails on a node.
func TestFakeBusyChainOfVerdictElement(t *testing.T) {
	f := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	run := func(text string) error {
		return f.Run(context.Background(), nftables.TextTx(knftables.IPv4Family, text))
	}
	if err := run(`add table ip kproxy
add map ip kproxy m { type ipv4_addr : verdict ; }
add chain ip kproxy c
add chain ip kproxy d
add element ip kproxy m { 10.0.0.1 : goto c, 10.0.0.2 : jump d }`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c", "d"} {
		if err := run("delete chain ip kproxy " + c); !errors.Is(err, nftables.ErrBusy) {
			t.Errorf("deleting chain %s, which an element points at: %v, want EBUSY", c, err)
		}
	}
	// Once the element is gone, in the same transaction, the chain goes.
	if err := run("delete element ip kproxy m { 10.0.0.1 }\ndelete chain ip kproxy c"); err != nil {
		t.Errorf("deleting the element, then the chain: %v", err)
	}
}

// TestFakeReadsOnApply: the Fake reads every rule, element, base chain and
// set definition of a transaction when it applies it, into typed values: a
// form its reader does not know fails the transaction (ErrNotSupp) and
// changes nothing; what it read is held as values and written back as the
// same text.
func TestFakeReadsOnApply(t *testing.T) {
	f := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	run := func(text string) error {
		return f.Run(context.Background(), nftables.TextTx(knftables.IPv4Family, text))
	}
	if err := run(`add table ip kproxy
add chain ip kproxy pre { type nat hook prerouting priority -100 ; }
add chain ip kproxy c
add map ip kproxy m { type ipv4_addr . inet_proto . inet_service : verdict ; }
add rule ip kproxy pre ip daddr . meta l4proto . th dport vmap @m
add rule ip kproxy c meta mark & 0x00004000 == 0 return
add element ip kproxy m { 10.0.0.1 . tcp . 80 : goto c }`); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	for _, bad := range []string{
		"add rule ip kproxy c ip saddr 10.0.0.0/8 counter accept",
		"add rule ip kproxy c ip6 daddr ::1 drop",
		"add rule ip kproxy c accept drop",
		"add chain ip kproxy x { type nat hook ingress priority 0 ; }",
		"add set ip kproxy s { type ipv4_addr ; size 10 ; }",
		"add element ip kproxy m { 10.0.0.2 . tcp . 80 : queue }",
		"add element ip kproxy m { 10.0.0.2 . tcp . http : goto c }",
	} {
		if err := run("add chain ip kproxy new\n" + bad); !errors.Is(err, nftables.ErrNotSupp) {
			t.Errorf("%s: %v, want ErrNotSupp", bad, err)
		}
		if f.Dump() != before {
			t.Errorf("%s: a refused transaction changed the table:\n%s", bad, f.Dump())
		}
	}
	m := f.Model()
	if r := m.Chains["c"].Rules; len(r) != 1 || r[0].String() != "meta mark & 0x00004000 == 0 return" {
		t.Errorf("chain c: %v", r)
	}
	if b := m.Chains["pre"].Base; b == nil || b.Hook != "prerouting" || b.Priority != -100 {
		t.Errorf("chain pre: base %v", b)
	}
	if e, ok := m.Sets["m"].Elements["10.0.0.1 . tcp . 80"]; !ok || e.Verdict == nil || e.Verdict.Chain != "c" || e.Key[1].Num != 6 {
		t.Errorf("map m: %v", m.Sets["m"].Elements)
	}
	want := `table comment ""
map m { type ipv4_addr . inet_proto . inet_service : verdict ; }
	10.0.0.1 . tcp . 80 : goto c
chain c
	meta mark & 0x00004000 == 0 return
chain pre { type nat hook prerouting priority -100 }
	ip daddr . meta l4proto . th dport vmap @m
`
	if before != want {
		t.Errorf("dump:\n%s\nwant\n%s", before, want)
	}
}
