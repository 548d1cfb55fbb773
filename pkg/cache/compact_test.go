package cache

import (
	"net/netip"
	"reflect"
	"testing"
	"unsafe"

	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// The cache holds each endpoint twice: as read from its slice and as
// selected for each service port. Both forms are compact (issue 25:
// 153 B per endpoint at 10,000 Services before, 67 after, measured by
// BenchmarkHeld10kServices); a field added to either is a cost per
// endpoint of the cluster, and should show here.
func TestCompactEndpoints(t *testing.T) {
	if s := unsafe.Sizeof(sliceEndpoint{}); s != 16 {
		t.Errorf("sliceEndpoint is %d bytes, want 16", s)
	}
	if s := unsafe.Sizeof(proxy.Endpoint{}); s != 40 {
		t.Errorf("proxy.Endpoint is %d bytes, want 40", s)
	}

	// What the compact form keeps reads back as it was written: addresses
	// of both families, conditions, node, zone and hints.
	for _, tc := range []struct {
		at  discovery.AddressType
		eps []ep
	}{
		{discovery.AddressTypeIPv4, []ep{"10.0.0.1@node1/zone-a", "10.0.0.2@node2!", "255.255.255.254~^", "10.0.0.4/zone-b#hz=zone-b+zone-a#hn=node2"}},
		{discovery.AddressTypeIPv6, []ep{"fd00::1@node1/zone-a", "2001:db8::ffff:1@node2!", "fd00::3~^", "fe80::1/zone-b#hz=zone-b+zone-a#hn=node2"}},
	} {
		es := slice("ns/s-abc", "s", tc.at, []string{"http:8080"}, tc.eps...)
		info, problems := parseSlice(es)
		if len(problems) > 0 || info == nil || len(info.eps) != len(tc.eps) {
			t.Fatalf("%s: %+v, %v", tc.at, info, problems)
		}
		for i, e := range es.Endpoints {
			got := &info.eps[i]
			if a := info.addr(i); a != netip.MustParseAddr(e.Addresses[0]) {
				t.Errorf("%s: endpoint %d address %s, want %s", tc.at, i, a, e.Addresses[0])
			}
			wantReady := e.Conditions.Ready == nil || *e.Conditions.Ready
			wantServing := e.Conditions.Serving == nil || *e.Conditions.Serving
			wantTerm := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			if got.ready() != wantReady || got.serving() != wantServing || got.terminating() != wantTerm {
				t.Errorf("%s: endpoint %d conditions %03b", tc.at, i, got.flags)
			}
			loc := got.where.Value()
			var node, zone string
			if e.NodeName != nil {
				node = *e.NodeName
			}
			if e.Zone != nil {
				zone = *e.Zone
			}
			if loc.topo != proxy.At(node, zone) {
				t.Errorf("%s: endpoint %d at %+v, want %q %q", tc.at, i, loc.topo, node, zone)
			}
			if e.Hints != nil && (loc.zoneHints != "zone-a,zone-b" || loc.nodeHints != "node2") {
				t.Errorf("%s: endpoint %d hints %q %q", tc.at, i, loc.zoneHints, loc.nodeHints)
			}
			if e.Hints == nil && (loc.zoneHints != "" || loc.nodeHints != "") {
				t.Errorf("%s: endpoint %d has hints %q %q", tc.at, i, loc.zoneHints, loc.nodeHints)
			}
		}
	}
	// Endpoints without placement compare equal to literals; with it, the
	// accessors read the shared handle.
	if (proxy.Endpoint{Where: proxy.At("", "")}) != (proxy.Endpoint{}) {
		t.Error("no placement is not the zero handle")
	}
	if e := (proxy.Endpoint{Where: proxy.At("node1", "zone-a")}); e.NodeName() != "node1" || e.Zone() != "zone-a" || e.Where != proxy.At("node1", "zone-a") {
		t.Errorf("endpoint %+v", e)
	}
	for _, c := range []struct {
		list, name string
		want       bool
	}{{"a,b", "a", true}, {"a,b", "b", true}, {"a,bc", "b", false}, {"", "", false}, {"ab", "a", false}} {
		if hasName(c.list, c.name) != c.want {
			t.Errorf("hasName(%q, %q) = %v", c.list, c.name, !c.want)
		}
	}
}

// A Go map keeps the capacity it grew to, and ranging over it costs that
// capacity: the dirty and changed sets hold every Service after the
// initial lists, and were cleared, not dropped, so every later sync ranged
// over 100,000 empty slots (BenchmarkPartialSync at 100,000 Services: 500
// µs a change against 80 at 1,000; 20-70 once dropped). They must not be
// the maps that grew.
func TestGrownSetsAreDropped(t *testing.T) {
	svcs, sls := cluster(2*bigMap, 1)
	c := New(Options{NodeName: "node1", Logger: ptr(discardLogger())})
	for _, s := range svcs {
		c.OnService(nil, s)
	}
	for _, s := range sls {
		c.OnEndpointSlice(nil, s)
	}
	id := func(m any) uintptr { return reflect.ValueOf(m).Pointer() }
	dirty, changed := id(c.dirty), id(c.changed)
	snap, _ := c.Snapshot()
	if len(c.dirty) != 0 || id(c.dirty) == dirty {
		t.Errorf("the dirty set that held %d Services was cleared, not dropped", len(svcs))
	}
	c.Ack(snap)
	if len(c.changed) != 0 || id(c.changed) == changed {
		t.Errorf("the changed set that held %d ports was cleared, not dropped", len(svcs))
	}
	// Small sets are cleared and kept.
	c.OnEndpointSlice(sls[0], sls[0])
	c.OnService(svcs[1], svcs[1])
	dirty = id(c.dirty)
	snap, _ = c.Snapshot()
	c.Ack(snap)
	if id(c.dirty) != dirty {
		t.Error("a small dirty set was replaced")
	}
}
