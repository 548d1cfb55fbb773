package cache

import (
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

func changed(ch proxy.Changes) []string {
	var out []string
	for n := range ch.Ports {
		out = append(out, n.String())
	}
	sort.Strings(out)
	return out
}

func TestChangesCoalesceUntilAck(t *testing.T) {
	var kicks atomic.Int32
	c := New(Options{NodeName: thisNode, Notify: func() { kicks.Add(1) }})
	a := svc("ns/a", []string{"10.96.0.1"}, []string{"80"})
	b := svc("ns/b", []string{"10.96.0.2"}, []string{"80"})
	c.OnService(nil, a)
	c.OnService(nil, b)
	sa := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	c.OnEndpointSlice(nil, sa)
	for i := 0; i < 5; i++ { // many events on one Service: one change
		next := sa.DeepCopy()
		next.Endpoints = append(next.Endpoints, ep("10.0.1.2").build())
		c.OnEndpointSlice(sa, next)
		sa = next
	}
	if kicks.Load() != 8 {
		t.Errorf("notify called %d times, want 8", kicks.Load())
	}
	snap1, ch := c.Snapshot()
	if got := changed(ch); !slices.Equal(got, []string{"ns/a", "ns/b"}) {
		t.Errorf("changes %v", got)
	}
	if ch.ServiceEvents != 2 || ch.EndpointEvents != 6 {
		t.Errorf("events %d/%d, want 2/6", ch.ServiceEvents, ch.EndpointEvents)
	}
	if s, e := c.Pending(); s != 2 || e != 6 {
		t.Errorf("pending %d/%d", s, e)
	}

	// The sync of snap1 failed (no Ack); another change arrives.
	c.OnService(b, nil)
	snap2, ch := c.Snapshot()
	if got := changed(ch); !slices.Equal(got, []string{"ns/a", "ns/b"}) {
		t.Errorf("changes after failed sync %v", got)
	}
	if snap2.Generation <= snap1.Generation {
		t.Errorf("generation did not move: %d → %d", snap1.Generation, snap2.Generation)
	}
	c.Ack(snap2)
	snap3, ch := c.Snapshot()
	if !ch.Empty() || ch.ServiceEvents+ch.EndpointEvents != 0 {
		t.Errorf("changes after ack: %+v", ch)
	}
	if snap3 != snap2 {
		t.Errorf("no change must return the same snapshot")
	}
	if s, e := c.Pending(); s+e != 0 {
		t.Errorf("pending after ack %d/%d", s, e)
	}
}

func TestAckOfOlderSnapshotKeepsNewerChanges(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	a := svc("ns/a", []string{"10.96.0.1"}, []string{"80"})
	c.OnService(nil, a)
	snap1, _ := c.Snapshot()
	b := svc("ns/b", []string{"10.96.0.2"}, []string{"80"})
	c.OnService(nil, b) // arrives while snap1 is being programmed
	c.Ack(snap1)
	_, ch := c.Snapshot()
	if got := changed(ch); !slices.Equal(got, []string{"ns/b"}) {
		t.Errorf("changes %v, want [ns/b]", got)
	}
}

func TestSnapshotIsImmutableAndSharesUnchangedPorts(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	a := svc("ns/a", []string{"10.96.0.1"}, []string{"80"})
	b := svc("ns/b", []string{"10.96.0.2"}, []string{"80"})
	c.OnService(nil, a)
	c.OnService(nil, b)
	sa := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	c.OnEndpointSlice(nil, sa)
	snap1, _ := c.Snapshot()
	pa1 := snap1.IPv4.Get(spn("ns/a", "", ""))
	pb1 := snap1.IPv4.Get(spn("ns/b", "", ""))
	before := epList(pa1.ClusterEndpoints)

	sa2 := sa.DeepCopy()
	sa2.Endpoints[0].Addresses = []string{"10.0.1.9"}
	c.OnEndpointSlice(sa, sa2)
	c.OnService(nil, svc("ns/c", []string{"10.96.0.3"}, []string{"80"}))
	// A no-op update of b must not produce a new pointer.
	c.OnService(b, b.DeepCopy())
	snap2, ch := c.Snapshot()

	if got := epList(snap1.IPv4.Get(spn("ns/a", "", "")).ClusterEndpoints); got != before {
		t.Errorf("old snapshot changed: %q", got)
	}
	if snap1.IPv4.Len() != 2 || snap2.IPv4.Len() != 3 {
		t.Errorf("lens %d %d", snap1.IPv4.Len(), snap2.IPv4.Len())
	}
	if snap2.IPv4.Get(spn("ns/b", "", "")) != pb1 {
		t.Errorf("unchanged port b got a new pointer")
	}
	if snap2.IPv4.Get(spn("ns/a", "", "")) == pa1 {
		t.Errorf("changed port a kept its pointer")
	}
	if got := changed(ch); !slices.Equal(got, []string{"ns/a", "ns/b", "ns/c"}) {
		// b is reported because it was never acknowledged, not because it changed.
		t.Errorf("changes %v", got)
	}
	c.Ack(snap2)
	c.OnService(b, b.DeepCopy())
	_, ch = c.Snapshot()
	if !ch.Empty() {
		t.Errorf("no-op update reported as change: %v", changed(ch))
	}
}

func TestEndpointMovesBetweenSlices(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.1"}, []string{"80"}))
	s1 := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1", "10.0.1.2")
	s2 := slice("ns/a-2", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.3")
	c.OnEndpointSlice(nil, s1)
	c.OnEndpointSlice(nil, s2)
	// The controller adds 10.0.1.2 to s2 before removing it from s1.
	s2b := slice("ns/a-2", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.3", "10.0.1.2")
	c.OnEndpointSlice(s2, s2b)
	snap, _ := c.Snapshot()
	if got := epList(snap.IPv4.Sorted()[0].ClusterEndpoints); got != "10.0.1.1:80 10.0.1.2:80 10.0.1.3:80" {
		t.Errorf("mid-move %q", got)
	}
	s1b := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	c.OnEndpointSlice(s1, s1b)
	snap, _ = c.Snapshot()
	if got := epList(snap.IPv4.Sorted()[0].ClusterEndpoints); got != "10.0.1.1:80 10.0.1.2:80 10.0.1.3:80" {
		t.Errorf("after move %q", got)
	}
	c.OnEndpointSlice(s2b, nil)
	snap, _ = c.Snapshot()
	if got := epList(snap.IPv4.Sorted()[0].ClusterEndpoints); got != "10.0.1.1:80" {
		t.Errorf("after delete %q", got)
	}
}

func TestSliceRelabelledToAnotherService(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.1"}, []string{"80"}))
	c.OnService(nil, svc("ns/b", []string{"10.96.0.2"}, []string{"80"}))
	s := slice("ns/x", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	c.OnEndpointSlice(nil, s)
	s2 := slice("ns/x", "b", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	c.OnEndpointSlice(s, s2)
	snap, ch := c.Snapshot()
	if got := epList(snap.IPv4.Get(spn("ns/a", "", "")).ClusterEndpoints); got != "" {
		t.Errorf("a kept %q", got)
	}
	if got := epList(snap.IPv4.Get(spn("ns/b", "", "")).ClusterEndpoints); got != "10.0.1.1:80" {
		t.Errorf("b has %q", got)
	}
	if len(ch.Ports) != 2 {
		t.Errorf("changes %v", changed(ch))
	}
}

func TestSlicesBeforeTheirServiceAndServiceDeletion(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	s := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"http:8080"}, "10.0.1.1")
	c.OnEndpointSlice(nil, s)
	snap, _ := c.Snapshot()
	if snap.IPv4.Len() != 0 {
		t.Fatalf("a slice of an unknown Service produced %v", portNames(snap.IPv4))
	}
	a := svc("ns/a", []string{"10.96.0.1", "fd00::1"}, []string{"http:80", "dns:53/UDP"})
	c.OnService(nil, a)
	snap, _ = c.Snapshot()
	if got := epList(snap.IPv4.Get(spn("ns/a", "http", "")).ClusterEndpoints); got != "10.0.1.1:8080" {
		t.Errorf("endpoints %q", got)
	}
	// Drop one port and the IPv6 family.
	a2 := svc("ns/a", []string{"10.96.0.1"}, []string{"http:80"})
	c.OnService(a, a2)
	snap, ch := c.Snapshot()
	if got := portNames(snap.IPv4); !slices.Equal(got, []string{"ns/a:http/TCP"}) {
		t.Errorf("IPv4 ports %v", got)
	}
	if snap.IPv6.Len() != 0 {
		t.Errorf("IPv6 ports %v", portNames(snap.IPv6))
	}
	if got := changed(ch); !slices.Equal(got, []string{"ns/a:dns", "ns/a:http"}) {
		t.Errorf("changes %v", got)
	}
	c.OnService(a2, nil)
	snap, _ = c.Snapshot()
	if snap.IPv4.Len()+snap.IPv6.Len() != 0 {
		t.Errorf("ports left after delete")
	}
}

func TestNodeLabelChangeReevaluatesEveryService(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	c.OnNode(nil, node(thisNode, map[string]string{v1.LabelTopologyZone: "zone-a"}, "192.168.0.1"))
	c.OnNode(nil, node("other-node", map[string]string{v1.LabelTopologyZone: "zone-z"}))
	for _, n := range []string{"a", "b"} {
		c.OnService(nil, svc("ns/"+n, []string{"10.96.0.1"}, []string{"80"}))
		c.OnEndpointSlice(nil, slice("ns/"+n+"-1", n, discovery.AddressTypeIPv4, []string{"80"},
			"10.0.1.1@node1/zone-a#hz=zone-a", "10.0.2.1@node2/zone-b#hz=zone-b"))
	}
	c.OnService(nil, svc("ns/nohints", []string{"10.96.0.9"}, []string{"80"}))
	snap, ch := c.Snapshot()
	if snap.Node.Zone != "zone-a" || !ch.Node || snap.Node.Addresses[0].String() != "192.168.0.1" {
		t.Errorf("node %+v", snap.Node)
	}
	if got := epList(snap.IPv4.Get(spn("ns/a", "", "")).ClusterEndpoints); got != "10.0.1.1:80(L)" {
		t.Errorf("zone-a %q", got)
	}
	c.Ack(snap)
	old := c.node
	n2 := node(thisNode, map[string]string{v1.LabelTopologyZone: "zone-b"}, "192.168.0.1")
	c.OnNode(nil, n2)
	snap, ch = c.Snapshot()
	for _, n := range []string{"ns/a", "ns/b"} {
		if got := epList(snap.IPv4.Get(spn(n, "", "")).ClusterEndpoints); got != "10.0.2.1:80" {
			t.Errorf("%s in zone-b: %q", n, got)
		}
	}
	if got := changed(ch); !slices.Equal(got, []string{"ns/a", "ns/b"}) {
		t.Errorf("changes %v (a Service whose selection did not change must not be reported)", got)
	}
	if !ch.Node || old.Zone != "zone-a" {
		t.Errorf("node change not reported")
	}
	// Node deletion marker.
	c.Ack(snap)
	n3 := n2.DeepCopy()
	n3.Spec.Taints = []v1.Taint{{Key: taintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}
	c.OnNode(n2, n3)
	snap, ch = c.Snapshot()
	if !snap.Node.Deleting || !ch.Node || len(ch.Ports) != 0 {
		t.Errorf("deleting %v, changes %+v", snap.Node.Deleting, ch)
	}
	// The Node object deleted outright (no finalizer): still being deleted,
	// with its last known facts.
	c.OnNode(n3, n2)
	snap, _ = c.Snapshot()
	c.Ack(snap)
	if snap.Node.Deleting {
		t.Fatal("taint removed, node still deleting")
	}
	c.OnNode(n2, nil)
	snap, ch = c.Snapshot()
	if !snap.Node.Deleting || snap.Node.Zone != "zone-b" || !ch.Node {
		t.Errorf("after the Node's deletion: %+v, changes %+v", snap.Node, ch)
	}
}

func TestTriggerTimesReported(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.1"}, []string{"80"}))
	s := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	s.Annotations = map[string]string{annotationTriggerTime: "2026-11-30T10:00:00Z"}
	c.OnEndpointSlice(nil, s)
	snap, ch := c.Snapshot()
	if tt := ch.TriggerTimes[v1.IPv4Protocol]; len(tt) != 1 || tt[0].Hour() != 10 || len(ch.TriggerTimes) != 1 {
		t.Errorf("trigger times %v", ch.TriggerTimes)
	}
	c.Ack(snap)
	if _, ch = c.Snapshot(); len(ch.TriggerTimes) != 0 {
		t.Errorf("trigger times after ack %v", ch.TriggerTimes)
	}
}

func TestSyncedAndNotify(t *testing.T) {
	var kicks atomic.Int32
	c := New(Options{NodeName: thisNode, Notify: func() { kicks.Add(1) }})
	select {
	case <-c.Synced():
		t.Fatal("synced before OnSynced")
	default:
	}
	c.OnSynced()
	c.OnSynced()
	<-c.Synced()
	if kicks.Load() == 0 {
		t.Error("OnSynced did not notify")
	}
}

func TestSortedView(t *testing.T) {
	var svcs []*v1.Service
	for _, n := range []string{"z/b", "a/c", "a/b"} {
		svcs = append(svcs, svc(n, []string{"10.96.0.1"}, []string{"y:80", "x:81"}))
	}
	snap := Build(thisNode, nil, svcs, nil)
	want := []string{"a/b:x/TCP", "a/b:y/TCP", "a/c:x/TCP", "a/c:y/TCP", "z/b:x/TCP", "z/b:y/TCP"}
	if got := portNames(snap.IPv4); !slices.Equal(got, want) {
		t.Errorf("order %v", got)
	}
}

// TestRetainedBookkeepingIsBoundedWhileSyncsFail: a backend that never
// succeeds (no Ack) under endpoint churn must not make the cache keep every
// trigger time and one batch per failed sync. Event counts stay exact.
func TestRetainedBookkeepingIsBoundedWhileSyncsFail(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.1"}, []string{"80"}))
	prev := (*discovery.EndpointSlice)(nil)
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	const syncs, perSync = 3 * maxPendingBatches, maxTriggerTimes/10 + 7
	events := 0
	var first *proxy.Snapshot
	for i := 0; i < syncs; i++ {
		for j := 0; j < perSync; j++ {
			s := slice("ns/a-1", "a", discovery.AddressTypeIPv4, []string{"80"}, ep(fmt.Sprintf("10.0.%d.%d", i%250, 1+j%250)))
			s.Annotations = map[string]string{annotationTriggerTime: base.Add(time.Duration(events) * time.Second).Format(time.RFC3339Nano)}
			c.OnEndpointSlice(prev, s)
			prev = s
			events++
		}
		snap, _ := c.Snapshot() // the sync fails: no Ack
		if first == nil {
			first = snap
		}
	}
	if len(c.pending) > maxPendingBatches {
		t.Errorf("%d pending batches retained, want at most %d", len(c.pending), maxPendingBatches)
	}
	snap, ch := c.Snapshot()
	tt := ch.TriggerTimes[v1.IPv4Protocol]
	if limit := maxPendingBatches * maxTriggerTimes; len(tt) > limit || len(tt) == 0 {
		t.Errorf("%d trigger times retained, want 1..%d", len(tt), limit)
	}
	if !tt[0].Equal(base) {
		t.Errorf("earliest trigger time %v dropped (first kept %v)", base, tt[0])
	}
	if ch.EndpointEvents != events || ch.ServiceEvents != 1 {
		t.Errorf("events %d/%d, want 1/%d", ch.ServiceEvents, ch.EndpointEvents, events)
	}
	// One batch over its own cap keeps the earliest maxTriggerTimes.
	var b batch
	for i := 0; i < 2*maxTriggerTimes; i++ {
		b.addTrigger(0, base.Add(time.Duration(i)))
	}
	if len(b.triggers[0]) != maxTriggerTimes || !b.triggers[0][0].Equal(base) {
		t.Errorf("batch kept %d trigger times starting %v", len(b.triggers[0]), b.triggers[0][0])
	}
	// Acknowledging an early snapshot keeps what later ones included;
	// acknowledging the last clears everything.
	c.Ack(first)
	if _, ch := c.Snapshot(); ch.EndpointEvents == 0 {
		t.Error("ack of the first snapshot dropped later events")
	}
	c.Ack(snap)
	if _, ch := c.Snapshot(); ch.EndpointEvents+ch.ServiceEvents != 0 || len(ch.TriggerTimes) != 0 {
		t.Errorf("after the last ack: %+v", ch)
	}
}
