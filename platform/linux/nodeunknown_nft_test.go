package linux

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/test/proxytest"
)

// nftNodeWorld is one node's nftables backend over a Fake table, fed by a
// cache, for the restart-without-the-Node test.
type nftNodeWorld struct {
	t     *testing.T
	topo  *proxytest.Topology
	fake  *nftmodel.Fake
	host  *FakeHost
	b     *NFTBackend
	cache *cache.Cache
	objs  []any
}

func (w *nftNodeWorld) start(withNode bool) {
	w.t.Helper()
	cfg := facts.DefaultConfig(v1.IPv4Protocol)
	cfg.ClusterCIDRs = w.topo.ClusterCIDRs()
	cfg.NodePortPrimary = true
	b, err := NewNFT(NFTOptions{Rules: cfg, NFT: w.fake, Conntrack: &FakeConntrack{Flows: map[v1.IPFamily][]conntrack.Flow{}}, Host: w.host, Logger: logr.Discard()})
	if err != nil {
		w.t.Fatal(err)
	}
	quiet := logr.Discard()
	c := cache.New(cache.Options{NodeName: proxytest.Node1, Logger: &quiet})
	for _, o := range w.objs {
		switch o := o.(type) {
		case *v1.Service:
			c.OnService(nil, o)
		case *discovery.EndpointSlice:
			c.OnEndpointSlice(nil, o)
		}
	}
	if withNode {
		n, err := w.topo.NodeObject(proxytest.Node1)
		if err != nil {
			w.t.Fatal(err)
		}
		c.OnNode(nil, n)
	}
	c.OnSynced()
	w.b, w.cache = b, c
}

func (w *nftNodeWorld) sync(full bool) {
	w.t.Helper()
	snap, ch := w.cache.Snapshot()
	ch.Full = ch.Full || full
	if err := syncSnap(context.Background(), w.b, snap, ch); err != nil {
		w.t.Fatal(err)
	}
	w.cache.Ack(snap)
}

// nodePortIPs lists the elements of the table's NodePort address set.
func (w *nftNodeWorld) nodePortIPs() []string {
	m := w.fake.Model()
	if m == nil || m.Sets[nftables.SetNodePorts] == nil {
		return nil
	}
	return slices.Sorted(func(yield func(string) bool) {
		for k := range m.Sets[nftables.SetNodePorts].Elements {
			if !yield(k) {
				return
			}
		}
	})
}

// TestNFTRestartWithoutNodeKeepsNodePorts is TestRestartWithoutNodeKeepsNodePorts
// for the nftables mode: with nodePortAddresses "primary", a kproxy
// restarted without its Node keeps the NodePort address set as the table
// has it, in full and partial syncs, until the Node comes; a first start
// without the Node invents none.
func TestNFTRestartWithoutNodeKeepsNodePorts(t *testing.T) {
	topo := proxytest.Default()
	node1, _ := topo.Node(proxytest.Node1)
	host := &FakeHost{Addrs: append(node1.Addrs(v1.IPv4Protocol), netip.MustParseAddr("127.0.0.1"))}
	svc := topo.Service("web", 1, proxytest.WithNodePort())
	sl, err := topo.Slices(svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	w := &nftNodeWorld{t: t, topo: topo, fake: nftmodel.NewFake(knftables.IPv4Family, nftables.TableName), host: host, objs: []any{svc, sl[0], sl[1]}}
	w.start(true)
	w.sync(false)
	want := []string{node1.Addr(v1.IPv4Protocol).String()}
	if got := w.nodePortIPs(); !slices.Equal(got, want) {
		t.Fatalf("with the Node: NodePort addresses %q, want %q", got, want)
	}

	w.start(false)
	w.sync(false)
	if got := w.nodePortIPs(); !slices.Equal(got, want) {
		t.Errorf("restarted without the Node: NodePort addresses %q, want the previous run's %q", got, want)
	}
	// A partial sync (an endpoint change) while the Node is still unknown.
	sl2, err := topo.Slices(svc, proxytest.Ready(proxytest.PodA1)...)
	if err != nil {
		t.Fatal(err)
	}
	w.cache.OnEndpointSlice(sl[1], sl2[1])
	w.cache.OnEndpointSlice(sl[0], sl2[0])
	w.sync(false)
	if w.b.Last().Full {
		t.Fatal("the change was synced in full: the partial path is not tested")
	}
	if got := w.nodePortIPs(); !slices.Equal(got, want) {
		t.Errorf("partial sync without the Node: NodePort addresses %q, want %q", got, want)
	}
	w.sync(true)
	if got := w.nodePortIPs(); !slices.Equal(got, want) {
		t.Errorf("full sync without the Node: NodePort addresses %q, want %q", got, want)
	}

	// The Node comes, with another primary address: the set follows it.
	other := netip.MustParseAddr("192.0.2.77")
	host.Addrs = append(host.Addrs, other)
	nodeObj, err := topo.NodeObject(proxytest.Node1)
	if err != nil {
		t.Fatal(err)
	}
	nodeObj.Status.Addresses = append([]v1.NodeAddress{{Type: v1.NodeInternalIP, Address: other.String()}}, nodeObj.Status.Addresses...)
	w.cache.OnNode(nil, nodeObj)
	w.sync(false)
	if got := w.nodePortIPs(); !slices.Equal(got, []string{other.String()}) {
		t.Errorf("after the Node came: NodePort addresses %q, want %q", got, other)
	}

	// A node's first start without the Node: nothing kept, nothing invented.
	fresh := &nftNodeWorld{t: t, topo: topo, fake: nftmodel.NewFake(knftables.IPv4Family, nftables.TableName), host: host, objs: w.objs}
	fresh.start(false)
	fresh.sync(false)
	if got := fresh.nodePortIPs(); len(got) != 0 {
		t.Errorf("first start without the Node: NodePort addresses %q, want none", got)
	}
}
