package cache

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// externalsOf returns the external frontends (externalIPs then LB IPs) of a
// Service's first IPv4 port in snap.
func externalsOf(t *testing.T, snap *proxy.Snapshot, name string) []string {
	t.Helper()
	for _, sp := range snap.IPv4.Sorted() {
		if sp.Name.NamespacedName.String() == name {
			var out []string
			for _, a := range append(slices.Clip(sp.ExternalIPs), sp.LoadBalancerIPs...) {
				out = append(out, a.String())
			}
			return out
		}
	}
	t.Fatalf("no port of %s", name)
	return nil
}

func TestExternalIPCannotTakeAClusterIP(t *testing.T) {
	for _, order := range []string{"owner first", "claimant first"} {
		t.Run(order, func(t *testing.T) {
			var mu sync.Mutex
			var warned []string
			c := New(Options{NodeName: thisNode, Conflict: func(svc types.NamespacedName, reason, msg string) {
				mu.Lock()
				defer mu.Unlock()
				warned = append(warned, svc.String()+" "+reason+": "+msg)
			}})
			term := svc("default/term", []string{"10.96.0.60"}, []string{"80"})
			evil := svc("aaa/evil", []string{"10.96.0.61"}, []string{"80"})
			evil.Spec.ExternalIPs = []string{"10.96.0.60", "203.0.113.7"}
			if order == "owner first" {
				c.OnService(nil, term)
				c.OnService(nil, evil)
			} else {
				c.OnService(nil, evil)
				snap, _ := c.Snapshot()
				if got := externalsOf(t, snap, "aaa/evil"); !slices.Equal(got, []string{"10.96.0.60", "203.0.113.7"}) {
					t.Fatalf("before the owner exists: externals %v", got)
				}
				c.OnService(nil, term)
			}
			snap, ch := c.Snapshot()
			if got := externalsOf(t, snap, "aaa/evil"); !slices.Equal(got, []string{"203.0.113.7"}) {
				t.Errorf("evil's externals %v, want only 203.0.113.7", got)
			}
			if _, ok := ch.Ports[snap.IPv4.Sorted()[0].Name]; !ok && order == "claimant first" {
				t.Error("evil's port not reported as changed when the ClusterIP got its owner")
			}
			if n := c.FrontendConflicts(); n != 1 {
				t.Errorf("conflicts %d, want 1", n)
			}
			if len(warned) == 0 || !strings.Contains(warned[0], "aaa/evil FrontendConflict") || !strings.Contains(warned[0], "10.96.0.60") {
				t.Errorf("warnings %q", warned)
			}
			// The owner goes away: the address is free again.
			c.OnService(term, nil)
			snap, _ = c.Snapshot()
			if got := externalsOf(t, snap, "aaa/evil"); !slices.Equal(got, []string{"10.96.0.60", "203.0.113.7"}) {
				t.Errorf("after the owner left: externals %v", got)
			}
			if n := c.FrontendConflicts(); n != 0 {
				t.Errorf("conflicts %d after the owner left, want 0", n)
			}
		})
	}
}

func TestLoadBalancerIPCannotTakeAClusterIP(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	owner := svc("kube-system/dns", []string{"10.96.0.10"}, []string{"53"})
	lb := svc("x/lb", []string{"10.96.0.11"}, []string{"80"})
	lb.Spec.Type = v1.ServiceTypeLoadBalancer
	lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.96.0.10"}}
	c.OnService(nil, owner)
	c.OnService(nil, lb)
	snap, _ := c.Snapshot()
	if got := externalsOf(t, snap, "x/lb"); len(got) != 0 {
		t.Errorf("lb's external frontends %v, want none", got)
	}
	// Its own ClusterIP is still its own.
	for _, sp := range snap.IPv4.Sorted() {
		if sp.Name.Name == "lb" && sp.ClusterIP != netip.MustParseAddr("10.96.0.11") {
			t.Errorf("lb's ClusterIP %v", sp.ClusterIP)
		}
	}
}

func TestPreserveDestinationAnnotation(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	s := svc("ns/keep", []string{"10.96.0.70"}, []string{"80"})
	s.Spec.Type = v1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = 30070
	s.Annotations = map[string]string{"preserve-destination": "true"}
	c.OnService(nil, s)
	c.OnEndpointSlice(nil, slice("ns/keep-1", "keep", "IPv4", []string{"80"}, "10.0.1.1"))
	snap, _ := c.Snapshot()
	sp := snap.IPv4.Sorted()[0]
	if !sp.PreserveDestination || !sp.UsesLocalEndpoints() {
		t.Errorf("PreserveDestination %v, uses local endpoints %v; want both", sp.PreserveDestination, sp.UsesLocalEndpoints())
	}
	s2 := s.DeepCopy()
	s2.Annotations["preserve-destination"] = "false"
	c.OnService(s, s2)
	snap, ch := c.Snapshot()
	if snap.IPv4.Sorted()[0].PreserveDestination || len(ch.Ports) == 0 {
		t.Error("the annotation's removal is not a change")
	}
}

func TestDefaultAlgorithm(t *testing.T) {
	c := New(Options{NodeName: thisNode, DefaultAlgorithm: proxy.AlgorithmRoundRobin})
	plain := svc("ns/plain", []string{"10.96.0.80"}, []string{"80"})
	explicit := svc("ns/explicit", []string{"10.96.0.81"}, []string{"80"})
	explicit.Annotations = map[string]string{proxy.AnnotationLoadBalancing: "random"}
	c.OnService(nil, plain)
	c.OnService(nil, explicit)
	snap, _ := c.Snapshot()
	got := map[string]proxy.Algorithm{}
	for _, sp := range snap.IPv4.Sorted() {
		got[sp.Name.Name] = sp.EffectiveAlgorithm()
	}
	if got["plain"] != proxy.AlgorithmRoundRobin || got["explicit"] != proxy.AlgorithmRandom {
		t.Errorf("algorithms %v, want plain round-robin (the node default) and explicit random (its annotation)", got)
	}
}
