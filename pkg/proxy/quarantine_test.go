package proxy

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

type quarantining struct{ ports []QuarantinedPort }

func (quarantining) Sync(context.Context, *Snapshot, Changes) error { return nil }
func (q quarantining) Quarantined() []QuarantinedPort               { return q.ports }

type plain struct{}

func (plain) Sync(context.Context, *Snapshot, Changes) error { return nil }

func TestFanOutQuarantinedMergesAndSorts(t *testing.T) {
	name := func(ns, n string) ServicePortName {
		return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: n}, Protocol: v1.ProtocolTCP}
	}
	f := FanOut{
		quarantining{[]QuarantinedPort{{Name: name("b", "x"), Family: v1.IPv6Protocol}}},
		plain{},
		quarantining{[]QuarantinedPort{{Name: name("b", "x"), Family: v1.IPv4Protocol}, {Name: name("a", "y"), Family: v1.IPv4Protocol}}},
	}
	got := f.Quarantined()
	want := []string{"a/y IPv4", "b/x IPv4", "b/x IPv6"}
	if len(got) != len(want) {
		t.Fatalf("got %d ports, want %d", len(got), len(want))
	}
	for i, q := range got {
		if s := q.Name.NamespacedName.String() + " " + string(q.Family); s != want[i] {
			t.Errorf("port %d = %s, want %s", i, s, want[i])
		}
	}
}
