package nft

import (
	"context"
	"errors"
	"testing"

	"sigs.k8s.io/knftables"
)

// TestFakeBusyChainOfVerdictElement: the kernel refuses to delete a chain
// that a verdict map element points at (EBUSY), as it refuses one a rule
// points at; the Fake must too, or a plan deleting a chain before the
// element that jumps to it passes the tests and fails on a node.
func TestFakeBusyChainOfVerdictElement(t *testing.T) {
	f := NewFake(knftables.IPv4Family, TableName)
	tx := f.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Map{Name: "m", Type: "ipv4_addr : verdict"})
	tx.Add(&knftables.Chain{Name: "c"})
	tx.Add(&knftables.Chain{Name: "d"})
	tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}, Value: []string{"goto c"}})
	tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0.0.2"}, Value: []string{"jump d"}})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c", "d"} {
		tx = f.NewTransaction()
		tx.Delete(&knftables.Chain{Name: c})
		if err := f.Run(context.Background(), tx); !errors.Is(err, ErrBusy) {
			t.Errorf("deleting chain %s, which an element points at: %v, want EBUSY", c, err)
		}
	}
	// Once the element is gone, in the same transaction, the chain goes.
	tx = f.NewTransaction()
	tx.Delete(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}})
	tx.Delete(&knftables.Chain{Name: "c"})
	if err := f.Run(context.Background(), tx); err != nil {
		t.Errorf("deleting the element, then the chain: %v", err)
	}
}
