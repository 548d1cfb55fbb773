package linux

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// These tests touch a real kernel: only inside a fresh anonymous network
// namespace that the test goroutine's locked thread enters (and that
// disappears with it). They are opt-in like the other kernel suites
// (KPROXY_KERNEL_TESTS=1, root, the iptables tools).

var kernelTools = []string{"iptables-legacy-restore", "iptables-nft-restore", "ip6tables-legacy-restore", "ip6tables-nft-restore", "nft"}

// inNetns runs fn on the test goroutine's thread inside a new network
// namespace. It refuses to run fn when the thread is still in the machine's
// initial namespace or in the one it started in.
func inNetns(t testing.TB, fn func()) {
	t.Helper()
	netns.Require(t, kernelTools...)
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	restored := false
	defer func() {
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			restored = true
		}
		_ = orig.Close()
		if restored {
			runtime.UnlockOSThread()
		} // else: the thread stays locked and dies with the goroutine.
	}()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	if err := guardNotInitial(orig); err != nil {
		t.Fatal(err)
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("lo up: %v", err)
	}
	fn()
}

// initNetIno is the fixed inode of the initial network namespace on Linux
// 6.x (dynamically numbered namespaces start at 0xF0000000).
const initNetIno = 0xEFFFFFF9

// guardNotInitial fails when the current thread's namespace is the one the
// test started in, PID 1's (when readable: sandboxes may hide it) or the
// initial one by its fixed inode.
func guardNotInitial(orig *os.File) error {
	var cur, start unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &cur); err != nil {
		return err
	}
	if err := unix.Fstat(int(orig.Fd()), &start); err != nil {
		return err
	}
	same := cur.Dev == start.Dev && cur.Ino == start.Ino
	var init unix.Stat_t
	if unix.Stat("/proc/1/ns/net", &init) == nil {
		same = same || (cur.Dev == init.Dev && cur.Ino == init.Ino)
	}
	if same || cur.Ino == initNetIno {
		return errors.New("refusing to touch the kernel: not inside a test network namespace")
	}
	return nil
}

// mixedSnapshot builds, through the cache, every case of the behaviour
// table that uses the default configuration.
func mixedSnapshot(t testing.TB) (*proxy.Snapshot, *proxytest.Topology) {
	t.Helper()
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	nodes, svcs, slices := tb.Objects(proxytest.DefaultConfig())
	var node *v1.Node
	for _, n := range nodes {
		if n.Name == proxytest.Node1 {
			node = n
		}
	}
	return buildSnapshot(node, svcs, slices), tb.Topology
}

func systemBackend(t testing.TB, fam v1.IPFamily, flavour Flavour, mutate func(*Options)) *Backend {
	t.Helper()
	sys, err := NewSystem(fam, flavour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := facts.DefaultConfig(fam)
	cfg.RandomFully = HasRandomFully(sys.Iptables)
	cfg.ClusterCIDRs = proxytest.Default().ClusterCIDRs()
	opts := Options{Rules: cfg, Iptables: sys.Iptables, NFTables: sys.NFTables, Conntrack: sys.Conntrack, Host: sys.Host}
	if mutate != nil {
		mutate(&opts)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func saveOf(t testing.TB, ipt Iptables, tables ...string) string {
	t.Helper()
	var out strings.Builder
	for _, tbl := range tables {
		s, err := ipt.Save(context.Background(), tbl)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := iptmodel.Parse(s)
		if err != nil {
			t.Fatalf("parsing iptables-save -t %s: %v\n%s", tbl, err, s)
		}
		out.WriteString(rs.Save(tbl))
	}
	return out.String()
}

var flavours = []Flavour{FlavourLegacy, FlavourNFT}
var families = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// TestKernelRoundTrip programs every Service kind and reads the tables back:
// the kernel must hold exactly the planned rules, spelled the way
// iptables-save spells them (so the in-memory model sees what the kernel
// sees), for both flavours and both families.
func TestKernelRoundTrip(t *testing.T) {
	snap, _ := mixedSnapshot(t)
	for _, f := range flavours {
		for _, fam := range families {
			for _, shard := range []int{0, 2} {
				t.Run(fmt.Sprintf("%s/%s/shard-threshold=%d", f, fam, shard), func(t *testing.T) {
					roundTrip(t, snap, fam, f, func(o *Options) { o.Rules.ShardThreshold = shard })
				})
			}
			// Interface-based local detection renders "-i" matches.
			t.Run(fmt.Sprintf("%s/%s/detect-local=InterfaceNamePrefix", f, fam), func(t *testing.T) {
				roundTrip(t, snap, fam, f, func(o *Options) {
					o.Rules.LocalDetect, o.Rules.LocalInterface = facts.LocalInterfaceNamePrefix, "veth"
				})
			})
		}
	}
}

func roundTrip(t *testing.T, snap *proxy.Snapshot, fam v1.IPFamily, f Flavour, mutate func(*Options)) {
	inNetns(t, func() {
		ctx := context.Background()
		b := systemBackend(t, fam, f, mutate)
		if err := syncSnap(ctx, b, snap, proxy.Changes{Full: true}); err != nil {
			t.Fatal(err)
		}
		fake := NewFakeIptables()
		fb, err := New(Options{Rules: b.m.opts.Rules, Iptables: fake, NFTables: &FakeNFTables{}, Conntrack: &FakeConntrack{}, Host: b.m.opts.Host})
		if err != nil {
			t.Fatal(err)
		}
		if err := syncSnap(ctx, fb, snap, proxy.Changes{Full: true}); err != nil {
			t.Fatal(err)
		}
		// Compare the raw iptables-save text, rule by rule: what kproxy
		// writes must come back spelled the same, or full syncs would
		// rewrite it every time.
		for _, table := range []string{"nat", "filter"} {
			raw, err := b.m.opts.Iptables.Save(ctx, table)
			if err != nil {
				t.Fatal(err)
			}
			model, _ := fake.Save(ctx, table)
			if got, want := ownedLines(raw), ownedLines(model); got != want {
				t.Errorf("table %s: the kernel spells kproxy's rules differently:\n%s", table, lineDiff(want, got))
			}
		}
		// And a second full sync finds nothing to rewrite.
		if err := syncSnap(ctx, b, snap, proxy.Changes{Full: true}); err != nil {
			t.Fatal(err)
		}
		if st := b.Last().Stats; st.WrittenChains != 0 || st.DeletedChains != 0 {
			t.Errorf("a second full sync wrote %d chains and deleted %d, want none", st.WrittenChains, st.DeletedChains)
		}
	})
}

// ownedLines keeps the raw "-A" lines of kproxy's chains and jumps, sorted
// by chain (tools list chains in different orders) but in rule order.
func ownedLines(save []byte) string {
	byChain := map[string][]string{}
	var chains []string
	for _, l := range strings.Split(string(save), "\n") {
		if !strings.HasPrefix(l, "-A ") || !strings.Contains(l, iptables.Prefix) {
			continue
		}
		c := strings.Fields(l)[1]
		if byChain[c] == nil {
			chains = append(chains, c)
		}
		byChain[c] = append(byChain[c], l)
	}
	slices.Sort(chains)
	var out []string
	for _, c := range chains {
		out = append(out, byChain[c]...)
	}
	return strings.Join(out, "\n")
}

func lineDiff(want, got string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// TestKernelPartialSyncAndFlush checks partial syncs and the canary on a
// real kernel.
func TestKernelPartialSyncAndFlush(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			inNetns(t, func() {
				ctx := context.Background()
				b := systemBackend(t, v1.IPv4Protocol, f, nil)
				web := func(eps ...proxy.Endpoint) *proxy.ServicePort {
					return &proxy.ServicePort{
						Name: proxy.ServicePortName{NamespacedName: nsName("default", "web"), Port: "http", Protocol: v1.ProtocolTCP}, Family: v1.IPv4Protocol,
						ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP,
						ClusterEndpoints: eps, HasAnyEndpoints: len(eps) > 0,
					}
				}
				ep := func(s string) proxy.Endpoint {
					return proxy.Endpoint{IP: netip.MustParseAddr(s), Port: 8080, Ready: true, Serving: true}
				}
				snapOf := func(sp *proxy.ServicePort) *proxy.Snapshot {
					return &proxy.Snapshot{IPv4: proxy.NewFamilyView(v1.IPv4Protocol, map[proxy.ServicePortName]*proxy.ServicePort{sp.Name: sp}), IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil)}
				}
				s1 := web(ep("10.244.2.5"))
				if err := syncSnap(ctx, b, snapOf(s1), proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				s2 := web(ep("10.244.2.5"), ep("10.244.2.6"))
				if err := syncSnap(ctx, b, snapOf(s2), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{s2.Name: {}}}); err != nil {
					t.Fatal(err)
				}
				if b.Last().Full || b.Last().Stats.WrittenChains != 1 {
					t.Errorf("endpoint change: full=%v, wrote %d chains", b.Last().Full, b.Last().Stats.WrittenChains)
				}
				if s := saveOf(t, b.m.opts.Iptables, "nat"); !strings.Contains(s, "--to-destination 10.244.2.6:8080") {
					t.Errorf("new endpoint missing:\n%s", s)
				}
				// Someone flushes the nat table.
				if out, err := exec.Command(CommandsFor(v1.IPv4Protocol, f).Iptables, "-w", "-t", "nat", "-F").CombinedOutput(); err != nil {
					t.Fatalf("flush: %v: %s", err, out)
				}
				// A sync with nothing to write notices by listing the canary.
				if err := syncSnap(ctx, b, snapOf(s2), proxy.Changes{}); err != nil {
					t.Fatal(err)
				}
				if !b.Last().Full {
					t.Error("the empty sync after a flush was not full")
				}
				if out, err := exec.Command(CommandsFor(v1.IPv4Protocol, f).Iptables, "-w", "-t", "nat", "-F").CombinedOutput(); err != nil {
					t.Fatalf("flush: %v: %s", err, out)
				}
				// A change notices: its restore fails on the canary.
				s3 := web(ep("10.244.2.6"))
				if err := syncSnap(ctx, b, snapOf(s3), proxy.Changes{Ports: map[proxy.ServicePortName]struct{}{s3.Name: {}}}); err != nil {
					t.Fatal(err)
				}
				if !b.Last().Full {
					t.Error("the sync after a flush was not full")
				}
				s := saveOf(t, b.m.opts.Iptables, "nat")
				for _, want := range []string{"-A PREROUTING -m comment --comment \"kproxy service portals\" -j KPROXY-SERVICES", "--to-destination 10.244.2.6:8080"} {
					if !strings.Contains(s, want) {
						t.Errorf("after the flush, %q is missing:\n%s", want, s)
					}
				}
			})
		})
	}
}

// TestKernelCleanup checks that --cleanup leaves iptables-save of nat and
// filter exactly as it was before kproxy ran.
func TestKernelCleanup(t *testing.T) {
	snap, _ := mixedSnapshot(t)
	pre := "*nat\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A DOCKER -p tcp -m tcp --dport 8888 -j DNAT --to-destination 172.17.0.2:80\nCOMMIT\n" +
		"*filter\n:FORWARD DROP [0:0]\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n"
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			inNetns(t, func() {
				ctx := context.Background()
				b := systemBackend(t, v1.IPv4Protocol, f, func(o *Options) { o.KeepUpstream = true })
				if err := b.m.opts.Iptables.Restore(ctx, []byte(pre)); err != nil {
					t.Fatal(err)
				}
				before := saveOf(t, b.m.opts.Iptables, "nat", "filter")
				if err := syncSnap(ctx, b, snap, proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				if saveOf(t, b.m.opts.Iptables, "nat", "filter") == before {
					t.Fatal("sync changed nothing")
				}
				if err := b.Cleanup(ctx); err != nil {
					t.Fatal(err)
				}
				if after := saveOf(t, b.m.opts.Iptables, "nat", "filter"); after != before {
					t.Errorf("after cleanup:\n%s", lineDiff(before, after))
				}
			})
		})
	}
}

// TestKernelTakeOver loads kube-proxy-style rules pointing at a wrong
// backend and an "ip kube-proxy" nftables table, then syncs.
func TestKernelTakeOver(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			inNetns(t, func() {
				ctx := context.Background()
				b := systemBackend(t, v1.IPv4Protocol, f, nil)
				if err := b.m.opts.Iptables.Restore(ctx, []byte(upstreamRules)); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command("nft", "add", "table", "ip", "kube-proxy").CombinedOutput(); err != nil {
					t.Fatalf("nft: %v: %s", err, out)
				}
				w := buildWorldSnapshot(t)
				if err := syncSnap(ctx, b, w, proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				all := saveOf(t, b.m.opts.Iptables, "nat", "filter", "mangle")
				for _, l := range strings.Split(all, "\n") {
					if strings.Contains(l, "KUBE-") && !strings.Contains(l, "KUBE-FIREWALL") && !strings.Contains(l, "KUBE-KUBELET-CANARY") {
						t.Errorf("left behind: %s", l)
					}
				}
				if !strings.Contains(all, "-A DOCKER -p tcp") {
					t.Error("take-over removed another tool's rules")
				}
				out, err := exec.Command("nft", "list", "tables").CombinedOutput()
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(out), "table ip kube-proxy") {
					t.Errorf("nftables table survived:\n%s", out)
				}
			})
		})
	}
}

// buildWorldSnapshot is the ClusterIP 10.96.0.1:80 → pod-a1 used by the
// upstream rules.
func buildWorldSnapshot(t testing.TB) *proxy.Snapshot {
	topo := proxytest.Default()
	svc := topo.Service("web", 1)
	slices, err := topo.Slices(svc, proxytest.Ready(proxytest.PodA1)...)
	if err != nil {
		t.Fatal(err)
	}
	node, err := topo.NodeObject(proxytest.Node1)
	if err != nil {
		t.Fatal(err)
	}
	return buildSnapshot(node, []*v1.Service{svc}, slices)
}

// TestKernelTraffic sends real connections from the node to ClusterIPs:
// one DNATed to a listener on a local "pod" address, one rejected at once.
func TestKernelTraffic(t *testing.T) {
	for _, f := range flavours {
		t.Run(string(f), func(t *testing.T) {
			inNetns(t, func() {
				ctx := context.Background()
				link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pods0"}, PeerName: "pods1"}
				if err := netlink.LinkAdd(link); err != nil {
					t.Fatal(err)
				}
				if err := netlink.LinkSetUp(link); err != nil {
					t.Fatal(err)
				}
				pod, _ := netlink.ParseAddr("10.244.1.10/32")
				if err := netlink.AddrAdd(link, pod); err != nil {
					t.Fatal(err)
				}
				_, all, _ := net.ParseCIDR("0.0.0.0/0")
				if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: all}); err != nil {
					t.Fatal(err)
				}
				ln, err := net.Listen("tcp4", "10.244.1.10:8080")
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = ln.Close() }()
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						_, _ = c.Write([]byte("pod-a1\n"))
						_ = c.Close()
					}
				}()
				b := systemBackend(t, v1.IPv4Protocol, f, nil)
				mk := func(name, ip string, eps ...proxy.Endpoint) *proxy.ServicePort {
					return &proxy.ServicePort{
						Name: proxy.ServicePortName{NamespacedName: nsName("default", name), Port: "http", Protocol: v1.ProtocolTCP}, Family: v1.IPv4Protocol,
						ClusterIP: netip.MustParseAddr(ip), Port: 80, Protocol: v1.ProtocolTCP,
						ClusterEndpoints: eps, HasAnyEndpoints: len(eps) > 0,
					}
				}
				web := mk("web", "10.96.0.10", proxy.Endpoint{IP: netip.MustParseAddr("10.244.1.10"), Port: 8080, Ready: true, Local: true})
				empty := mk("empty", "10.96.0.11")
				snap := &proxy.Snapshot{
					IPv4: proxy.NewFamilyView(v1.IPv4Protocol, map[proxy.ServicePortName]*proxy.ServicePort{web.Name: web, empty.Name: empty}),
					IPv6: proxy.NewFamilyView(v1.IPv6Protocol, nil),
				}
				if err := syncSnap(ctx, b, snap, proxy.Changes{Full: true}); err != nil {
					t.Fatal(err)
				}
				// Every connection is made from this thread (this namespace).
				d := net.Dialer{Timeout: 2 * time.Second}
				for i := 0; i < 3; i++ {
					c, err := d.Dial("tcp4", "10.96.0.10:80")
					if err != nil {
						t.Fatalf("ClusterIP: %v", err)
					}
					buf := make([]byte, 16)
					n, _ := c.Read(buf)
					_ = c.Close()
					if got := strings.TrimSpace(string(buf[:n])); got != "pod-a1" {
						t.Errorf("ClusterIP answered %q", got)
					}
				}
				start := time.Now()
				_, err = d.Dial("tcp4", "10.96.0.11:80")
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("Service without endpoints: %v, want connection refused", err)
				}
				if el := time.Since(start); el > time.Second {
					t.Errorf("refusal took %v", el)
				}
			})
		})
	}
}

// TestKernelConntrack creates UDP flows in the kernel's table and lets the
// netlink seam delete the stale ones.
func TestKernelConntrack(t *testing.T) {
	inNetns(t, func() {
		mk := func(dst, replySrc string, sport uint16) *netlink.ConntrackFlow {
			d := netip.MustParseAddrPort(dst)
			r := netip.MustParseAddrPort(replySrc)
			f := &netlink.ConntrackFlow{FamilyType: netlink.FAMILY_V4, TimeOut: 60}
			f.Forward = netlink.IPTuple{Protocol: 17, SrcIP: net.ParseIP("10.244.1.100"), SrcPort: sport, DstIP: d.Addr().AsSlice(), DstPort: d.Port()}
			f.Reverse = netlink.IPTuple{Protocol: 17, SrcIP: r.Addr().AsSlice(), SrcPort: r.Port(), DstIP: net.ParseIP("10.244.1.100"), DstPort: sport}
			return f
		}
		for i, f := range []*netlink.ConntrackFlow{
			mk("10.96.0.1:53", "10.244.2.10:53", 1000), // to a removed endpoint
			mk("10.96.0.1:53", "10.244.2.11:53", 1001), // to a live endpoint
			mk("10.96.0.1:53", "10.96.0.1:53", 1002),   // never NATed
			mk("10.96.0.2:53", "10.96.0.2:53", 1003),   // another Service
		} {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, f); err != nil {
				t.Fatalf("creating flow %d: %v", i, err)
			}
		}
		m := conntrack.NewMatcher([]conntrack.Filter{{
			Protocol: v1.ProtocolUDP, OrigDst: netip.MustParseAddrPort("10.96.0.1:53"),
			Keep: []netip.AddrPort{netip.MustParseAddrPort("10.244.2.11:53")},
		}})
		n, err := netlinkConntrack{}.DeleteFlows(v1.IPv4Protocol, m.Match)
		if err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Errorf("deleted %d flows, want 2", n)
		}
		left, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range left {
			got = append(got, fmt.Sprintf("%s:%d<-%s:%d", f.Forward.DstIP, f.Forward.DstPort, f.Reverse.SrcIP, f.Reverse.SrcPort))
		}
		if strings.Join(got, " ") != "10.96.0.1:53<-10.244.2.11:53 10.96.0.2:53<-10.96.0.2:53" &&
			strings.Join(got, " ") != "10.96.0.2:53<-10.96.0.2:53 10.96.0.1:53<-10.244.2.11:53" {
			t.Errorf("flows left: %v", got)
		}
	})
}

// TestKernelDetectFlavour checks that detection follows the rules present.
func TestKernelDetectFlavour(t *testing.T) {
	inNetns(t, func() {
		ctx := context.Background()
		if _, err := DetectFlavour(ctx, v1.IPv4Protocol); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("iptables-legacy", "-w", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if f, err := DetectFlavour(ctx, v1.IPv4Protocol); err != nil || f != FlavourLegacy {
			t.Errorf("with a legacy rule: %q, %v; want legacy", f, err)
		}
		for i := 0; i < 2; i++ {
			if out, err := exec.Command("iptables-nft", "-w", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", fmt.Sprint(23+i), "-j", "ACCEPT").CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
		if f, err := DetectFlavour(ctx, v1.IPv4Protocol); err != nil || f != FlavourNFT {
			t.Errorf("with more nft rules: %q, %v; want nft", f, err)
		}
		// kubelet's hint chain wins over rule counts.
		if out, err := exec.Command("iptables-legacy", "-w", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if f, err := DetectFlavour(ctx, v1.IPv4Protocol); err != nil || f != FlavourLegacy {
			t.Errorf("with kubelet's hint in legacy: %q, %v; want legacy", f, err)
		}
	})
}

// TestKernelTuneConntrack sets conntrack sysctls inside a throwaway network
// namespace: the per-namespace timeouts are written, nf_conntrack_max (which
// only the initial namespace may change) fails without stopping the others,
// and the global hash table size is left alone.
func TestKernelTuneConntrack(t *testing.T) {
	hashBefore, _ := os.ReadFile(hashsizePath)
	inNetns(t, func() {
		sys, err := NewSystem(v1.IPv4Protocol, FlavourAuto)
		if err != nil {
			t.Fatal(err)
		}
		cur, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_max")
		if err != nil {
			t.Skipf("no conntrack sysctls here: %v", err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(cur)))
		err = TuneConntrack(sys.Host, ConntrackSettings{Max: n + 1, UDPTimeout: 17 * time.Second, TCPCloseWaitTimeout: 1234 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "nf_conntrack_max") {
			t.Errorf("err = %v, want a failure to set nf_conntrack_max outside the initial namespace", err)
		}
		for name, want := range map[string]string{"nf_conntrack_udp_timeout": "17", "nf_conntrack_tcp_timeout_close_wait": "1234"} {
			got, _ := os.ReadFile("/proc/sys/net/netfilter/" + name)
			if strings.TrimSpace(string(got)) != want {
				t.Errorf("%s = %q, want %s", name, got, want)
			}
		}
	})
	if hashAfter, _ := os.ReadFile(hashsizePath); string(hashAfter) != string(hashBefore) {
		t.Errorf("the global conntrack hash size changed: %q → %q", hashBefore, hashAfter)
	}
}
