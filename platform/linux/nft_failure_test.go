package linux

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/test/proxytest"
)

type failCountingNFTMetrics struct {
	noNFTMetrics
	failed atomic.Int32
}

func (m *failCountingNFTMetrics) SyncFailed() { m.failed.Add(1) }

// TestNFTFailedTransactionCommitsNothing: when nft refuses a partial
// transaction, the driver retries it as a full one at once; when nft
// refuses that too, the sync fails and counts both failures, the table
// keeps what it held, and the record of what was applied is not advanced: the next
// sync (with no new change) is a full one and programs what the refused
// one carried.
func TestNFTFailedTransactionCommitsNothing(t *testing.T) {
	topo := proxytest.Default()
	node1, _ := topo.Node(proxytest.Node1)
	fake := nftmodel.NewFake(knftables.IPv4Family, nftables.TableName)
	m := &failCountingNFTMetrics{}
	cfg := facts.DefaultConfig(v1.IPv4Protocol)
	cfg.ClusterCIDRs = topo.ClusterCIDRs()
	b, err := NewNFT(NFTOptions{Rules: cfg, NFT: fake, Metrics: m, Logger: logr.Discard(),
		Conntrack: &FakeConntrack{Flows: map[v1.IPFamily][]conntrack.Flow{}},
		Host:      &FakeHost{Addrs: append(node1.Addrs(v1.IPv4Protocol), netip.MustParseAddr("127.0.0.1"))}})
	if err != nil {
		t.Fatal(err)
	}
	quiet := logr.Discard()
	c := cache.New(cache.Options{NodeName: proxytest.Node1, Logger: &quiet})
	n, err := topo.NodeObject(proxytest.Node1)
	if err != nil {
		t.Fatal(err)
	}
	c.OnNode(nil, n)
	add := func(name string, index int) string {
		svc := topo.Service(name, index)
		sl, err := topo.Slices(svc, proxytest.Ready(proxytest.PodA1)...)
		if err != nil {
			t.Fatal(err)
		}
		c.OnService(nil, svc)
		for _, s := range sl {
			c.OnEndpointSlice(nil, s)
		}
		return svc.Spec.ClusterIP
	}
	sync := func() error {
		snap, ch := c.Snapshot()
		if err := syncSnap(context.Background(), b, snap, ch); err != nil {
			return err
		}
		c.Ack(snap)
		return nil
	}
	webIP := add("web", 1)
	c.OnSynced()
	if err := sync(); err != nil {
		t.Fatal(err)
	}
	before := fake.Dump()
	if !strings.Contains(before, webIP) {
		t.Fatalf("web's ClusterIP %s not programmed:\n%s", webIP, before)
	}

	apiIP := add("api", 2)
	refused := errors.New("Error: Could not process rule: No buffer space available")
	fake.Fail = func(string) error { return refused }
	err = sync()
	if !errors.Is(err, refused) {
		t.Fatalf("sync with nft refusing: err %v, want it to wrap %v", err, refused)
	}
	if got := m.failed.Load(); got != 2 {
		t.Errorf("%d failures counted, want 2 (the partial transaction and its full retry)", got)
	}
	if after := fake.Dump(); after != before {
		t.Errorf("a refused transaction changed the table:\n%s", after)
	}

	fake.Fail = nil
	if err := sync(); err != nil {
		t.Fatalf("sync after nft accepts again: %v", err)
	}
	if !b.Last().Full {
		t.Error("the sync after a failed one was partial; the record of what was applied cannot be trusted after a failure")
	}
	if d := fake.Dump(); !strings.Contains(d, apiIP) || !strings.Contains(d, webIP) {
		t.Errorf("after the retry, want both ClusterIPs %s and %s:\n%s", webIP, apiIP, d)
	}
}
