package e2e

import (
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

// upstreamIPVSRules are the ipvs mode's own filter chains (with kube-proxy's
// jumps), added to the iptables-mode layout of upstreamRules.
const upstreamIPVSRules = `*filter
:KUBE-IPVS-FILTER - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A KUBE-IPVS-FILTER -j RETURN
-A KUBE-PROXY-FIREWALL -j KUBE-SOURCE-RANGES-FIREWALL
COMMIT
`

// TestCleanupUpstreamState: a node holding kube-proxy's state of every mode
// — iptables-mode chains and jumps in both families, the ipvs mode's filter
// chains, its dummy interface kube-ipvs0 and (when ipset is installed) its
// KUBE-* ipsets, the nftables tables "ip kube-proxy" and "ip6 kube-proxy" —
// next to foreign rules, a foreign nftables table, interface and ipset. After
// "kproxy --cleanup" kube-proxy's state is gone and everything else is
// exactly as before; with --take-over-kube-proxy=false (the rollback
// DaemonSet) kube-proxy's state stays.
func TestCleanupUpstreamState(t *testing.T) {
	withNft := optionalTool(t, "nft", "the nftables part is not tested")
	withIPSet := optionalTool(t, "ipset", "the ipset part is not tested (kproxy --cleanup says it skipped them)")
	top := proxytest.Default()
	wrong, _ := top.Host(proxytest.PodB3)
	before := map[string]string{}
	snapshot := func(e *env) map[string]string {
		out := map[string]string{}
		for _, fam := range families() {
			for _, table := range []string{"nat", "filter", "mangle"} {
				out[string(fam)+"/"+table] = normalize(e.save(fam, table))
			}
		}
		out["links"] = e.links()
		if withNft {
			out["nft"] = e.run("nft", "list", "tables")
			out["nft inet other"] = e.run("nft", "list", "table", "inet", "other")
		}
		if withIPSet {
			out["ipsets"] = sortedLines(e.run("ipset", "list", "-n"))
		}
		return out
	}
	e := newEnv(t, envOptions{
		config:  proxytest.DefaultConfig(),
		noStart: true,
		before: func(e *env) {
			// Foreign state, which must survive.
			e.restore(v1.IPv4Protocol, strings.ReplaceAll(foreignRules, "%[1]s", "10.99.0.0/16"))
			e.restore(v1.IPv6Protocol, strings.ReplaceAll(foreignRules, "%[1]s", "fd00:99::/64"))
			e.addLink("other0")
			if withNft {
				e.run("nft", "add", "table", "inet", "other")
				e.run("nft", "add", "chain", "inet", "other", "input", "{ type filter hook input priority 10 ; policy accept ; }")
			}
			if withIPSet {
				e.run("ipset", "create", "OTHER-SET", "hash:ip")
			}
			before = snapshot(e)
		},
	})

	// kube-proxy's state.
	e.restore(v1.IPv4Protocol, upstreamRules("10.96.0.106", wrong.IPv4))
	e.restore(v1.IPv6Protocol, upstreamRules("fd00:96::106", wrong.IPv6))
	e.restore(v1.IPv4Protocol, upstreamIPVSRules)
	e.restore(v1.IPv6Protocol, upstreamIPVSRules)
	e.addLink("kube-ipvs0")
	e.run("ip", "addr", "add", "10.96.0.106/32", "dev", "kube-ipvs0")
	if withNft {
		for _, fam := range []string{"ip", "ip6"} {
			e.run("nft", "add", "table", fam, "kube-proxy")
			e.run("nft", "add", "chain", fam, "kube-proxy", "services")
		}
	}
	if withIPSet {
		e.run("ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port")
		e.run("ipset", "create", "KUBE-NODE-PORT-TCP", "bitmap:port", "range", "0-65535")
	}
	if s := e.save(v1.IPv4Protocol, "nat"); !strings.Contains(s, ":KUBE-SERVICES") {
		t.Fatalf("the fake kube-proxy rules are not in place:\n%s", s)
	}

	// The rollback DaemonSet's cleanup (--take-over-kube-proxy=false) runs
	// next to a kube-proxy: it leaves kube-proxy's state alone.
	if out, err := e.c.Exec(e.ctx(time.Minute), proxytest.Node1, e.p.Binary, "--cleanup", "--take-over-kube-proxy=false",
		"--hostname-override", proxytest.Node1); err != nil {
		t.Fatalf("kproxy --cleanup --take-over-kube-proxy=false: %v\n%s", err, out)
	}
	if s := e.save(v1.IPv4Protocol, "nat"); !strings.Contains(s, ":KUBE-SERVICES") || !strings.Contains(e.links(), "kube-ipvs0") {
		t.Fatalf("--cleanup --take-over-kube-proxy=false removed kube-proxy's state:\n%s", s)
	}

	out, err := e.p.Cleanup(e.ctx(time.Minute))
	t.Logf("kproxy --cleanup output:\n%s", LastLines(string(out), 30))
	if err != nil {
		t.Fatalf("kproxy --cleanup: %v", err)
	}
	after := snapshot(e)
	for k, want := range before {
		if got := after[k]; got != want {
			t.Errorf("%s after --cleanup differs from before kube-proxy's state was added:\n--- before\n%s\n--- after\n%s", k, want, got)
		}
	}
	for _, fam := range families() {
		for _, table := range []string{"nat", "filter"} {
			if s := after[string(fam)+"/"+table]; strings.Contains(s, "KUBE-") {
				t.Errorf("%s %s still holds kube-proxy's rules:\n%s", fam, table, s)
			}
		}
	}
	if strings.Contains(after["links"], "kube-ipvs0") {
		t.Errorf("kube-ipvs0 still exists: %s", after["links"])
	}
	if withNft && strings.Contains(after["nft"], "kube-proxy") {
		t.Errorf("kube-proxy's nftables tables still exist:\n%s", after["nft"])
	}
	if !withIPSet && !strings.Contains(string(out), "ipset is not installed") {
		t.Errorf("--cleanup did not say that it skipped ipsets")
	}

	// Cleaning up again is harmless.
	if out, err := e.p.Cleanup(e.ctx(time.Minute)); err != nil {
		t.Errorf("second kproxy --cleanup: %v\n%s", err, out)
	}
}

// run runs a command in node1 and returns its output.
func (e *env) run(argv ...string) string {
	e.t.Helper()
	out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, argv...)
	if err != nil {
		e.t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return string(out)
}

// addLink adds an interface to node1: a dummy, as kube-proxy's kube-ipvs0
// is, or a bridge where the kernel has no dummy driver (loading a module
// would change the machine, not the namespace).
func (e *env) addLink(name string) {
	e.t.Helper()
	for _, typ := range []string{"dummy", "bridge"} {
		if _, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, "ip", "link", "add", name, "type", typ); err == nil {
			return
		}
	}
	e.t.Fatalf("cannot add interface %s (neither dummy nor bridge)", name)
}

// links lists node1's interface names, sorted.
func (e *env) links() string {
	var names []string
	for _, l := range strings.Split(e.run("ip", "-o", "link", "show"), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			names = append(names, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

func sortedLines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(l)
	return strings.Join(l, "\n")
}
