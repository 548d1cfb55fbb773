package proxy

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestSortQuarantinedByNameThenFamily(t *testing.T) {
	name := func(ns, n string) ServicePortName {
		return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: n}, Protocol: v1.ProtocolTCP}
	}
	got := []QuarantinedPort{{Name: name("b", "x"), Family: v1.IPv6Protocol},
		{Name: name("b", "x"), Family: v1.IPv4Protocol}, {Name: name("a", "y"), Family: v1.IPv4Protocol}}
	SortQuarantined(got)
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
