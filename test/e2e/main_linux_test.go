package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// Binaries built once per test run by TestMain (as root only; without root
// every test skips).
var (
	echoBin, kproxyBin string
	kproxyBuildErr     error
)

func TestMain(m *testing.M) {
	os.Exit(netns.MainWithBinaries(m, KProxyPackage, raceEnabled, func(b netns.Binaries) {
		echoBin, kproxyBin, kproxyBuildErr = b.Echo, b.Main, b.MainErr
	}))
}

// env is one test's cluster with kproxy running in node1.
type env struct {
	t     *testing.T
	c     *netns.Cluster
	p     *Proxy
	dir   string
	top   *proxytest.Topology
	ready []netip.AddrPort
	// readyWait bounds how long a start may take to program the sentinel
	// (default 30 s).
	readyWait time.Duration
}

// envOptions tune newEnv.
type envOptions struct {
	config proxytest.Config
	extra  []string
	// before runs after the cluster is built, before kproxy starts.
	before func(e *env)
	// objects to write into the manifest directory ("objects.yaml") before start.
	objects []any
	// noStart leaves kproxy stopped.
	noStart bool
}

// FlavourEnv selects the iptables flavour of the e2e tests: "nft" (the
// default) or "legacy". Each test seeds node1 with a host firewall rule
// through that flavour's tools, so kproxy (which follows the flavour the
// host already uses) picks it, and checks that kproxy never touches the
// other one.
const FlavourEnv = "KPROXY_E2E_FLAVOUR"

// ModeEnv selects the proxy mode of the e2e tests: "iptables" (the
// default) or "nftables". In the nftables mode node1's host firewall is an
// nftables table (kproxy's nftables mode, like upstream's, does not open
// the host's own firewall: a forward policy of drop stays the host's
// business), and kproxy must leave iptables untouched.
const ModeEnv = "KPROXY_E2E_MODE"

// nftMode reports whether the tests run kproxy's nftables mode.
func nftMode() bool { return os.Getenv(ModeEnv) == "nftables" }

func mode() string {
	if nftMode() {
		return "nftables"
	}
	return "iptables"
}

// iptablesOnly skips a test that checks what only the iptables mode does.
func iptablesOnly(t *testing.T, why string) {
	t.Helper()
	if nftMode() {
		t.Skipf("iptables mode only: %s", why)
	}
}

func flavour() string {
	if os.Getenv(FlavourEnv) == "legacy" {
		return "legacy"
	}
	return "nft"
}

func otherFlavour() string {
	if flavour() == "legacy" {
		return "nft"
	}
	return "legacy"
}

// tool names an iptables tool of the test's flavour: kind is "", "-save" or "-restore".
func tool(fam v1.IPFamily, kind string) string { return toolOf(fam, flavour(), kind) }

func toolOf(fam v1.IPFamily, flav, kind string) string {
	base := "iptables"
	if fam == v1.IPv6Protocol {
		base = "ip6tables"
	}
	return base + "-" + flav + kind
}

// requireKernel skips, or fails under CI=true, without root or tools; it
// fails when the kproxy binary did not build.
func requireKernel(t *testing.T) {
	t.Helper()
	var tools []string
	for _, fam := range families() {
		for _, kind := range []string{"", "-save", "-restore"} {
			tools = append(tools, tool(fam, kind))
		}
	}
	if nftMode() {
		tools = append(tools, "nft")
	}
	netns.Require(t, tools...)
	// A kproxy that does not build is a failure, never a reason to skip:
	// only the machine (root, tools) may make a kernel test skip.
	if kproxyBuildErr != nil {
		t.Fatalf("building kproxy: %v", kproxyBuildErr)
	}
}

// optionalTool reports whether tool is installed. A test may leave out
// the part that needs it, saying what is not tested, but not under
// CI=true, where every tool is installed and a missing one fails the test.
func optionalTool(t *testing.T, tool, without string) bool {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %s is not installed (%s)", tool, without)
		}
		t.Logf("%s is not installed: %s", tool, without)
		return false
	}
	return true
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	requireKernel(t)
	c := netns.New(t, netns.Options{EchoBinary: echoBin})
	e := &env{t: t, c: c, dir: t.TempDir(), top: c.Topology}
	e.p = &Proxy{Cluster: c, Binary: kproxyBin, ManifestDir: e.dir, LogDir: t.TempDir(), Config: o.config, Extra: o.extra, Mode: mode()}
	// A host firewall in the test's iptables flavour: a FORWARD policy of
	// DROP, as many hosts have (Service traffic must still be forwarded:
	// kproxy accepts it), and a stateful rule, which makes this flavour the
	// one the host "already uses" and turns connection tracking on in the
	// namespace before kproxy runs.
	if nftMode() {
		// A stateful host firewall of the host's own (connection tracking
		// on before kproxy runs).
		if _, err := e.c.NS(proxytest.Node1).ExecInput(e.ctx(30*time.Second), []byte(hostFirewallNFT), "nft", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	} else {
		for _, fam := range families() {
			e.iptables(fam, "-P", "FORWARD", "DROP")
			e.iptables(fam, "-A", "INPUT", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
		}
	}
	svc, slices, err := Sentinel(e.top)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteObjects(e.dir, "00-sentinel.yaml", svc, slices[0], slices[1]); err != nil {
		t.Fatal(err)
	}
	e.ready = ServiceAddrs(svc)
	nodes := e.top.NodeObjects()
	if err := WriteObjects(e.dir, "00-nodes.yaml", nodes[0], nodes[1]); err != nil {
		t.Fatal(err)
	}
	if len(o.objects) > 0 {
		e.write("objects.yaml", o.objects...)
	}
	if o.before != nil {
		o.before(e)
	}
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpRules()
		}
		if e.p.Running() {
			if err := e.p.Stop(5 * time.Second); err != nil {
				t.Errorf("stopping kproxy: %v", err)
			}
		}
	})
	if !o.noStart {
		e.start()
	}
	return e
}

func (e *env) ctx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e.t.Cleanup(cancel)
	return ctx
}

// write renders objects into a manifest file of the environment.
func (e *env) write(name string, objs ...any) {
	e.t.Helper()
	if err := WriteObjects(e.dir, name, objs...); err != nil {
		e.t.Fatal(err)
	}
}

// start starts kproxy and waits until the sentinel answers in both families;
// it then checks that kproxy programmed the test's iptables flavour and left
// the other one alone.
func (e *env) start() {
	e.t.Helper()
	if err := e.p.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.waitReady()
	if nftMode() {
		for _, fam := range families() {
			if out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, "nft", "list", "chain", nftFamily(fam), "kproxy", "services"); err != nil {
				e.t.Errorf("%s: no kproxy nftables table: %v", fam, err)
			} else if !strings.Contains(string(out), "vmap @frontends") {
				e.t.Errorf("%s: kproxy's services chain:\n%s", fam, out)
			}
			for _, fl := range []string{"nft", "legacy"} {
				out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, toolOf(fam, fl, "-save"))
				if err == nil && strings.Contains(string(out), "KPROXY-") {
					e.t.Errorf("%s: the nftables mode wrote iptables rules (%s):\n%s", fam, toolOf(fam, fl, "-save"), LastLines(string(out), 20))
				}
			}
		}
		return
	}
	for _, fam := range families() {
		if save := e.save(fam, "nat"); !strings.Contains(save, ":KPROXY-") {
			e.t.Errorf("%s: no KPROXY chains in %s nat", fam, tool(fam, "-save"))
		}
		out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, toolOf(fam, otherFlavour(), "-save"))
		if err == nil && strings.Contains(string(out), "KPROXY-") {
			e.t.Errorf("%s: kproxy mixed flavours: %s shows KPROXY rules:\n%s", fam, toolOf(fam, otherFlavour(), "-save"), LastLines(string(out), 20))
		}
	}
}

func (e *env) waitReady() {
	e.t.Helper()
	begin := time.Now()
	wait := e.readyWait
	if wait == 0 {
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- WaitReady(ctx, e.c, proxytest.Node1, e.ready...) }()
	select {
	case err := <-done:
		if err != nil {
			e.t.Fatalf("kproxy never programmed the sentinel Service: %v\nkproxy output:\n%s", err, LastLines(e.p.Process().Output(), 40))
		}
	case <-e.p.Process().Done():
		cancel()
		<-done
		e.t.Fatalf("kproxy exited before programming anything: %v\n%s", e.p.Process().Err(), LastLines(e.p.Process().Output(), 40))
	}
	e.t.Logf("kproxy run %d programmed the sentinel in %v", e.p.runs, time.Since(begin).Round(time.Millisecond))
}

// save returns iptables-save (or ip6tables-save) of one table in node1, in
// the test's flavour.
func (e *env) save(fam v1.IPFamily, table string) string {
	e.t.Helper()
	out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, tool(fam, "-save"), "-t", table)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(out)
}

// iptables runs iptables or ip6tables (of the test's flavour) with args in node1.
func (e *env) iptables(fam v1.IPFamily, args ...string) {
	e.t.Helper()
	if _, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, append([]string{tool(fam, ""), "-w"}, args...)...); err != nil {
		e.t.Fatal(err)
	}
}

// restore feeds iptables-restore (or ip6tables-restore) --noflush of the
// test's flavour in node1.
func (e *env) restore(fam v1.IPFamily, rules string) {
	e.t.Helper()
	if _, err := e.c.NS(proxytest.Node1).ExecInput(e.ctx(30*time.Second), []byte(rules), tool(fam, "-restore"), "-w", "--noflush"); err != nil {
		e.t.Fatal(err)
	}
}

// nft runs nft with args in node1.
func (e *env) nft(args ...string) {
	e.t.Helper()
	if out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, append([]string{"nft"}, args...)...); err != nil {
		e.t.Fatalf("nft %v: %v\n%s", args, err, out)
	}
}

// nftTable returns "nft list table" of kproxy's table of fam in node1
// ("" when there is none).
func (e *env) nftTable(fam v1.IPFamily) string {
	e.t.Helper()
	out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, "nft", "list", "table", nftFamily(fam), "kproxy")
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return ""
		}
		e.t.Fatalf("nft list table %s kproxy: %v\n%s", nftFamily(fam), err, out)
	}
	return string(out)
}

// nftRuleset returns "nft list ruleset" in node1.
func (e *env) nftRuleset() string {
	e.t.Helper()
	out, err := e.c.Exec(e.ctx(30*time.Second), proxytest.Node1, "nft", "list", "ruleset")
	if err != nil {
		e.t.Fatal(err)
	}
	return string(out)
}

func (e *env) dumpRules() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if nftMode() {
		if out, err := e.c.Exec(ctx, proxytest.Node1, "nft", "list", "ruleset"); err == nil {
			e.t.Logf("nft list ruleset in node1:\n%s", LastLines(string(out), 300))
		}
	}
	for _, fam := range families() {
		cmd := tool(fam, "-save")
		if out, err := e.c.Exec(ctx, proxytest.Node1, cmd); err == nil {
			e.t.Logf("%s in node1:\n%s", cmd, LastLines(string(out), 200))
		}
	}
	if p := e.p.Process(); p != nil {
		e.t.Logf("kproxy run %d output (desired-state dumps left out):\n%s", e.p.runs, LastLines(WithoutDumps(p.Output()), 60))
	}
}

func families() []v1.IPFamily { return []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} }

func nftFamily(f v1.IPFamily) string {
	if f == v1.IPv6Protocol {
		return "ip6"
	}
	return "ip"
}

// hostFirewallNFT is node1's own firewall in the nftables mode's tests.
const hostFirewallNFT = `table inet host-firewall {
	chain input {
		type filter hook input priority filter; policy accept;
		ct state established,related accept
	}
}
`
