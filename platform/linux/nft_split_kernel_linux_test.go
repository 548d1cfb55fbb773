package linux

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/nftables"
)

// tableObjects lists kproxy's table without its elements (tableElements
// has those): one line per chain, set and map, and per rule with its
// chain and position, sorted (a table built in another order lists its
// chains in another order).
func tableObjects(t *testing.T, fam v1.IPFamily) []string {
	t.Helper()
	out, err := exec.Command("nft", "-j", "list", "table", string(nftables.Family(fam)), nftables.TableName).Output()
	if err != nil {
		t.Fatalf("nft -j list table: %v", err)
	}
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("nft -j list table: %v", err)
	}
	var lines []string
	pos := map[string]int{}
	for _, o := range doc.Nftables {
		for kind, v := range o {
			delete(v, "handle")
			delete(v, "elem")
			switch kind {
			case "chain", "set", "map":
				b, _ := json.Marshal(v)
				lines = append(lines, kind+" "+string(b))
			case "rule":
				ch, _ := v["chain"].(string)
				b, _ := json.Marshal(v)
				lines = append(lines, fmt.Sprintf("rule %s #%d %s", ch, pos[ch], b))
				pos[ch]++
			}
		}
	}
	slices.Sort(lines)
	return lines
}

// bulkAddr is address n of a block of the family (10.<block>.x.y, or
// fd00::<block>:x:y).
func bulkAddr(fam v1.IPFamily, block byte, n int) netip.Addr {
	if fam == v1.IPv6Protocol {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, block, 0, byte(n >> 16), byte(n >> 8), byte(n)})
	}
	return netip.AddrFrom4([4]byte{10, block, byte(n >> 8), byte(n)})
}

// TestKernelNFTSplitFullSync: a full sync over netlink (Tx.Split: nft -f
// for the chains and rules, one batch for the elements, nft -f for what
// is no longer wanted) leaves the table exactly as the one nft -f
// transaction does, on an empty table and over a table a previous run
// left (its session-affinity chains and sets, and a shared chain no
// Service uses any more, deleted).
func TestKernelNFTSplitFullSync(t *testing.T) {
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(fam), func(t *testing.T) {
			inNetns(t, func() {
				ctx := context.Background()
				node := netip.MustParseAddr("192.168.77.2")
				if fam == v1.IPv6Protocol {
					node = netip.MustParseAddr("fd00:77::2")
				}
				snapOf := func(ports map[proxy.ServicePortName]*proxy.ServicePort) *proxy.Snapshot {
					snap := &proxy.Snapshot{IPv4: proxy.NewFamilyView(v1.IPv4Protocol, nil), IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)}
					if fam == v1.IPv6Protocol {
						snap.IPv6 = proxy.NewFamilyView(fam, ports)
					} else {
						snap.IPv4 = proxy.NewFamilyView(fam, ports)
					}
					return snap
				}
				// sync runs one full sync with a new backend (a restart).
				sync := func(netlink bool, ports map[proxy.ServicePortName]*proxy.ServicePort) (nl, ex int) {
					be := systemNFTBackend(t, fam)
					be.m.opts.Host = &FakeHost{Addrs: []netip.Addr{node}}
					sys := be.m.opts.NFT.(*nftables.System)
					defer sys.Close()
					sys.SetNetlink(netlink)
					if err := syncSnap(ctx, be, snapOf(ports), proxy.Changes{Full: true}); err != nil {
						t.Fatal(err)
					}
					return sys.Runs()
				}
				state := func() ([]string, []string) { return tableObjects(t, fam), tableElements(t, fam) }
				deleteTable := func() {
					if out, err := exec.Command("nft", "delete", "table", string(nftables.Family(fam)), nftables.TableName).CombinedOutput(); err != nil {
						t.Fatalf("nft delete table: %v: %s", err, out)
					}
				}
				compare := func(what string, wantObj, wantEl, gotObj, gotEl []string) {
					t.Helper()
					if d := diffLines(wantObj, gotObj); d != "" {
						t.Errorf("%s: chains, rules or sets differ from one nft -f transaction's:\n%s", what, d)
					}
					if d := diffLines(wantEl, gotEl); d != "" {
						t.Errorf("%s: elements differ from one nft -f transaction's:\n%s", what, d)
					}
				}

				// The previous run: session affinity on one port (its own
				// chains and sets), every UDP port with 3 endpoints.
				old := netlinkPorts(fam, node)
				now := netlinkPorts(fam, node)
				for name, sp := range old {
					if name.Protocol == v1.ProtocolTCP && !sp.ExternalPolicyLocal {
						c := *sp
						c.AffinityTimeoutSeconds = 600
						old[name] = &c
					}
				}
				// Now: no affinity, and the UDP ports down to 2 endpoints
				// (their 3-endpoint chains are no longer used).
				for name, sp := range now {
					if name.Protocol == v1.ProtocolUDP {
						c := *sp
						c.ClusterEndpoints = slices.Clone(sp.ClusterEndpoints[:2])
						now[name] = &c
					}
				}

				// And 3,000 more ClusterIP Services of 10 endpoints: some
				// 33,000 elements, more than one of the batch's 1 MiB
				// buffers (nft/nlbatch.go), sent as one datagram.
				for i := range 3000 {
					name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bulk", Name: fmt.Sprintf("s%d", i)}, Port: "p", Protocol: v1.ProtocolTCP}
					sp := &proxy.ServicePort{Name: name, Family: fam, Type: v1.ServiceTypeClusterIP, ClusterIP: bulkAddr(fam, 100, i),
						Port: 80, Protocol: v1.ProtocolTCP, HasAnyEndpoints: true}
					for e := range 10 {
						sp.ClusterEndpoints = append(sp.ClusterEndpoints, proxy.Endpoint{IP: bulkAddr(fam, 200, 10*i+e), Port: 8080, Ready: true, Serving: true})
					}
					now[name] = sp
				}

				// One transaction from empty, then the same over netlink.
				sync(false, now)
				wantObj, wantEl := state()
				if len(wantEl) == 0 {
					t.Fatal("no element in the table")
				}
				deleteTable()
				nl, ex := sync(true, now)
				if nl != 1 || ex != 1 {
					t.Errorf("from empty: %d batches over netlink and %d nft -f runs; want 1 and 1 (nothing to delete)", nl, ex)
				}
				gotObj, gotEl := state()
				compare("from empty", wantObj, wantEl, gotObj, gotEl)

				// Over the previous run's table.
				deleteTable()
				sync(false, old)
				oldObj, _ := state()
				if !slices.ContainsFunc(oldObj, func(l string) bool { return strings.Contains(l, `"name":"port-`) }) {
					t.Fatalf("the previous run's table has no chain of a port's own:\n%s", strings.Join(oldObj, "\n"))
				}
				nl, ex = sync(true, now)
				if nl != 1 || ex != 2 {
					t.Errorf("over a previous table: %d batches over netlink and %d nft -f runs; want 1 and 2", nl, ex)
				}
				gotObj, gotEl = state()
				compare("over a previous table", wantObj, wantEl, gotObj, gotEl)
			})
		})
	}
}
