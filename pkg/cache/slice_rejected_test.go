package cache

import (
	"strings"
	"sync"
	"testing"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// stub is what the source hands as the old object of an update or delete:
// namespace, name and the Service label of the last version handed over.
func stub(es *discovery.EndpointSlice) *discovery.EndpointSlice {
	out := &discovery.EndpointSlice{}
	out.Namespace, out.Name = es.Namespace, es.Name
	if l, ok := es.Labels[discovery.LabelServiceName]; ok {
		out.Labels = map[string]string{discovery.LabelServiceName: l}
	}
	return out
}

// TestRejectedSliceUpdateKeepsLastValidVersion: an EndpointSlice update the
// cache rejects (Service label gone, unknown address type) leaves the last
// valid version in use, so the Service keeps its endpoints, and is warned
// about once per update (log) and through Conflict; the next valid version,
// or the deletion, replaces it even though the source's old object is a
// stub of the rejected version. A version that is ignored without a problem
// (FQDN) replaces it too.
func TestRejectedSliceUpdateKeepsLastValidVersion(t *testing.T) {
	var mu sync.Mutex
	var conflicts []string
	c := New(Options{NodeName: thisNode, Logger: ptr(discardLogger()), Conflict: func(svc types.NamespacedName, reason, message string) {
		mu.Lock()
		defer mu.Unlock()
		conflicts = append(conflicts, svc.String()+" "+reason+": "+message)
	}})
	web := spn("ns/web", "", "")
	c.OnService(nil, svc("ns/web", []string{"10.96.0.1"}, []string{"80"}))
	good := slice("ns/web-1", "web", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1", "10.0.1.2")
	c.OnEndpointSlice(nil, good)
	endpoints := func(stage, want string) {
		t.Helper()
		snap, _ := c.Snapshot()
		p := snap.IPv4.Get(web)
		if p == nil {
			t.Fatalf("%s: no port %s", stage, web)
		}
		if got := epList(p.ClusterEndpoints); got != want {
			t.Errorf("%s: endpoints %q, want %q", stage, got, want)
		}
	}
	endpoints("valid", "10.0.1.1:80 10.0.1.2:80")

	noLabel := slice("ns/web-1", "web", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.3")
	delete(noLabel.Labels, discovery.LabelServiceName)
	c.OnEndpointSlice(stub(good), noLabel)
	endpoints("after an update without the Service label", "10.0.1.1:80 10.0.1.2:80")

	bogus := slice("ns/web-1", "web", "IPv5", []string{"80"}, "10.0.1.3")
	c.OnEndpointSlice(stub(noLabel), bogus)
	endpoints("after an update with an unknown address type", "10.0.1.1:80 10.0.1.2:80")
	mu.Lock()
	if len(conflicts) != 2 || !strings.HasPrefix(conflicts[0], "ns/web "+ReasonEndpointSliceRejected+": EndpointSlice ns/web-1: ") ||
		!strings.Contains(conflicts[1], "addressType") {
		t.Errorf("warnings %q, want two %s on ns/web naming the slice and the field", conflicts, ReasonEndpointSliceRejected)
	}
	mu.Unlock()

	// The next valid version replaces the kept one (old is a stub of the
	// rejected version: no label).
	next := slice("ns/web-1", "web", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.4")
	c.OnEndpointSlice(stub(noLabel), next)
	endpoints("after a valid update", "10.0.1.4:80")

	// Rejected again, then deleted (old: a stub without the label).
	c.OnEndpointSlice(stub(next), noLabel)
	endpoints("after another rejected update", "10.0.1.4:80")
	c.OnEndpointSlice(stub(noLabel), nil)
	endpoints("after the deletion", "")

	// Ignored without a problem: FQDN slices are not proxied, and such a
	// version replaces a valid one.
	c.OnEndpointSlice(nil, good)
	endpoints("valid again", "10.0.1.1:80 10.0.1.2:80")
	c.OnEndpointSlice(stub(good), slice("ns/web-1", "web", discovery.AddressTypeFQDN, []string{"80"}, "example.com"))
	endpoints("after an FQDN version", "")

	// A rejected first version keeps nothing and warns only in the log.
	mu.Lock()
	before := len(conflicts)
	mu.Unlock()
	c.OnEndpointSlice(nil, bogus)
	mu.Lock()
	if len(conflicts) != before {
		t.Errorf("a rejected slice with no earlier version warned through Conflict: %q", conflicts[before:])
	}
	mu.Unlock()
	if snap, _ := c.Snapshot(); len(snap.IPv4.Get(web).ClusterEndpoints) != 0 {
		t.Errorf("a rejected first version was used")
	}
}

// TestSliceMovesBetweenServices: an update that changes a slice's Service
// label moves it, whatever the old object says.
func TestSliceMovesBetweenServices(t *testing.T) {
	c := New(Options{NodeName: thisNode, Logger: ptr(discardLogger())})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.1"}, []string{"80"}))
	c.OnService(nil, svc("ns/b", []string{"10.96.0.2"}, []string{"80"}))
	first := slice("ns/s", "a", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1")
	c.OnEndpointSlice(nil, first)
	c.OnEndpointSlice(stub(first), slice("ns/s", "b", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1"))
	snap, _ := c.Snapshot()
	for name, want := range map[proxy.ServicePortName]string{spn("ns/a", "", ""): "", spn("ns/b", "", ""): "10.0.1.1:80"} {
		if got := epList(snap.IPv4.Get(name).ClusterEndpoints); got != want {
			t.Errorf("%s: endpoints %q, want %q", name, got, want)
		}
	}
}
