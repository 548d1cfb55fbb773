package differential

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/integration"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

var (
	seedsFlag  = flag.String("differential.seeds", "", "comma-separated seeds to run (default: the fixed list of make test)")
	freshFlag  = flag.Int("differential.fresh", 0, "run this many fresh random seeds instead of the fixed list")
	modesFlag  = flag.String("differential.modes", "iptables,nftables", "proxy modes to compare (each proxy in the same mode)")
	batchFlag  = flag.Int("differential.batch", 8, "seeds loaded at once per proxy run (at most proxytest.RandomSlots)")
	reportFlag = flag.String("differential.report", "", "file to write the summary of the run to")
	kproxyFlag = flag.String("differential.kproxy", "", "kproxy binary to compare (default: built from this tree), e.g. one built from an older commit")
)

// fixedSeeds run in make test: every mode, both proxies, one batch. They
// were drawn once and are kept so that CI runs the same cases every time
// (make test-differential runs fresh ones).
var fixedSeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8}

var (
	echoBin, kproxyBin string
	kproxyBuildErr     error
)

func TestMain(m *testing.M) {
	os.Exit(netns.MainWithBinaries(m, e2e.KProxyPackage, raceEnabled, func(b netns.Binaries) {
		echoBin, kproxyBin, kproxyBuildErr = b.Echo, b.Main, b.MainErr
	}))
}

func skipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true: " + msg)
	}
	t.Skip(msg)
}

// logDirEnv names a directory that keeps the proxies' logs (as in
// test/integration); by default they go to the test's temporary directory.
const logDirEnv = "KPROXY_INTEGRATION_LOGS"

// flavour is the iptables flavour node1's host firewall is seeded with.
const flavour = "nft"

// world is the integration suite's topology and API server, with the
// extra echo servers and client addresses of the differential.
type world struct {
	t         *testing.T
	c         *netns.Cluster
	env       *integration.Env
	kubeProxy string
	sentinel  []netip.AddrPort
	runner    *Runner
	logDir    string
	// sysctls are node1's sysctls a proxy may change, as they were before
	// any ran; every run starts from them.
	sysctls map[string]string
	// runs counts the proxy runs (the saved rules' names).
	runs int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	netns.Require(t, "iptables", "iptables-"+flavour, "ip6tables-"+flavour, "iptables-"+flavour+"-save", "nft", "conntrack")
	if *kproxyFlag != "" {
		kproxyBin, kproxyBuildErr = *kproxyFlag, nil
	}
	if kproxyBuildErr != nil {
		skipOrFail(t, fmt.Sprintf("building kproxy: %v", kproxyBuildErr))
	}
	bins, err := controlplane.Ensure(context.Background(), controlplane.BuildOptions{NoBuild: true})
	if err != nil {
		if !errors.Is(err, controlplane.ErrNotBuilt) {
			t.Fatal(err)
		}
		skipOrFail(t, err.Error())
	}
	if bins.KubeProxy == "" {
		skipOrFail(t, "upstream kube-proxy is not built: run make controlplane")
	}
	c := netns.New(t, netns.Options{EchoBinary: echoBin})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	top := c.Topology
	for _, pod := range top.Pods {
		p, err := c.Start(pod.Name, "echo-alt-"+pod.Name, "", echoBin, "serve", "-name", proxytest.AltBackend(pod.Name),
			"-port", strconv.Itoa(proxytest.AltEchoPort))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitOutput(ctx, "ready"); err != nil {
			t.Fatal(err)
		}
	}
	if err := AddExtraAddresses(ctx, c); err != nil {
		t.Fatal(err)
	}
	env, err := integration.Start(ctx, integration.Options{Cluster: c, Binaries: bins, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	if err := integration.SeedFlavour(ctx, c, proxytest.Node1, flavour); err != nil {
		t.Fatal(err)
	}
	if err := integration.AcceptPodForwarding(ctx, c, proxytest.Node1, flavour); err != nil {
		t.Fatal(err)
	}
	if err := env.GrantServiceCIDRs(ctx); err != nil {
		t.Fatal(err)
	}
	sentinel, err := env.Sentinel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, c: c, env: env, kubeProxy: bins.KubeProxy, sentinel: e2e.ServiceAddrs(sentinel),
		runner: &Runner{Cluster: c}, logDir: t.TempDir(), sysctls: map[string]string{}}
	if dir := os.Getenv(logDirEnv); dir != "" {
		if w.logDir, err = os.MkdirTemp(dir, "differential-"); err != nil {
			t.Fatal(err)
		}
	}
	node := c.NS(proxytest.Node1)
	for _, k := range []string{"net.ipv4.conf.all.route_localnet", "net.ipv4.conf.default.route_localnet", "net.ipv4.conf.eth0.route_localnet"} {
		v, err := node.ReadSysctl(k)
		if err != nil {
			t.Fatal(err)
		}
		w.sysctls[k] = v
	}
	return w
}

// run starts one proxy in node1 in a mode, waits until it has programmed
// the node, makes every probe, stops it, and leaves node1 as before it
// ran: kproxy --cleanup (which removes kube-proxy's rules too), conntrack
// flushed, the sysctls restored. It fails the test if rules are left.
func (w *world) run(ctx context.Context, binary, what, mode string, probes []Probe) map[string]Result {
	t := w.t
	t.Helper()
	node := w.c.NS(proxytest.Node1)
	if err := node.Sysctl(w.sysctls); err != nil {
		t.Fatal(err)
	}
	if left := w.leftovers(ctx); left != "" {
		t.Fatalf("before %s: rules of a proxy are in node1:\n%s", what, left)
	}
	p := w.env.Proxy(binary, "", w.logDir)
	p.Mode = mode
	p.Config = proxytest.DefaultConfig()
	begin := time.Now()
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if p.Running() {
			_ = p.Stop(5 * time.Second)
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := w.env.WaitProgrammed(wctx, p, what, w.sentinel...); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(begin)
	// Let a sync that follows the first (upstream's come at least a second
	// apart) settle before probing.
	time.Sleep(time.Second)
	probing := time.Now()
	res := w.runner.ProbeAll(ctx, probes)
	attempts := 0
	for _, r := range res {
		attempts += len(r.Attempts)
	}
	t.Logf("%s (%s): programmed in %v; %d probes, %d attempts in %v", what, mode, ready.Round(time.Millisecond),
		len(probes), attempts, time.Since(probing).Round(time.Millisecond))
	w.saveRules(ctx, what, mode)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Errorf("%s did not stop cleanly: %v\n%s", what, err, e2e.LastLines(e2e.WithoutDumps(p.Process().Output()), 40))
	}
	if out, err := w.c.Exec(ctx, proxytest.Node1, kproxyBin, "--cleanup", "--hostname-override", proxytest.Node1); err != nil {
		t.Fatalf("kproxy --cleanup after %s: %v\n%s", what, err, out)
	}
	if out, err := w.c.Exec(ctx, proxytest.Node1, "conntrack", "-F"); err != nil {
		t.Fatalf("conntrack -F: %v\n%s", err, out)
	}
	return res
}

// saveRules writes node1's rules as the proxy left them (iptables of the
// nft flavour, both families, and the nftables ruleset) next to its log,
// to read when a seed fails.
func (w *world) saveRules(ctx context.Context, what, mode string) {
	w.runs++
	var b strings.Builder
	for _, argv := range [][]string{{"iptables-nft-save"}, {"ip6tables-nft-save"}, {"nft", "list", "ruleset"}} {
		out, err := w.c.Exec(ctx, proxytest.Node1, argv...)
		fmt.Fprintf(&b, "# %s (%v)\n%s\n", strings.Join(argv, " "), err, out)
	}
	name := filepath.Join(w.logDir, fmt.Sprintf("run%02d-%s-%s.rules", w.runs, what, mode))
	if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
		w.t.Logf("saving the rules: %v", err)
	}
}

// leftovers returns node1's rules of either proxy (iptables of both
// flavours and families, nftables tables), "" when there are none.
func (w *world) leftovers(ctx context.Context) string {
	var out []string
	for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		b, err := w.c.Exec(ctx, proxytest.Node1, bin)
		if err != nil {
			continue // that flavour's tools may be missing: nothing of it is used
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "KPROXY") || (strings.Contains(l, "KUBE-") && !strings.Contains(l, "KUBE-FIREWALL")) {
				out = append(out, bin+": "+l)
			}
		}
	}
	b, err := w.c.Exec(ctx, proxytest.Node1, "nft", "list", "tables")
	if err != nil {
		return err.Error()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "kube-proxy") || strings.Contains(l, "kproxy") {
			out = append(out, "nft: "+l)
		}
	}
	return strings.Join(out, "\n")
}

// load creates the scenarios' Services and slices through the API.
func (w *world) load(ctx context.Context, scs []*proxytest.Scenario) {
	w.t.Helper()
	for _, sc := range scs {
		for _, svc := range sc.Services {
			// A Service of the previous batch with the same addresses may
			// still hold them for a moment after its deletion.
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := w.env.Writer.CreateService(ctx, svc)
				if err == nil {
					break
				}
				if time.Now().After(deadline) || apierrors.IsAlreadyExists(err) || ctx.Err() != nil {
					w.t.Fatalf("seed %d: %v", sc.Seed, err)
				}
				if !strings.Contains(err.Error(), "allocated") {
					w.t.Fatalf("seed %d: the API server refused a generated Service: %v", sc.Seed, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		if err := w.env.Writer.ApplySlices(ctx, sc.Slices...); err != nil {
			w.t.Fatalf("seed %d: the API server refused a generated EndpointSlice: %v", sc.Seed, err)
		}
	}
}

func (w *world) unload(ctx context.Context, scs []*proxytest.Scenario) {
	w.t.Helper()
	for _, sc := range scs {
		for _, svc := range sc.Services {
			if err := w.env.Writer.DeleteService(ctx, svc); err != nil {
				w.t.Fatal(err)
			}
		}
	}
}

// seeds returns the seeds to run: -differential.seeds, or
// -differential.fresh fresh ones, or fixedSeeds.
func seeds(t *testing.T) []uint64 {
	t.Helper()
	var out []uint64
	switch {
	case *seedsFlag != "":
		for _, s := range strings.Split(*seedsFlag, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				t.Fatalf("-differential.seeds: %v", err)
			}
			out = append(out, n)
		}
	case *freshFlag > 0:
		for len(out) < *freshFlag {
			var b [4]byte
			if _, err := rand.Read(b[:]); err != nil {
				t.Fatal(err)
			}
			out = append(out, uint64(binary.BigEndian.Uint32(b[:])))
		}
	default:
		out = fixedSeeds
	}
	seen := map[uint64]bool{}
	var uniq []uint64
	for _, s := range out {
		if !seen[s] {
			seen[s] = true
			uniq = append(uniq, s)
		}
	}
	return uniq
}

// TestRandomDifferential is issue 27's randomized differential: random
// Services and EndpointSlices (proxytest.RandomScenario) through the
// integration suite's API server, run by upstream kube-proxy v1.37.2 and
// by kproxy in node1, one at a time, in each mode (both proxies in the
// same mode), every frontend probed from a pod, the node, the outside
// client and a pod on the other node (Plan). The outcomes (endpoints
// reached and the source they saw, refusals and how, timeouts) must be
// the same, or the difference must match a documented entry of
// intentionalDifferences. A failing seed prints its differing probes and
// its manifests, and how to run it alone.
func TestRandomDifferential(t *testing.T) {
	all := seeds(t)
	modes := strings.Split(*modesFlag, ",")
	batch := min(max(*batchFlag, 1), proxytest.RandomSlots)
	w := newWorld(t)
	top := w.c.Topology
	t.Logf("seeds (%d): %s; modes %s", len(all), joinSeeds(all), strings.Join(modes, ","))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var results []seedResult
	for start := 0; start < len(all); start += batch {
		var scs []*proxytest.Scenario
		var probes []Probe
		for i, seed := range all[start:min(start+batch, len(all))] {
			sc, err := top.RandomScenario(seed, proxytest.SlotIndex(i))
			if err != nil {
				t.Fatal(err)
			}
			scs = append(scs, sc)
			probes = append(probes, Plan(top, sc)...)
		}
		w.load(ctx, scs)
		var loaded []*discovery.EndpointSlice
		for _, sc := range scs {
			loaded = append(loaded, sc.Slices...)
		}
		up, kx := map[string]map[string]Result{}, map[string]map[string]Result{}
		for _, mode := range modes {
			up[mode] = w.run(ctx, w.kubeProxy, "kube-proxy", mode, probes)
			kx[mode] = w.run(ctx, kproxyBin, "kproxy", mode, probes)
			checkHarness(t, mode, up[mode], kx[mode])
		}
		// A second look, with both proxies again, at the probes whose
		// outcomes differ (and no documented difference explains): a rare
		// answer among timeouts, or an ICMP error lost once, is not a
		// difference; only what both looks show is reported.
		for _, mode := range modes {
			var again []Probe
			for _, sc := range scs {
				for _, d := range Compare(mode, sc, loaded, probes, up, kx[mode]) {
					if d.Intended == nil {
						p := d.Probe
						p.Thorough = true
						again = append(again, p)
					}
				}
			}
			if len(again) == 0 {
				continue
			}
			t.Logf("%s: %d probes differ: probing them again, thoroughly, under each proxy", mode, len(again))
			up2 := w.run(ctx, w.kubeProxy, "kube-proxy", mode, again)
			kx2 := w.run(ctx, kproxyBin, "kproxy", mode, again)
			checkHarness(t, mode, up2, kx2)
			for _, p := range again {
				first := fmt.Sprintf("kube-proxy %s, kproxy %s", up[mode][p.Key()].Outcome(), kx[mode][p.Key()].Outcome())
				up[mode][p.Key()], kx[mode][p.Key()] = up2[p.Key()], kx2[p.Key()]
				if Same(up2[p.Key()], kx2[p.Key()]) {
					t.Logf("%s: %s: the same on the second look (first: %s)", mode, p, first)
				}
			}
		}
		for _, mode := range modes {
			for _, sc := range scs {
				results = append(results, seedResult{sc: sc, mode: mode, diffs: Compare(mode, sc, loaded, probes, up, kx[mode]),
					batch: all[start:min(start+batch, len(all))]})
			}
		}
		w.unload(ctx, scs)
	}

	classes := map[string][]uint64{}
	var failed []string
	intended := map[string]int{}
	for _, r := range results {
		var bad []Diff
		for _, d := range r.diffs {
			if d.Intended != nil {
				intended[d.Intended.Name]++
				continue
			}
			bad = append(bad, d)
			classes[d.Class(top)] = appendSeed(classes[d.Class(top)], r.sc.Seed)
		}
		t.Run(fmt.Sprintf("%s/seed-%d", r.mode, r.sc.Seed), func(t *testing.T) {
			for _, d := range r.diffs {
				switch {
				case d.Intended == nil:
				case d.Intended.Pending():
					t.Logf("pending difference %q (%s): %s: kube-proxy %s, kproxy %s", d.Intended.Name, d.Intended.Reason,
						d.Probe, d.Upstream.Outcome(), d.Kproxy.Outcome())
				default:
					t.Logf("documented difference %q: %s", d.Intended.Name, d.Probe)
				}
			}
			if len(bad) == 0 {
				return
			}
			failed = append(failed, fmt.Sprintf("%d/%s", r.sc.Seed, r.mode))
			var b strings.Builder
			fmt.Fprintf(&b, "seed %d, %s mode: %d probes answered differently by kproxy and upstream kube-proxy v1.37.2 (not documented differences):\n",
				r.sc.Seed, r.mode, len(bad))
			for _, d := range bad {
				b.WriteString("  " + d.String() + "\n")
			}
			b.WriteString("the scenario:\n  " + strings.Join(r.sc.Summary, "\n  ") + "\n")
			fmt.Fprintf(&b, "run it alone: make test-differential SEED=%d MODE=%s (addresses then start at index %d); "+
				"with %s=DIR the proxies' logs and rules (after probing) stay in DIR\n",
				r.sc.Seed, r.mode, proxytest.SlotIndex(0), logDirEnv)
			if len(r.batch) > 1 {
				// The proxies had the other scenarios of the batch too (a
				// pod is this node's endpoint if any of them says so).
				fmt.Fprintf(&b, "with the scenarios loaded with it: make test-differential SEED=%s MODE=%s\n", joinSeeds(r.batch), r.mode)
			}
			if m, err := proxytest.Manifest(r.sc.Objects()...); err == nil {
				b.WriteString("manifests:\n" + string(m))
			}
			t.Error(b.String())
		})
	}
	summary := summarize(all, modes, results, classes, intended, failed)
	t.Log(summary)
	if *reportFlag != "" {
		if err := os.WriteFile(*reportFlag, []byte(summary), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// seedResult is one seed's comparison in one mode.
type seedResult struct {
	sc    *proxytest.Scenario
	mode  string
	diffs []Diff
	// batch are the seeds loaded with it (itself included), in order.
	batch []uint64
}

func appendSeed(list []uint64, s uint64) []uint64 {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

func joinSeeds(s []uint64) string {
	var out []string
	for _, x := range s {
		out = append(out, strconv.FormatUint(x, 10))
	}
	return strings.Join(out, ",")
}

// checkHarness fails the test when a run cannot be trusted: an attempt
// that failed for the harness's own reasons, or a run with no answer at
// all (the topology or the echo servers are broken, not the proxy).
func checkHarness(t *testing.T, mode string, runs ...map[string]Result) {
	t.Helper()
	for i, res := range runs {
		who := []string{"kube-proxy", "kproxy"}[i]
		answers := 0
		for _, r := range res {
			for _, a := range r.Attempts {
				switch a.Kind {
				case Answer:
					answers++
				case Error:
					t.Errorf("%s (%s): %s: harness error: %s", who, mode, r.Probe, a.Detail)
				}
			}
		}
		if answers == 0 && len(res) > 0 {
			t.Errorf("%s (%s): no probe was answered at all", who, mode)
		}
	}
}

// summarize renders the run: seeds, modes, how many probes differed, and
// the classes of undocumented differences with their seeds.
func summarize(all []uint64, modes []string, results []seedResult, classes map[string][]uint64, intended map[string]int, failed []string) string {
	var b strings.Builder
	probes, differ, explained := 0, 0, 0
	for _, r := range results {
		probes += len(Plan(proxytest.Default(), r.sc))
		differ += len(r.diffs)
	}
	for _, n := range intended {
		explained += n
	}
	fmt.Fprintf(&b, "randomized differential: %d seeds × %d modes (%s), %d probes compared, %d differed, %d of them as documented\n",
		len(all), len(modes), strings.Join(modes, ","), probes, differ, explained)
	for _, d := range IntentionalDifferences() {
		what := "documented"
		if d.Pending() {
			what = "pending"
		}
		fmt.Fprintf(&b, "  %s %q: %d probes\n", what, d.Name, intended[d.Name])
	}
	fmt.Fprintf(&b, "seeds: %s\n", joinSeeds(all))
	if len(failed) > 0 {
		fmt.Fprintf(&b, "seeds with undocumented differences (%d): %s\n", len(failed), strings.Join(failed, " "))
	}
	keys := make([]string, 0, len(classes))
	for k := range classes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if len(classes[keys[i]]) != len(classes[keys[j]]) {
			return len(classes[keys[i]]) > len(classes[keys[j]])
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		fmt.Fprintf(&b, "  %d seeds (%s): %s\n", len(classes[k]), joinSeeds(classes[k]), k)
	}
	return b.String()
}
