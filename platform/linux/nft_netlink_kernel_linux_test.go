package linux

import (
	"context"
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
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"
)

// netlinkPorts are service ports whose elements fill every set and map the
// netlink path encodes: ClusterIPs and NodePorts of each protocol with 3
// endpoints (slots 0-2), one of them on this node (hairpin), Local policies
// (the local maps), an externalIP. (The NodePort address set has elements
// only with --nodeport-addresses; it is encoded as the hairpin set's
// halves are.)
func netlinkPorts(fam v1.IPFamily, node netip.Addr) map[proxy.ServicePortName]*proxy.ServicePort {
	addr := func(a, b byte) netip.Addr {
		if fam == v1.IPv6Protocol {
			return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a, b})
		}
		return netip.AddrFrom4([4]byte{10, 96 + a, 0, b})
	}
	out := map[proxy.ServicePortName]*proxy.ServicePort{}
	for i, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		for j, local := range []bool{false, true} {
			k := byte(2*i + j + 1)
			name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "nl", Name: fmt.Sprintf("s%d", k)}, Port: "p", Protocol: proto}
			sp := &proxy.ServicePort{Name: name, Family: fam, Type: v1.ServiceTypeNodePort, ClusterIP: addr(0, k), Port: 80 + int32(k),
				Protocol: proto, NodePort: 30000 + int32(k), ExternalIPs: []netip.Addr{addr(1, k)},
				ExternalPolicyLocal: local, InternalPolicyLocal: local, HasAnyEndpoints: true}
			for e := range 3 {
				ep := proxy.Endpoint{IP: addr(2, byte(10*k)+byte(e)), Port: 8080 + int32(e), Ready: true, Serving: true}
				if e == 0 {
					ep.IP, ep.Local = node, true
				}
				sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep)
				if ep.Local {
					sp.LocalEndpoints = append(sp.LocalEndpoints, ep)
				}
			}
			out[name] = sp
		}
	}
	return out
}

// netlinkSets are the sets and maps the netlink path encodes.
func netlinkSet(name string) bool {
	switch name {
	case nftables.MapFrontends, nftables.MapNodePorts, nftables.SetHairpin, nftables.SetNodePorts:
		return true
	}
	return strings.HasPrefix(name, "cluster-") || strings.HasPrefix(name, "local-")
}

// tableElements lists every element of kproxy's table, as "set: key" or
// "map: key : value".
func tableElements(t *testing.T, fam v1.IPFamily) []string {
	t.Helper()
	out, err := exec.Command("nft", "-j", "list", "table", string(nftables.Family(fam)), nftables.TableName).Output()
	if err != nil {
		t.Fatalf("nft -j list table: %v", err)
	}
	l, err := nftmodel.ParseJSON(nftables.Family(fam), nftables.TableName, out)
	if err != nil || l.Model == nil {
		t.Fatalf("reading the table back: %v", err)
	}
	var els []string
	for name, s := range l.Model.Sets {
		for _, e := range s.Elements {
			els = append(els, name+": "+e.String())
		}
	}
	slices.Sort(els)
	return els
}

// TestKernelNFTNetlinkElements: element operations sent over netlink (the
// hot path) are the ones nft -f writes. A table written by nft -f has every
// element of the encoded sets deleted and added again in one netlink batch:
// each deletion finds its element (a wrong key encoding is ENOENT), and the
// table read back is the same, element for element (a wrong value is a
// different one). A batch whose last operation fails changes nothing, and
// its error is IsNotFound. An endpoint change through the backend goes over
// netlink, and a full sync afterwards writes nothing different.
func TestKernelNFTNetlinkElements(t *testing.T) {
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(fam), func(t *testing.T) {
			inNetns(t, func() {
				ctx := context.Background()
				node := netip.MustParseAddr("192.168.77.2")
				if fam == v1.IPv6Protocol {
					node = netip.MustParseAddr("fd00:77::2")
				}
				be := systemNFTBackend(t, fam)
				be.m.opts.Host = &FakeHost{Addrs: []netip.Addr{node}}
				sys := be.m.opts.NFT.(*nftables.System)
				defer sys.Close()
				sys.SetNetlink(false)
				ports := netlinkPorts(fam, node)
				snap := &proxy.Snapshot{IPv4: proxy.NewFamilyView(v1.IPv4Protocol, nil), IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)}
				if fam == v1.IPv6Protocol {
					snap.IPv6 = proxy.NewFamilyView(fam, ports)
				} else {
					snap.IPv4 = proxy.NewFamilyView(fam, ports)
				}
				if err := syncSnap(ctx, be, snap, proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				before := tableElements(t, fam)

				all, err := sys.ListAll(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var dels, adds []nftables.ElemOp
				covered := map[string]bool{}
				for _, kind := range []string{"set", "map"} {
					for _, name := range all[kind] {
						if !netlinkSet(name) {
							continue
						}
						els, err := sys.ListElements(ctx, kind, name)
						if err != nil {
							t.Fatal(err)
						}
						for _, e := range els {
							el := nfttest.Elem(t, name, e.Key, e.Value)
							dels = append(dels, nftables.ElemOp{Delete: true, Elem: el})
							adds = append(adds, nftables.ElemOp{Elem: el})
							covered[name] = true
						}
					}
				}
				for _, want := range []string{nftables.MapFrontends, nftables.MapNodePorts, nftables.SetHairpin, "cluster-ip-tcp", "cluster-ip-udp",
					"cluster-ip-sctp", "cluster-np-tcp", "local-ip-tcp", "local-np-udp"} {
					if !covered[want] {
						t.Errorf("no element of %s in the table to check (covered: %v)", want, covered)
					}
				}
				tx := nftables.ElementTx(nftables.Family(fam), append(dels, adds...))
				if tx.Elements() == nil {
					t.Fatal("an element-only transaction does not list its elements")
				}
				sys.SetNetlink(true)
				nl0, ex0 := sys.Runs()
				if err := sys.Run(ctx, tx); err != nil {
					t.Fatalf("netlink batch of %d operations: %v", len(dels)+len(adds), err)
				}
				if nl, ex := sys.Runs(); nl != nl0+1 || ex != ex0 {
					t.Fatalf("runs over netlink %d, through nft -f %d; want one more over netlink", nl-nl0, ex-ex0)
				}
				if d := diffLines(before, tableElements(t, fam)); d != "" {
					t.Errorf("the table after the netlink batch differs:\n%s", d)
				}

				// Atomic: the first deletion is undone when the second fails.
				missing := nfttest.Elem(t, nftables.MapNodePorts, []string{"tcp", "1"}, []string{"drop"})
				bad := nftables.ElementTx(nftables.Family(fam), []nftables.ElemOp{dels[0], {Delete: true, Elem: missing}})
				err = sys.Run(ctx, bad)
				if err == nil || !nftables.IsNotFound(err) {
					t.Errorf("deleting a missing element: %v, want a not-found error", err)
				}
				if d := diffLines(before, tableElements(t, fam)); d != "" {
					t.Errorf("a failed batch changed the table:\n%s", d)
				}

				// An endpoint change through the backend: netlink, and a
				// full sync afterwards finds the table as it would write it.
				for name, sp := range ports {
					c := *sp
					c.ClusterEndpoints = slices.Clone(sp.ClusterEndpoints)
					c.ClusterEndpoints[2].Port = 9999
					ports[name] = &c
					ch := proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{name: {}}}
					if fam == v1.IPv6Protocol {
						snap.IPv6 = proxy.NewFamilyView(fam, ports)
					} else {
						snap.IPv4 = proxy.NewFamilyView(fam, ports)
					}
					nl0, _ = sys.Runs()
					if err := syncSnap(ctx, be, snap, ch); err != nil {
						t.Fatal(err)
					}
					if nl, _ := sys.Runs(); nl != nl0+1 {
						t.Errorf("the endpoint change of %s did not go over netlink", name)
					}
					break
				}
				changed := tableElements(t, fam)
				if slices.Equal(changed, before) {
					t.Fatal("the endpoint change changed no element")
				}
				if err := syncSnap(ctx, be, snap, proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				if d := diffLines(changed, tableElements(t, fam)); d != "" {
					t.Errorf("a full sync after the netlink change differs:\n%s", d)
				}
			})
		})
	}
}

// diffLines lists the lines only in a (-) or only in b (+).
func diffLines(a, b []string) string {
	var out []string
	for _, l := range a {
		if !slices.Contains(b, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range b {
		if !slices.Contains(a, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestKernelNFTCountRules: the idle check's rule counts over netlink (a
// dump the kernel filters by chain) equal what nft lists, for each chain
// the check reads and for a missing one (0); with netlink off they go
// through nft and agree; and the backend's idle check uses the dump.
func TestKernelNFTCountRules(t *testing.T) {
	inNetns(t, func() {
		ctx := context.Background()
		node := netip.MustParseAddr("192.168.77.2")
		be := systemNFTBackend(t, v1.IPv4Protocol)
		be.m.opts.Host = &FakeHost{Addrs: []netip.Addr{node}}
		sys := be.m.opts.NFT.(*nftables.System)
		defer sys.Close()
		snap := &proxy.Snapshot{IPv4: proxy.NewFamilyView(v1.IPv4Protocol, netlinkPorts(v1.IPv4Protocol, node)),
			IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)}
		if err := syncSnap(ctx, be, snap, proxy.Changes{Full: true}); err != nil {
			t.Fatal(err)
		}
		chains := []string{nftables.ChainNATPrerouting, nftables.ChainNATOutput, nftables.ChainServices, "no-such-chain"}
		want := map[string]int{}
		for _, c := range chains {
			rs, err := sys.ListRules(ctx, c)
			if err != nil && !nftables.IsNotFound(err) {
				t.Fatal(err)
			}
			want[c] = len(rs)
		}
		if want[nftables.ChainServices] == 0 || want["no-such-chain"] != 0 {
			t.Fatalf("nft lists %v", want)
		}
		for _, netlink := range []bool{true, false} {
			sys.SetNetlink(netlink)
			dumps := sys.RuleDumps()
			for _, c := range chains {
				if n, err := sys.CountRules(ctx, c); err != nil || n != want[c] {
					t.Errorf("netlink %v: %s: %d rules, %v; nft lists %d", netlink, c, n, err, want[c])
				}
			}
			if got := sys.RuleDumps() - dumps; netlink && got != len(chains) || !netlink && got != 0 {
				t.Errorf("netlink %v: %d rule dumps over netlink", netlink, got)
			}
		}
		sys.SetNetlink(true)
		dumps := sys.RuleDumps()
		if err := be.m.check(ctx); err != nil {
			t.Fatalf("idle check: %v", err)
		}
		if sys.RuleDumps() == dumps {
			t.Errorf("the idle check did not count its rules over netlink")
		}
		if out, err := exec.Command("nft", "flush", "chain", "ip", nftables.TableName, nftables.ChainServices).CombinedOutput(); err != nil {
			t.Fatalf("nft flush chain: %v: %s", err, out)
		}
		if err := be.m.check(ctx); err == nil {
			t.Errorf("idle check after the services chain was flushed: no error")
		}
	})
}

// TestKernelListTables: the tables listed over netlink are the ones nft
// lists, every family's.
func TestKernelListTables(t *testing.T) {
	inNetns(t, func() {
		script := "add table ip kproxy-lt\nadd table ip6 lt6\nadd table inet lt-inet\nadd table bridge lt-br\n"
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft -f: %v: %s", err, out)
		}
		out, err := exec.Command("nft", "list", "tables").Output()
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
				want = append(want, f[1]+" "+f[2])
			}
		}
		got, err := nftables.ListTables()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		slices.Sort(want)
		if len(want) < 4 || !slices.Equal(got, want) {
			t.Errorf("over netlink %v, nft lists %v", got, want)
		}
	})
}
