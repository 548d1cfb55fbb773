package linux

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	"github.com/kproxy/kproxy/test/proxytest"
)

// nodePortJumps lists the NodePort destinations of KPROXY-SERVICES in a
// save ("-d ADDR -j KPROXY-NODEPORTS").
func nodePortJumps(save string) []string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-A "+iptables.ChainServices+" ") && strings.HasSuffix(l, " -j "+iptables.ChainNodePorts) {
			out = append(out, strings.TrimPrefix(l, "-A "+iptables.ChainServices+" "))
		}
	}
	return out
}

// restartWithoutNode replaces w's backend and cache by new ones over the
// same fake kernel, as a restarted kproxy that has not read its Node
// object, with the same Services.
func (w *world) restartWithoutNode(mutate func(*Options)) {
	w.t.Helper()
	opts := w.b.m.opts
	if mutate != nil {
		mutate(&opts)
	}
	b, err := New(opts)
	if err != nil {
		w.t.Fatal(err)
	}
	quiet := logr.Discard()
	c := cache.New(cache.Options{NodeName: proxytest.Node1, Logger: &quiet})
	for name, svc := range w.svcs {
		c.OnService(nil, svc)
		for _, s := range w.sl[name] {
			c.OnEndpointSlice(nil, s)
		}
	}
	c.OnSynced()
	w.b, w.cache = b, c
}

// TestRestartWithoutNodeKeepsNodePorts: with nodePortAddresses "primary",
// NodePorts answer on the node's primary address, which only the Node
// object tells. A kproxy restarted without its Node (it syncs anyway after
// a bounded wait) keeps the NodePort destination the kernel's rules
// already use, in full and partial syncs, until the Node comes; then the
// rules follow the Node. On a node's first start without the Node, no
// destination is invented.
func TestRestartWithoutNodeKeepsNodePorts(t *testing.T) {
	primary := func(o *Options) { o.Rules.NodePortPrimary = true }
	w := newWorld(t, v1.IPv4Protocol, primary)
	w.set("web", 1, proxytest.Ready(proxytest.PodA1, proxytest.PodB1), proxytest.WithNodePort())
	w.mustSync(false)
	node1, _ := w.topo.Node(proxytest.Node1)
	want := []string{"-d " + node1.Addr(v1.IPv4Protocol).String() + "/32 -j " + iptables.ChainNodePorts}
	if got := nodePortJumps(w.ipt.Dump()); !slices.Equal(got, want) {
		t.Fatalf("with the Node: NodePort jumps %q, want %q", got, want)
	}

	w.restartWithoutNode(nil)
	w.mustSync(false)
	if got := nodePortJumps(w.ipt.Dump()); !slices.Equal(got, want) {
		t.Errorf("restarted without the Node: NodePort jumps %q, want the previous run's %q", got, want)
	}
	// A partial sync (a change) while the Node is still unknown.
	w.set("web", 1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	w.mustSync(false)
	if w.b.Last().Full {
		t.Fatal("the change was synced in full: the partial path is not tested")
	}
	if got := nodePortJumps(w.ipt.Dump()); !slices.Equal(got, want) {
		t.Errorf("partial sync without the Node: NodePort jumps %q, want %q", got, want)
	}
	// A periodic full sync, still without the Node.
	w.mustSync(true)
	if got := nodePortJumps(w.ipt.Dump()); !slices.Equal(got, want) {
		t.Errorf("full sync without the Node: NodePort jumps %q, want %q", got, want)
	}

	// The Node comes, with another primary address: the rules follow it.
	other := netip.MustParseAddr("192.0.2.77")
	w.host.Addrs = append(w.host.Addrs, other)
	nodeObj, err := w.topo.NodeObject(proxytest.Node1)
	if err != nil {
		t.Fatal(err)
	}
	nodeObj.Status.Addresses = append([]v1.NodeAddress{{Type: v1.NodeInternalIP, Address: other.String()}}, nodeObj.Status.Addresses...)
	w.cache.OnNode(nil, nodeObj)
	w.mustSync(false)
	if got, want := nodePortJumps(w.ipt.Dump()), []string{"-d 192.0.2.77/32 -j " + iptables.ChainNodePorts}; !slices.Equal(got, want) {
		t.Errorf("after the Node came: NodePort jumps %q, want %q", got, want)
	}
	w.checkMatchesFullPlan()

	// A node's first start without the Node: nothing to keep, nothing
	// invented.
	fresh := newWorld(t, v1.IPv4Protocol, primary)
	fresh.set("web", 1, proxytest.Ready(proxytest.PodA1), proxytest.WithNodePort())
	fresh.restartWithoutNode(nil)
	fresh.mustSync(false)
	if got := nodePortJumps(fresh.ipt.Dump()); len(got) != 0 {
		t.Errorf("first start without the Node: NodePort jumps %q, want none", got)
	}
}

// TestPrimaryInRules: the primary address is the NodePort destination no
// configured CIDR explains, of the family, not a loopback address.
func TestPrimaryInRules(t *testing.T) {
	save := []byte(`*nat
:KPROXY-SERVICES - [0:0]
-A KPROXY-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "a/b:c" -m tcp --dport 80 -j KPROXY-SVC-X
-A KPROXY-SERVICES -d 127.0.0.1/32 -j KPROXY-NODEPORTS
-A KPROXY-SERVICES -d 10.0.0.5/32 -j KPROXY-NODEPORTS
-A KPROXY-SERVICES -d 192.168.1.10/32 -j KPROXY-NODEPORTS
-A KPROXY-SERVICES -d fd00::10/128 -j KPROXY-NODEPORTS
-A KPROXY-SERVICES -m addrtype --dst-type LOCAL -j KPROXY-NODEPORTS
COMMIT
`)
	got := keptPrimaries(primaryInRules(save), v1.IPv4Protocol, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	if want := []netip.Addr{netip.MustParseAddr("192.168.1.10")}; !slices.Equal(got, want) {
		t.Errorf("IPv4: %v, want %v", got, want)
	}
	if got := keptPrimaries(primaryInRules(save), v1.IPv6Protocol, nil); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("fd00::10")}) {
		t.Errorf("IPv6: %v", got)
	}
}
