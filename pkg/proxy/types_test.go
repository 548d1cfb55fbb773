package proxy

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func ep(s string, local bool) Endpoint {
	ap := netip.MustParseAddrPort(s)
	return Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: true, Serving: true, Local: local}
}

func TestTrafficPolicyHelpers(t *testing.T) {
	a, b, c := ep("10.0.0.1:80", true), ep("10.0.0.2:80", false), ep("10.0.0.3:80", true)
	tests := []struct {
		name                   string
		p                      ServicePort
		usesCluster, usesLocal bool
		internal, external     string
		all                    string
	}{
		{"cluster only", ServicePort{ClusterEndpoints: []Endpoint{a, b}}, true, false, "10.0.0.1:80 10.0.0.2:80", "10.0.0.1:80 10.0.0.2:80", "10.0.0.1:80 10.0.0.2:80"},
		{"internal local", ServicePort{InternalPolicyLocal: true, LocalEndpoints: []Endpoint{a}}, false, true, "10.0.0.1:80", "", "10.0.0.1:80"},
		{"external local on a NodePort", ServicePort{NodePort: 30000, ExternalPolicyLocal: true, ClusterEndpoints: []Endpoint{a, b}, LocalEndpoints: []Endpoint{a, c}},
			true, true, "10.0.0.1:80 10.0.0.2:80", "10.0.0.1:80 10.0.0.3:80", "10.0.0.1:80 10.0.0.2:80 10.0.0.3:80"},
		{"internal local with an externalIP", ServicePort{ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, InternalPolicyLocal: true, ClusterEndpoints: []Endpoint{b}, LocalEndpoints: []Endpoint{a}},
			true, true, "10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80 10.0.0.2:80"},
	}
	str := func(eps []Endpoint) string {
		var s []string
		for _, e := range eps {
			s = append(s, e.String())
		}
		return strings.Join(s, " ")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			if p.UsesClusterEndpoints() != tc.usesCluster || p.UsesLocalEndpoints() != tc.usesLocal {
				t.Errorf("uses cluster %v local %v", p.UsesClusterEndpoints(), p.UsesLocalEndpoints())
			}
			if got := str(p.InternalEndpoints()); got != tc.internal {
				t.Errorf("internal %q", got)
			}
			if got := str(p.ExternalEndpoints()); got != tc.external {
				t.Errorf("external %q", got)
			}
			if got := str(p.AllReachableEndpoints()); got != tc.all {
				t.Errorf("all %q", got)
			}
		})
	}
}

func TestServicePortNameOrderAndString(t *testing.T) {
	n := func(ns, name, port string, proto v1.Protocol) ServicePortName {
		return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
	}
	if s := n("ns", "svc", "http", "TCP").String(); s != "ns/svc:http" {
		t.Errorf("String %q", s)
	}
	if s := n("ns", "svc", "", "TCP").String(); s != "ns/svc" {
		t.Errorf("String %q", s)
	}
	ordered := []ServicePortName{n("a", "b", "", "TCP"), n("a", "b", "", "UDP"), n("a", "b", "x", "TCP"), n("a", "c", "", "TCP"), n("b", "a", "", "TCP")}
	for i := range ordered {
		for j := range ordered {
			if got := ordered[i].Less(ordered[j]); got != (i < j) {
				t.Errorf("%v < %v = %v", ordered[i], ordered[j], got)
			}
		}
	}
}

func TestWriteYAMLIsDeterministic(t *testing.T) {
	p1 := &ServicePort{Name: ServicePortName{NamespacedName: types.NamespacedName{Namespace: "b", Name: "x"}, Protocol: "TCP"},
		Family: v1.IPv4Protocol, Type: v1.ServiceTypeClusterIP, ClusterIP: netip.MustParseAddr("10.96.0.2"), Port: 80, Protocol: "TCP",
		ClusterEndpoints: []Endpoint{ep("10.0.0.1:8080", false)}, HasAnyEndpoints: true}
	p2 := &ServicePort{Name: ServicePortName{NamespacedName: types.NamespacedName{Namespace: "a", Name: "y"}, Protocol: "UDP"},
		Family: v1.IPv4Protocol, Type: v1.ServiceTypeClusterIP, ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 53, Protocol: "UDP"}
	snap := &Snapshot{Node: Node{Name: "n1"}, IPv4: NewFamilyView(v1.IPv4Protocol, map[ServicePortName]*ServicePort{p1.Name: p1, p2.Name: p2}),
		IPv6: NewFamilyView(v1.IPv6Protocol, nil)}
	var first string
	for i := 0; i < 5; i++ {
		var b bytes.Buffer
		if err := WriteYAML(&b, snap); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = b.String()
		} else if b.String() != first {
			t.Fatalf("output changed between runs")
		}
	}
	if strings.Index(first, "a/y") > strings.Index(first, "b/x") {
		t.Errorf("not sorted:\n%s", first)
	}
	if !strings.Contains(first, "10.0.0.1:8080 ready") || !strings.Contains(first, "ipv6: []") {
		t.Errorf("unexpected rendering:\n%s", first)
	}
}

func TestChangesTouches(t *testing.T) {
	mk := func(names ...string) *FamilyView {
		m := map[ServicePortName]*ServicePort{}
		for _, n := range names {
			pn := ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: n}}
			m[pn] = &ServicePort{Name: pn}
		}
		return NewFamilyView(v1.IPv4Protocol, m)
	}
	name := func(n string) ServicePortName {
		return ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: n}}
	}
	ch := func(names ...string) Changes {
		c := Changes{Ports: map[ServicePortName]struct{}{}}
		for _, n := range names {
			c.Ports[name(n)] = struct{}{}
		}
		return c
	}
	old, cur := mk("a", "gone"), mk("a", "new")
	for _, tc := range []struct {
		name string
		ch   Changes
		want bool
	}{
		{"periodic sync", Changes{}, true},
		{"full", Changes{Full: true, Ports: ch("other").Ports}, true},
		{"node", Changes{Node: true, Ports: ch("other").Ports}, true},
		{"changed port of this family", ch("a"), true},
		{"port removed from this family", ch("gone"), true},
		{"port added to this family", ch("new"), true},
		{"only the other family's ports", ch("other", "v6only"), false},
	} {
		if got := tc.ch.Touches(old, cur); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if !ch("other").Touches(nil, cur) {
		t.Error("no previous view must count as touched")
	}
}
