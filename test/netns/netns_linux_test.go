package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// echoBin is built once per test run by TestMain (as root only: without root
// every test here skips).
var echoBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Geteuid() == 0 && KernelTestsEnabled() {
			dir, err := os.MkdirTemp("", "kpt-echo-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer func() { _ = os.RemoveAll(dir) }()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if echoBin, err = BuildEcho(ctx, dir); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return m.Run()
	}())
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestGuardRefusesInitialNamespace gives this process's own namespace (the
// machine's, when tests run on a host) a harness name ("ip netns attach"
// binds it) and checks that every operation refuses it.
func TestGuardRefusesInitialNamespace(t *testing.T) {
	Require(t)
	ctx := testContext(t, 30*time.Second)
	name := fmt.Sprintf("%s%d-guard", Prefix, os.Getpid())
	if out, err := exec.CommandContext(ctx, "ip", "netns", "attach", name, fmt.Sprint(os.Getpid())).CombinedOutput(); err != nil {
		t.Fatalf("ip netns attach: %v: %s", err, out)
	}
	t.Cleanup(func() {
		// Unmounts the name only; the namespace itself is not affected.
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	attached := &NS{Name: name, Path: runDir + "/" + name}
	foreign := &NS{Name: "other", Path: runDir + "/other"}
	for _, tc := range []struct {
		name string
		op   func(n *NS) error
	}{
		{"Do", func(n *NS) error { return n.Do(func() error { return errors.New("fn must not run") }) }},
		{"IP", func(n *NS) error { return n.IP(ctx, "link show lo") }},
		{"Exec", func(n *NS) error { _, err := n.Exec(ctx, "true"); return err }},
		{"Sysctl", func(n *NS) error { return n.Sysctl(map[string]string{"net.ipv4.ip_forward": "0"}) }},
		{"Command", func(n *NS) error { _, err := n.Command(ctx, "true"); return err }},
		{"Open", func(n *NS) error { _, err := Open(n.Name); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []*NS{attached, foreign} {
				if err := tc.op(n); !errors.Is(err, ErrInitialNamespace) {
					t.Errorf("%s on %s: err = %v, want ErrInitialNamespace", tc.name, n.Name, err)
				}
			}
		})
	}
}

// TestSysctlStaysInside sets a sysctl in a harness namespace and checks the
// value there and the unchanged value in this process's namespace.
func TestSysctlStaysInside(t *testing.T) {
	Require(t)
	ctx := testContext(t, 30*time.Second)
	n, err := create(ctx, fmt.Sprintf("%s%d-sysctl", Prefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.remove(context.Background()); err != nil {
			t.Error(err)
		}
	})
	const key, file = "net.ipv4.conf.all.rp_filter", "/proc/sys/net/ipv4/conf/all/rp_filter"
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := "1"
	if strings.TrimSpace(string(before)) == "1" {
		want = "2"
	}
	if err := n.Sysctl(map[string]string{key: want}); err != nil {
		t.Fatal(err)
	}
	got, err := n.ReadSysctl(key)
	if err != nil || got != want {
		t.Errorf("inside: %s = %q (%v), want %q", key, got, err, want)
	}
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Errorf("outside: %s changed from %q to %q", key, before, after)
	}
	if err := n.Sysctl(map[string]string{"kernel.hostname": "x"}); err == nil {
		t.Error("non-net sysctl accepted")
	}
}

func TestSweepKeepsLiveRuns(t *testing.T) {
	Require(t)
	ctx := testContext(t, 30*time.Second)
	// A namespace of this (live) process and one of a pid that cannot exist.
	live, err := create(ctx, fmt.Sprintf("%s%d-live", Prefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.remove(context.Background()) })
	dead, err := create(ctx, Prefix+"4194304999-dead")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dead.remove(context.Background()) })
	removed, err := Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(removed, dead.Name) || contains(removed, live.Name) {
		t.Errorf("swept %v: want %s removed and %s kept", removed, dead.Name, live.Name)
	}
	if _, err := os.Stat(live.Path); err != nil {
		t.Errorf("live namespace gone: %v", err)
	}
}

// TestRemoveCluster removes exactly one cluster's namespaces (make
// cluster-down), whether or not its creator still runs, and Open finds a
// namespace by name until then.
func TestRemoveCluster(t *testing.T) {
	Require(t)
	ctx := testContext(t, 30*time.Second)
	id := fmt.Sprintf("%s%d-c1a5", Prefix, os.Getpid())
	var mine, others []*NS
	for _, name := range []string{id + "-lan", id + "-node1", id + "ff-node1", fmt.Sprintf("%s%d-0ther-node1", Prefix, os.Getpid())} {
		n, err := create(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.remove(context.Background()) })
		if strings.HasPrefix(name, id+"-") {
			mine = append(mine, n)
		} else {
			others = append(others, n)
		}
	}
	if n, err := Open(id + "-node1"); err != nil || n.Path != runDir+"/"+id+"-node1" {
		t.Fatalf("Open = %v, %v; want the namespace", n, err)
	}
	for _, bad := range []string{"", "kpt-", Prefix + "12", Prefix + "12-ab-node1", "other-12-ab", "../kpt-12-ab"} {
		if _, err := RemoveCluster(ctx, bad); err == nil {
			t.Errorf("RemoveCluster(%q) accepted a bad cluster ID", bad)
		}
	}
	removed, err := RemoveCluster(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != len(mine) || !contains(removed, mine[0].Name) || !contains(removed, mine[1].Name) {
		t.Errorf("removed %v, want exactly %s and %s", removed, mine[0], mine[1])
	}
	for _, n := range mine {
		if _, err := os.Stat(n.Path); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", n, err)
		}
		if _, err := Open(n.Name); err == nil {
			t.Errorf("Open(%s) succeeded after removal", n)
		}
	}
	for _, n := range others {
		if _, err := os.Stat(n.Path); err != nil {
			t.Errorf("%s of another cluster was removed: %v", n, err)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestClusterConnectivity checks the topology itself: pods reach each other
// across nodes with their own source address, refusals and black holes are
// told apart.
func TestClusterConnectivity(t *testing.T) {
	c := New(t, Options{EchoBinary: echoBin})
	ctx := testContext(t, 2*time.Minute)
	top := c.Topology
	host := func(name string) proxytest.Host {
		h, ok := top.Host(name)
		if !ok {
			t.Fatalf("no host %s", name)
		}
		return h
	}
	for _, tc := range []struct {
		from, to string // to: a host, or an address
		want     echo.Outcome
		seen     string // host whose address the server must see ("" = any)
	}{
		{proxytest.Client1, proxytest.PodB1, echo.Answer, proxytest.Client1},
		{proxytest.PodA1, proxytest.PodA2, echo.Answer, proxytest.PodA1},
		{proxytest.Client2, proxytest.PodA1, echo.Answer, proxytest.Client2},
		{proxytest.Node1, proxytest.PodB2, echo.Answer, proxytest.Node1},
		{proxytest.Outside, proxytest.Node1, echo.Rejected, ""},
		{proxytest.Client1, "10.96.0.1|fd00:10:96::1", echo.Dropped, ""},
		{proxytest.Outside, "192.168.60.1|fd00:60::1", echo.Dropped, ""},
	} {
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			for _, proto := range []string{"tcp", "udp"} {
				name := fmt.Sprintf("%s->%s/%s/%s", tc.from, tc.to, proto, fam)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					var dst netip.Addr
					if addrs := strings.Split(tc.to, "|"); len(addrs) == 2 {
						dst = netip.MustParseAddr(addrs[map[v1.IPFamily]int{v1.IPv4Protocol: 0, v1.IPv6Protocol: 1}[fam]])
					} else {
						dst = host(tc.to).Addr(fam)
					}
					r := c.Probe(ctx, tc.from, proto, netip.AddrPortFrom(dst, proxytest.EchoPort), echo.ProbeOptions{Timeout: time.Second})
					if r.Outcome != tc.want {
						t.Fatalf("%v, want %s", r, tc.want)
					}
					if tc.want != echo.Answer {
						return
					}
					if r.Reply.Name != tc.to {
						t.Errorf("answered by %s, want %s", r.Reply.Name, tc.to)
					}
					if tc.seen == proxytest.Node1 {
						if !top.IsNodeAddr(proxytest.Node1, r.Source.Addr()) {
							t.Errorf("server saw %s, want a node1 address", r.Source)
						}
					} else if tc.seen != "" && r.Source.Addr() != host(tc.seen).Addr(fam) {
						t.Errorf("server saw %s, want %s", r.Source, host(tc.seen).Addr(fam))
					}
				})
			}
		}
	}
}

// TestManualDNAT proves the harness and the row runner with hand-written
// iptables rules standing in for a proxy: the "clusterip", "no-endpoints" and
// "itp-local-no-local-endpoints" rows of the behaviour table must hold.
func TestManualDNAT(t *testing.T) {
	Require(t, "iptables", "ip6tables")
	c := New(t, Options{EchoBinary: echoBin})
	ctx := testContext(t, 2*time.Minute)
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	top := tb.Topology
	var rows []proxytest.Row
	for _, r := range tb.RowsFor(proxytest.DefaultConfig()) {
		switch {
		case r.Case.Name == "clusterip",
			r.Case.Name == "no-endpoints" && r.Target == proxytest.TargetClusterIP,
			r.Case.Name == "itp-local-no-local-endpoints":
			rows = append(rows, r)
		}
	}
	if len(rows) != 20 {
		t.Fatalf("selected %d rows, want 20", len(rows))
	}
	clusterIP := func(caseName string, fam v1.IPFamily) string {
		for _, cs := range tb.Cases {
			if cs.Name == caseName {
				return cs.Services[0].Spec.ClusterIPs[map[v1.IPFamily]int{v1.IPv4Protocol: 0, v1.IPv6Protocol: 1}[fam]]
			}
		}
		t.Fatalf("no case %s", caseName)
		return ""
	}
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		a1, _ := top.Host(proxytest.PodA1)
		b1, _ := top.Host(proxytest.PodB1)
		vip, none := clusterIP("clusterip", fam), clusterIP("no-endpoints", fam)
		ep := func(h proxytest.Host) string {
			return netip.AddrPortFrom(h.Addr(fam), proxytest.EchoPort).String()
		}
		var nat []string
		for _, proto := range []string{"tcp", "udp"} {
			nat = append(nat,
				fmt.Sprintf("-A KPT-SVC -d %s -p %s --dport 80 -m statistic --mode random --probability 0.5 -j DNAT --to-destination %s", vip, proto, ep(a1)),
				fmt.Sprintf("-A KPT-SVC -d %s -p %s --dport 80 -j DNAT --to-destination %s", vip, proto, ep(b1)))
		}
		restore := "*nat\n:KPT-SVC - [0:0]\n-A PREROUTING -j KPT-SVC\n-A OUTPUT -j KPT-SVC\n" + strings.Join(nat, "\n") +
			"\nCOMMIT\n*filter\n:KPT-REJECT - [0:0]\n-A INPUT -j KPT-REJECT\n-A FORWARD -j KPT-REJECT\n-A OUTPUT -j KPT-REJECT\n" +
			fmt.Sprintf("-A KPT-REJECT -d %s -j REJECT\nCOMMIT\n", none)
		tool := map[v1.IPFamily]string{v1.IPv4Protocol: "iptables-restore", v1.IPv6Protocol: "ip6tables-restore"}[fam]
		if _, err := c.NS(proxytest.Node1).ExecInput(ctx, []byte(restore), tool, "--noflush"); err != nil {
			t.Fatal(err)
		}
	}
	for _, res := range c.RunRows(ctx, rows, RowOptions{}) {
		if res.Err != nil {
			t.Error(res.Err)
		} else {
			t.Logf("%s: ok (%d attempts)", res.Row.Name, len(res.Observations))
		}
	}
}
