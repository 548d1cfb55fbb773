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
