package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/differential"
	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// dropInEnv is a control plane and node1 with no proxy running yet, plus
// upstream kube-proxy v1.37's binary.
type dropInEnv struct {
	*env
	kubeProxy string
	logDir    string
}

// newDropInEnv is newEnv without kproxy: the topology, the control plane,
// node1's host firewall (test flavour) and the sentinel Service. It skips
// when kube-proxy is not built (make controlplane builds it).
func newDropInEnv(t *testing.T) *dropInEnv {
	t.Helper()
	bins := requireIntegration(t)
	if bins.KubeProxy == "" {
		skipOrFail(t, "upstream kube-proxy is not built: run make controlplane")
	}
	c := netns.New(t, netns.Options{EchoBinary: echoBin})
	ctx := testCtx(t, 3*time.Minute)
	ie, err := Start(ctx, Options{Cluster: c, Binaries: bins, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, Env: ie, top: c.Topology}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	if err := SeedFlavour(ctx, c, proxytest.Node1, flavour); err != nil {
		t.Fatal(err)
	}
	if err := AcceptPodForwarding(ctx, c, proxytest.Node1, flavour); err != nil {
		t.Fatal(err)
	}
	if err := e.GrantServiceCIDRs(ctx); err != nil {
		t.Fatal(err)
	}
	e.sentinel = e.createService(ctx, e.top.Service("kpt-ready", e2e.SentinelIndex), proxytest.Ready(proxytest.PodA2)...)
	logDir := os.Getenv(LogDirEnv)
	if logDir == "" {
		logDir = t.TempDir()
	} else if logDir, err = os.MkdirTemp(logDir, strings.ReplaceAll(t.Name(), "/", "_")+"-"); err != nil {
		t.Fatal(err)
	}
	return &dropInEnv{env: e, kubeProxy: bins.KubeProxy, logDir: logDir}
}

// proxyArgs are the flags both proxies get: every one is an upstream
// kube-proxy v1.37 flag (e2e.Proxy adds --hostname-override,
// --proxy-mode iptables, --conntrack-max-per-core 0 and -v 2; a later
// --proxy-mode wins).
func (d *dropInEnv) proxyArgs(mode string) []string {
	return []string{
		"--cluster-cidr", d.top.ClusterCIDR4.String() + "," + d.top.ClusterCIDR6.String(),
		"--proxy-mode", mode,
	}
}

// startProxy starts p and waits until it has programmed node1
// (Env.WaitProgrammed).
func (d *dropInEnv) startProxy(p *e2e.Proxy, what string) {
	d.t.Helper()
	begin := time.Now()
	if err := p.Start(); err != nil {
		d.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := d.WaitProgrammed(ctx, p, what, e2e.ServiceAddrs(d.sentinel)...); err != nil {
		d.t.Fatal(err)
	}
	d.t.Logf("%s: healthy and programmed %v after its start", what, time.Since(begin).Round(time.Millisecond))
}

func (d *dropInEnv) stopProxy(p *e2e.Proxy, what string) {
	d.t.Helper()
	if err := p.Stop(10 * time.Second); err != nil {
		d.t.Errorf("%s did not stop cleanly: %v", what, err)
	}
}

// load opens new connections all along (one at a time per target, about
// every 50 ms) and counts those that fail.
type load struct {
	mu       sync.Mutex
	total    int
	failures []string
	stop     chan struct{}
	done     sync.WaitGroup
}

type target struct {
	from string
	addr netip.AddrPort
}

func startLoad(c *netns.Cluster, targets ...target) *load {
	l := &load{stop: make(chan struct{})}
	for _, tg := range targets {
		l.done.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				r := c.Probe(ctx, tg.from, "tcp", tg.addr, echo.ProbeOptions{Timeout: 2 * time.Second})
				l.mu.Lock()
				l.total++
				if r.Outcome != echo.Answer {
					l.failures = append(l.failures, fmt.Sprintf("%s %s → %s: %v", time.Now().Format("15:04:05.000"), tg.from, tg.addr, r))
				}
				l.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	return l
}

// finish stops the load and returns the number of connections and failures.
func (l *load) finish() (int, []string) {
	close(l.stop)
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.failures
}

// rulesOf returns every line of node1's rules (both families; nat, filter
// and mangle of the test flavour, and the nftables ruleset) containing s.
func (d *dropInEnv) rulesOf(ctx context.Context, s string) string {
	d.t.Helper()
	var out []string
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, table := range []string{"nat", "filter", "mangle"} {
			if g := grep(d.save(ctx, fam, table), s); g != "" {
				out = append(out, string(fam)+" "+table+":\n"+g)
			}
		}
	}
	return strings.Join(out, "\n")
}

// nftTables lists node1's nftables tables.
func (d *dropInEnv) nftTables(ctx context.Context) string {
	out, err := d.Cluster.Exec(ctx, proxytest.Node1, "nft", "list", "tables")
	if err != nil {
		d.t.Fatal(err)
	}
	return string(out)
}

// awaitGone waits until check returns "" (bounded).
func (d *dropInEnv) awaitGone(what string, limit time.Duration, check func() string) {
	d.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := check()
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			d.t.Errorf("%s still there after %v:\n%s", what, limit, left)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestDropInSwap is issue 10's live swap: upstream kube-proxy v1.37.2 runs
// in node1 (iptables mode, then nftables mode) while clients open new
// connections to a ClusterIP (from a pod) and a NodePort (from outside) all
// along; kube-proxy is stopped and kproxy started with the same arguments,
// then rolled back to kube-proxy as docs/install.md says (kube-proxy
// started again, then "kproxy --cleanup --take-over-kube-proxy=false").
// Not one connection may fail, and after each swap no rule of the other
// proxy may be left.
//
// The config subtests run both proxies as kubeadm's DaemonSet does, with
// --config naming a kubeadm-style config.conf in a ConfigMap volume layout
// (the flags that set configuration fields are then ignored by both).
func TestDropInSwap(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { testDropInSwap(t, mode, false) })
		t.Run(mode+"-config", func(t *testing.T) { testDropInSwap(t, mode, true) })
	}
}

// kubeadmConfigFile writes kubeadm's generated config.conf
// (cmd/kproxy/testdata/kubeadm-config.conf) as a ConfigMap volume would
// hold it (config.conf → ..data/config.conf, ..data → a timestamped
// directory), with what this topology needs in place of kubeadm's values:
// the kubeconfig, the dual-stack cluster CIDR, the test's server
// addresses, conntrack.maxPerCore 0 (never touch the machine's conntrack
// table size) and, for nftables, the mode (kubeadm's "" is iptables). It
// returns the path of config.conf.
func (d *dropInEnv) kubeadmConfigFile(mode string) string {
	d.t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "cmd", "kproxy", "testdata", "kubeadm-config.conf"))
	if err != nil {
		d.t.Fatal(err)
	}
	conf := string(data)
	modeValue := `""`
	if mode != "iptables" {
		modeValue = mode
	}
	for _, r := range [][2]string{
		{"  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n", "  kubeconfig: " + d.Kubeconfig + "\n"},
		{"clusterCIDR: 10.244.0.0/16\n", "clusterCIDR: " + d.top.ClusterCIDR4.String() + "," + d.top.ClusterCIDR6.String() + "\n"},
		{"  maxPerCore: null\n", "  maxPerCore: 0\n"},
		{"healthzBindAddress: \"\"\n", "healthzBindAddress: " + HealthzAddr + "\n"},
		{"metricsBindAddress: \"\"\n", "metricsBindAddress: " + MetricsAddr + "\n"},
		{"mode: \"\"\n", "mode: " + modeValue + "\n"},
	} {
		if strings.Count(conf, r[0]) != 1 {
			d.t.Fatalf("kubeadm-config.conf has not exactly one %q", r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	dir := d.t.TempDir()
	ts := "..2026_01_01_00_00_00.1"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ts, "config.conf"), []byte(conf), 0o644); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
	path := filepath.Join(dir, "config.conf")
	if err := os.Symlink(filepath.Join("..data", "config.conf"), path); err != nil {
		d.t.Fatal(err)
	}
	return path
}

// checkConfigz makes sure the running proxy took its configuration from
// the config file: its /configz has the file's mode and its cluster CIDRs,
// which no flag gives it then.
func (d *dropInEnv) checkConfigz(ctx context.Context, what, mode string) {
	d.t.Helper()
	code, body, err := d.Get(ctx, proxytest.Node1, "http://"+MetricsAddr+"/configz")
	if err != nil || code != 200 {
		d.t.Fatalf("%s: /configz: %d %v", what, code, err)
	}
	for _, want := range []string{`"mode":"` + mode + `"`, d.top.ClusterCIDR6.String()} {
		if !strings.Contains(string(body), want) {
			d.t.Errorf("%s: /configz lacks %s (the config file was not used?):\n%.2000s", what, want, body)
		}
	}
}

func testDropInSwap(t *testing.T, mode string, viaConfig bool) {
	d := newDropInEnv(t)
	ctx := testCtx(t, 4*time.Minute)
	args := d.proxyArgs(mode)
	if viaConfig {
		// As kubeadm's DaemonSet: --config and --hostname-override (the
		// harness's other flags are ignored with --config, by both).
		args = []string{"--config", d.kubeadmConfigFile(mode)}
	}
	kp := d.Proxy(d.kubeProxy, "", d.logDir, args...)
	kx := d.Proxy(kproxyBin, "", d.logDir, args...)
	for _, p := range []*e2e.Proxy{kp, kx} {
		t.Cleanup(func() {
			if t.Failed() && p.Process() != nil {
				t.Logf("%s output:\n%s", p.Binary, e2e.LastLines(e2e.WithoutDumps(p.Process().Output()), 40))
			}
			if p.Running() {
				_ = p.Stop(5 * time.Second)
			}
		})
	}

	svc := d.createService(ctx, d.top.Service("web", 10, proxytest.WithNodePort()), proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	d.startProxy(kp, "kube-proxy ("+mode+")")
	if viaConfig {
		d.checkConfigz(ctx, "kube-proxy", mode)
	}
	targets := []target{
		{proxytest.Client1, clusterIP(svc, v1.IPv4Protocol)},
		{proxytest.Client1, clusterIP(svc, v1.IPv6Protocol)},
		{proxytest.Outside, d.nodePort(svc)},
	}
	for _, tg := range targets {
		d.await(tg.from, "tcp", tg.addr, expectation{backends: []string{proxytest.PodA1, proxytest.PodB1}}, 20*time.Second)
	}
	upstreamState := func() string {
		// Any kube-proxy chain but KUBE-FIREWALL, which kubelet v1.37 creates
		// too (same localnet rule) and which take-overs and upstream's own
		// cleanup leave to it.
		var kept []string
		for _, l := range strings.Split(d.rulesOf(ctx, "KUBE-"), "\n") {
			if strings.Contains(l, "KUBE-") && !strings.Contains(l, "KUBE-FIREWALL") {
				kept = append(kept, l)
			}
		}
		s := strings.Join(kept, "\n")
		if tables := d.nftTables(ctx); strings.Contains(tables, "kube-proxy") {
			s += "\nnftables: " + tables
		}
		return s
	}
	if mode == "nftables" && !strings.Contains(d.nftTables(ctx), "kube-proxy") {
		t.Fatalf("kube-proxy in nftables mode made no nftables table")
	}
	if mode == "iptables" && upstreamState() == "" {
		t.Fatalf("kube-proxy in iptables mode made no KUBE-SERVICES chain")
	}

	l := startLoad(d.Cluster, targets...)
	time.Sleep(time.Second)

	// kube-proxy → kproxy.
	swap := time.Now()
	d.stopProxy(kp, "kube-proxy")
	d.startProxy(kx, "kproxy ("+mode+" arguments)")
	if viaConfig {
		d.checkConfigz(ctx, "kproxy", mode)
	}
	t.Logf("kube-proxy → kproxy: %v", time.Since(swap).Round(time.Millisecond))
	d.awaitGone("kube-proxy's rules under kproxy", 30*time.Second, upstreamState)
	time.Sleep(2 * time.Second)

	// kproxy → kube-proxy (rollback).
	swap = time.Now()
	d.stopProxy(kx, "kproxy")
	d.startProxy(kp, "kube-proxy ("+mode+") again")
	out, err := d.Cluster.Exec(ctx, proxytest.Node1, kproxyBin, "--cleanup", "--take-over-kube-proxy=false", "--hostname-override", proxytest.Node1)
	if err != nil {
		t.Fatalf("kproxy --cleanup --take-over-kube-proxy=false: %v\n%s", err, out)
	}
	t.Logf("kproxy → kube-proxy: %v", time.Since(swap).Round(time.Millisecond))
	d.awaitGone("kproxy's rules after the rollback", 10*time.Second, func() string { return d.rulesOf(ctx, "KPROXY-") })
	time.Sleep(2 * time.Second)

	total, failures := l.finish()
	t.Logf("%d new connections across both swaps, %d failed", total, len(failures))
	if len(failures) > 0 {
		t.Errorf("%d of %d connections failed:\n%s", len(failures), total, strings.Join(failures, "\n"))
	}
	if total < 20 {
		t.Errorf("only %d connections were made", total)
	}
	for _, tg := range targets {
		d.await(tg.from, "tcp", tg.addr, expectation{backends: []string{proxytest.PodA1, proxytest.PodB1}}, 10*time.Second)
	}
	if upstreamState() == "" {
		t.Errorf("kube-proxy's rules are gone after the rollback")
	}
}

// TestDifferential runs the traffic rows of the shared behaviour table
// (test/proxytest) against upstream kube-proxy v1.37.2 and against kproxy,
// on the same topology and API server, one configuration at a time, with
// the same arguments. kproxy must pass every row; kube-proxy must answer
// every row the same way (pass it too), unless the outcomes of both, probed
// as the randomized differential probes (test/differential), match one of
// its documented differences (the same list, docs/compatibility.md).
func TestDifferential(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range tb.Configs() {
		t.Run(cfg.String(), func(t *testing.T) {
			d := newDropInEnv(t)
			ctx := testCtx(t, 5*time.Minute)
			_, svcs, slices := tb.Objects(cfg)
			for _, s := range svcs {
				if _, err := d.Writer.CreateService(ctx, s); err != nil {
					if !hasClusterIP(s, "10.96.0.1") {
						t.Fatal(err)
					}
					// The table's Service index 1 has the first ClusterIP,
					// which kube-apiserver gives its own "kubernetes"
					// Service: take it over (kube-apiserver then fails to
					// recreate its Service, which only it uses).
					if err := d.Admin.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
					// The failed create may hold the Service's other
					// family's address for a moment ("provided IP is
					// already allocated", seen once with fd00:10:96::1):
					// try again for a bounded while.
					for try := 0; ; try++ {
						_, err := d.Writer.CreateService(ctx, s)
						if err == nil {
							break
						}
						if try >= 30 || !strings.Contains(err.Error(), "already allocated") {
							t.Fatal(err)
						}
						time.Sleep(time.Second)
					}
				}
			}
			if err := d.Writer.ApplySlices(ctx, slices...); err != nil {
				t.Fatal(err)
			}
			var rows []proxytest.Row
			for _, r := range tb.RowsFor(cfg) {
				if r.Skip(proxytest.Linux) == "" {
					rows = append(rows, r)
				}
			}
			probes := map[string]differential.Probe{}
			cases := map[string]differential.Case{}
			var list []differential.Probe
			for _, r := range rows {
				p, c, err := differential.RowProbe(d.top, r, "iptables")
				if err != nil {
					t.Fatal(err)
				}
				// The proxies have every case of the configuration.
				c.AllSlices = slices
				probes[r.Name], cases[r.Name] = p, c
				list = append(list, p)
			}
			run := func(binary, what string) (map[string]error, map[string]differential.Result) {
				p := d.Proxy(binary, "", d.logDir)
				p.Config = cfg
				t.Cleanup(func() {
					if p.Running() {
						_ = p.Stop(5 * time.Second)
					}
				})
				d.startProxy(p, what)
				// Let every Service be programmed, not only the sentinel.
				time.Sleep(2 * time.Second)
				// Only this proxy's rules answer.
				other := "KUBE-SERVICES"
				if binary == d.kubeProxy {
					other = "KPROXY-"
				}
				if left := d.rulesOf(ctx, other); left != "" {
					t.Fatalf("%s runs with the other proxy's rules in node1:\n%s", what, left)
				}
				out := map[string]error{}
				for _, res := range d.Cluster.RunRows(ctx, rows, netns.RowOptions{}) {
					out[res.Row.Name] = res.Err
				}
				results := (&differential.Runner{Cluster: d.Cluster}).ProbeAll(ctx, list)
				if t.Failed() {
					t.Logf("%s output:\n%s", what, e2e.LastLines(e2e.WithoutDumps(p.Process().Output()), 40))
				}
				d.stopProxy(p, what)
				return out, results
			}
			kx, kxRes := run(kproxyBin, "kproxy")
			// Start kube-proxy from a clean node, as on a new node.
			if out, err := d.Cluster.Exec(ctx, proxytest.Node1, kproxyBin, "--cleanup", "--hostname-override", proxytest.Node1); err != nil {
				t.Fatalf("kproxy --cleanup: %v\n%s", err, out)
			}
			kp, kpRes := run(d.kubeProxy, "kube-proxy")
			same, diff := 0, 0
			for _, r := range rows {
				kxErr, kpErr := kx[r.Name], kp[r.Name]
				if kxErr != nil {
					t.Errorf("%s: kproxy fails the row: %v", r.Name, kxErr)
				}
				if kpErr == nil {
					same++
					continue
				}
				diff++
				key := probes[r.Name].Key()
				up, own := kpRes[key], kxRes[key]
				if up.Outcome() == own.Outcome() {
					// The row's own probe saw upstream differ, the
					// differential's probe of the same row did not: what
					// the randomized differential calls a difference seen
					// once (it fails only what differs twice).
					t.Logf("%s: kube-proxy failed the row once (%v), but answered as kproxy when probed again: %s", r.Name, kpErr, up.Outcome())
					continue
				}
				if why := differential.Intended(cases[r.Name], probes[r.Name], up, own); why != nil {
					t.Logf("%s: documented difference %q (%s): kube-proxy: %v", r.Name, why.Name, why.Reason, kpErr)
					continue
				}
				t.Errorf("%s: kube-proxy v1.37.2 answers differently (not a documented difference): %v\n  semantic: %s\n"+
					"  probed again: kube-proxy %s; kproxy %s", r.Name, kpErr, r.Case.Semantic, up.Outcome(), own.Outcome())
			}
			t.Logf("%d rows: %d answered the same by kube-proxy and kproxy, %d differently", len(rows), same, diff)
		})
	}
}

// hasClusterIP reports whether svc has the ClusterIP ip.
func hasClusterIP(svc *v1.Service, ip string) bool {
	for _, c := range svc.Spec.ClusterIPs {
		if c == ip {
			return true
		}
	}
	return false
}
