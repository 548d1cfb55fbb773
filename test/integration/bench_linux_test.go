package integration

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

var (
	benchServices        = flag.String("cluster-bench-services", "1000", "comma-separated Service counts for BenchmarkCluster")
	benchFlavours        = flag.String("cluster-bench-flavours", "legacy,nft", "iptables flavours for BenchmarkCluster's iptables mode")
	benchModes           = flag.String("cluster-bench-modes", "iptables", "proxy modes for BenchmarkCluster: iptables (once per flavour), nftables")
	benchDataPlane       = flag.Int("cluster-bench-connections", 2000, "new TCP connections of each data-plane round, to each target (0: none)")
	benchDataPlaneRounds = flag.Int("cluster-bench-rounds", 5, "data-plane rounds, each alternating connections through the ClusterIP and straight to the pod; the median round's rate is reported")
	benchEndpoints       = flag.Int("cluster-bench-endpoints", 10, "endpoints per Service for BenchmarkCluster")
	benchChanges         = flag.Int("cluster-bench-changes", 5, "one-endpoint changes measured, each once kproxy is idle (median and p99 reported)")
	benchWriters         = flag.Int("cluster-bench-writers", 16, "parallel client-go writers loading the Services")
	benchProfiles        = flag.String("cluster-bench-profiles", "", "directory for kproxy's heap profiles (after programming, at the end); empty: none")
	benchStartCPU        = flag.Duration("cluster-bench-start-cpu", 3*time.Second, "with -cluster-bench-profiles: the length of the proxy's CPU profile of its start, taken from the first moment its metrics server answers (at most 4s)")
	benchLoader          = flag.String("cluster-bench-loader", "api", "how the Services are loaded: api (client-go writers) or etcd (put into storage, for 50,000 and more; see loadStorage)")
)

// benchVerbosity is kproxy's -v in the benchmark (2 logs every sync, and
// the steps of the start: for a timeline, with KPROXY_INTEGRATION_LOGS).
var benchVerbosity = flag.String("cluster-bench-v", "1", "kproxy's -v in the benchmark")

// benchNamespace holds the loaded Services; the probe Service is in default.
const benchNamespace = "bench"

// BenchmarkCluster measures kproxy against the real control plane, the way
// upstream kube-proxy's numbers in docs/benchmarks.md were taken. For each
// size (-cluster-bench-services) it loads N ClusterIP Services (one TCP
// port) with E endpoints each (-cluster-bench-endpoints) through the API,
// with parallel writers, plus one probe Service whose endpoint is a real
// pod; then, for each iptables flavour (-cluster-bench-flavours; the first
// on node1, the second on node2, both fresh namespaces seeded with a host
// firewall in that flavour), it starts kproxy and measures:
//
//   - start→programmed: from starting the process until the end of the
//     first sync that put every Service in the kernel (kproxy's own
//     kubeproxy_sync_proxy_rules_last_timestamp_seconds, checked against
//     iptables-save);
//   - change (kernel): one endpoint of one loaded Service replaced, as the
//     network programming latency sample it produces (trigger time to the
//     end of the sync that wrote it); median of 5, each once kproxy is idle;
//   - change (traffic): the probe Service's endpoint moved to another pod,
//     from the write until a new connection reaches the new pod; median of 3;
//   - RSS after programming and at the end, the peak (VmHWM), the Go heap
//     in use and the live heap after the last collection (gctrace);
//   - churn (-cluster-bench-churn-rate > 0): that many EndpointSlice updates
//     a second for -cluster-bench-churn-seconds, each one endpoint of
//     another Service replaced, write → kernel per update by nft monitor
//     (p50, p99, max) and the proxy's CPU in cores (see churn);
//   - the rules and chains kproxy owns in the IPv4 nat and filter tables;
//   - the data plane: rounds (-cluster-bench-rounds) of new TCP connections
//     from a client pod, alternating one through the probe Service's
//     ClusterIP and one straight to its pod (-cluster-bench-connections of
//     each per round): the median round's rates, connect p50/p99, and the
//     median of the rounds' ratio of the two. In the iptables runs the
//     seeded host gets a CNI's two pod-CIDR accept rules in FORWARD, or
//     the direct connections would be dropped by its policy.
//
// Run it with make bench-cluster (as root). Each flavour logs one Markdown
// row: Services | flavour | start→programmed (first full sync) | change
// (kernel) | change (traffic) | RSS programmed / end / peak (heap) | rules /
// chains | API load time | load average at kproxy's start → at its end.
func BenchmarkCluster(b *testing.B) {
	var sizes []int
	for _, s := range strings.Split(*benchServices, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("-cluster-bench-services: bad size %q", s)
		}
		sizes = append(sizes, n)
	}
	// The variants: an iptables flavour ("legacy", "nft") or the nftables
	// mode ("nftables"). They take node1 and node2 in turn; a node used
	// again is cleaned up first (kproxy --cleanup, host firewall reset).
	var flavours, variants []string
	for _, m := range strings.Split(*benchModes, ",") {
		switch strings.TrimSpace(m) {
		case "iptables":
			for _, f := range strings.Split(*benchFlavours, ",") {
				flavours = append(flavours, strings.TrimSpace(f))
			}
			variants = append(variants, flavours...)
		case "nftables":
			variants = append(variants, "nftables")
		case "kube-proxy-iptables", "kube-proxy-nftables":
			// Upstream kube-proxy v1.37.2 (built by make controlplane)
			// on the same API server, for the side-by-side numbers.
			variants = append(variants, strings.TrimSpace(m))
			if m == "kube-proxy-iptables" && !slices.Contains(flavours, "nft") {
				flavours = append(flavours, "nft")
			}
		default:
			b.Fatalf("-cluster-bench-modes: %q is none of iptables, nftables, kube-proxy-iptables, kube-proxy-nftables", m)
		}
	}
	if *benchLoader != "api" && *benchLoader != "etcd" {
		b.Fatalf("-cluster-bench-loader: %q is neither api nor etcd", *benchLoader)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			bins := requireBench(b, flavours, slices.ContainsFunc(variants, func(v string) bool { return strings.HasSuffix(v, "nftables") }))
			top := proxytest.Default()
			if *benchLoader == "etcd" {
				// Room for 100,000 ClusterIPs and more.
				top.ServiceCIDR4 = netip.MustParsePrefix("10.96.0.0/12")
			}
			c := netns.New(b, netns.Options{EchoBinary: echoBin, Topology: top})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
			defer cancel()
			ie, err := Start(ctx, Options{Cluster: c, Binaries: bins, QPS: 5000, Burst: 5000, Logf: b.Logf})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if err := ie.Close(); err != nil {
					b.Errorf("stopping the control plane: %v", err)
				}
			})
			w := &benchWorld{b: b, Env: ie, n: n, eps: *benchEndpoints, kubeProxy: bins.KubeProxy}
			if slices.ContainsFunc(variants, func(v string) bool { return strings.HasPrefix(v, "kube-proxy-") }) {
				if bins.KubeProxy == "" {
					b.Fatal("upstream kube-proxy is not built: run make controlplane")
				}
				if err := ie.GrantServiceCIDRs(ctx); err != nil {
					b.Fatal(err)
				}
			}
			w.load(ctx)
			used := map[string]bool{}
			for i, variant := range variants {
				host := c.Topology.Nodes[i%2].Name
				b.Run(variant, func(b *testing.B) {
					w.b = b
					if used[host] {
						w.resetNode(ctx, host)
					}
					used[host] = true
					w.measure(ctx, host, variant)
				})
			}
		})
	}
}

// requireBench is requireIntegration for the flavours (and nft) benchmarked.
func requireBench(b *testing.B, flavours []string, nft bool) controlplane.Binaries {
	b.Helper()
	var tools []string
	if nft {
		tools = append(tools, "nft")
	}
	for _, f := range flavours {
		f = strings.TrimSpace(f)
		if f != "legacy" && f != "nft" {
			b.Fatalf("-cluster-bench-flavours: %q is neither legacy nor nft", f)
		}
		tools = append(tools, "iptables-"+f, "ip6tables-"+f, "iptables-"+f+"-save")
	}
	netns.Require(b, tools...)
	if kproxyBuildErr != nil {
		skipOrFail(b, fmt.Sprintf("building kproxy: %v", kproxyBuildErr))
	}
	return controlPlaneBinaries(b)
}

// benchWorld is one size's loaded cluster.
type benchWorld struct {
	b *testing.B
	*Env
	n, eps int
	probe  *v1.Service
	// loadTook is how long loading the Services and slices took.
	loadTook time.Duration
	// changed counts the endpoint changes made, for fresh addresses.
	changed int
	// kubeProxy is upstream kube-proxy's binary (the kube-proxy-* variants).
	kubeProxy string
}

// benchEndpoint is the address of endpoint k (10.128.0.0/9, as the backend's
// kernel benchmark uses; nothing answers there).
func benchEndpoint(k int) string {
	return netip.AddrFrom4([4]byte{10, byte(128 + k>>16), byte(k >> 8), byte(k)}).String()
}

func benchService(i int) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: benchNamespace},
		Spec: v1.ServiceSpec{
			Type:     v1.ServiceTypeClusterIP,
			Selector: map[string]string{"app": fmt.Sprintf("svc-%05d", i)},
			Ports:    []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// benchSlice is Service i's IPv4 slice with eps endpoints starting at
// address index first.
func benchSlice(svc *v1.Service, first, eps int) *discovery.EndpointSlice {
	name, proto, port := "http", v1.ProtocolTCP, int32(8080)
	ready := true
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc.Name + "-ipv4", Namespace: svc.Namespace},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for k := first; k < first+eps; k++ {
		node := "node-elsewhere" // remote on every node kproxy runs on
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{benchEndpoint(k)},
			Conditions: discovery.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		})
	}
	return s
}

// load creates the namespace, the N Services and their slices with
// parallel writers, and the probe Service.
func (w *benchWorld) load(ctx context.Context) {
	b := w.b
	if _, err := w.Admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if *benchLoader == "etcd" {
		probe, err := w.Writer.CreateService(ctx, w.Cluster.Topology.Service("probe", 98))
		if err != nil {
			b.Fatal(err)
		}
		w.probe = probe
		w.loadStorage(ctx, w.Cluster.Topology.ServiceCIDR4)
		return
	}
	begin := time.Now()
	load0 := loadAvg()
	var next atomic.Int64
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range *benchWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= w.n || ctx.Err() != nil {
					return
				}
				svc, err := w.Admin.CoreV1().Services(benchNamespace).Create(ctx, benchService(i), metav1.CreateOptions{})
				if err == nil {
					slice := benchSlice(svc, i*w.eps, w.eps)
					AsController(svc, time.Now(), slice)
					_, err = w.Admin.DiscoveryV1().EndpointSlices(benchNamespace).Create(ctx, slice, metav1.CreateOptions{})
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("service %d: %w", i, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	took := time.Since(begin)
	w.loadTook = took
	probe, err := w.Writer.CreateService(ctx, w.Cluster.Topology.Service("probe", 98))
	if err != nil {
		b.Fatal(err)
	}
	w.probe = probe
	b.Logf("loaded %d Services × %d endpoints (%d objects) through the API in %v (%.0f objects/s, %d writers; load average %s → %s)",
		w.n, w.eps, 2*w.n, took.Round(100*time.Millisecond), float64(2*w.n)/took.Seconds(), *benchWriters, load0, loadAvg())
	b.ReportMetric(took.Seconds(), "load-s")
}

// measure runs kproxy on host with one flavour and reports its numbers.
func (w *benchWorld) measure(ctx context.Context, host, flavour string) {
	b := w.b
	c := w.Cluster
	// The probe Service's endpoint moves between two pods of kproxy's node
	// (the other node's host firewall, seeded for the other flavour, drops
	// forwarded traffic kproxy did not DNAT there).
	pods := c.Topology.PodsOn(host)
	client := pods[len(pods)-1].Name // client-1 / client-2
	near, far := pods[0].Name, pods[1].Name
	if _, err := w.Writer.SetEndpoints(ctx, w.probe, proxytest.Ready(near)...); err != nil {
		b.Fatal(err)
	}
	// flavour is the variant: an iptables flavour, "nftables", or
	// "kube-proxy-<mode>" (upstream, iptables on iptables-nft).
	binary := kproxyBin
	upstreamMode, upstream := strings.CutPrefix(flavour, "kube-proxy-")
	if upstream {
		binary = w.kubeProxy
	}
	nftables := flavour == "nftables" || upstreamMode == "nftables"
	tables := flavour
	if upstreamMode == "iptables" {
		tables = "nft"
	}
	if !nftables {
		if err := SeedFlavour(ctx, c, host, tables); err != nil {
			b.Fatal(err)
		}
		// The seeded host drops what it forwards unless a rule accepts
		// it: a proxy accepts what it DNATs, and a CNI plugin on such a
		// host accepts pod traffic (flannel appends these two rules). The
		// data plane's direct connections need them; without them they
		// time out in the iptables runs.
		for _, dir := range []string{"-s", "-d"} {
			if out, err := c.Exec(ctx, host, "iptables-"+tables, "-w", "-A", "FORWARD", dir, c.Topology.ClusterCIDR4.String(), "-j", "ACCEPT"); err != nil {
				b.Fatalf("pod forwarding on %s: %v: %s", host, err, out)
			}
		}
	}
	logDir := os.Getenv(LogDirEnv)
	if logDir == "" {
		logDir = b.TempDir()
	}
	args := []string{"--cluster-cidr", c.Topology.ClusterCIDR4.String() + "," + c.Topology.ClusterCIDR6.String(), "-v", *benchVerbosity}
	if *benchProfiles != "" {
		args = append(args, "--profiling")
	}
	switch {
	case upstream:
		args = append(args, "--proxy-mode", upstreamMode)
	case nftables:
		args = append(args, "--proxy-mode", "nftables")
	}
	p := w.Proxy(binary, host, logDir, args...)
	// kproxy inherits the environment: gctrace=1 makes its runtime print
	// the live heap after every collection (read back below).
	b.Setenv("GODEBUG", "gctrace=1")
	load0 := loadAvg()
	begin := time.Now()
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Stop(30 * time.Second) })
	pid := p.Process().Pid()
	startProfiled := w.saveStartCPUProfile(ctx, host, flavour)

	// Start → programmed: wait for a sync after which iptables-save holds
	// every Service; its end is kproxy's last-sync timestamp.
	var programmed time.Time
	var rules, chains int
	deadline := time.Now().Add(30 * time.Minute)
	for programmed.IsZero() {
		if time.Now().After(deadline) {
			b.Fatalf("kproxy did not program %d Services within 30 minutes", w.n)
		}
		if !p.Running() {
			b.Fatalf("kproxy exited: %v\n%s", p.Process().Err(), e2e.LastLines(p.Process().Output(), 30))
		}
		time.Sleep(200 * time.Millisecond)
		m, err := w.Scrape(ctx, host)
		if err != nil {
			continue // not serving yet
		}
		ts, ok := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv4")
		if !ok || ts == 0 {
			continue
		}
		if nftables {
			got, err := nftFrontends(ctx, c, host, upstream)
			if err != nil {
				b.Fatal(err)
			}
			if got < w.n {
				b.Logf("a sync programmed %d of %d Services; waiting", got, w.n)
				continue
			}
			ts6, _ := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv6")
			programmed = time.Unix(0, int64(max(ts, ts6)*1e9))
			if !upstream {
				el, _ := m.Get("kproxy_nftables_objects", "ip_family", "IPv4", "kind", "elements")
				ch, _ := m.Get("kproxy_nftables_objects", "ip_family", "IPv4", "kind", "chains")
				rules, chains = int(el), int(ch)
			}
			break
		}
		nat, err := Save(ctx, c, host, v1.IPv4Protocol, tables, "nat")
		if err != nil {
			b.Fatal(err)
		}
		if got := countServices(nat); got < w.n {
			b.Logf("a sync programmed %d of %d Services; waiting", got, w.n)
			continue
		}
		// Take the end of the sync that covered both families.
		ts6, _ := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv6")
		programmed = time.Unix(0, int64(max(ts, ts6)*1e9))
		filter, err := Save(ctx, c, host, v1.IPv4Protocol, tables, "filter")
		if err != nil {
			b.Fatal(err)
		}
		rules, chains = countOwned(nat + filter)
	}
	startTook := programmed.Sub(begin)
	memProgrammed, err := ProcMemory(pid)
	if err != nil {
		b.Fatal(err)
	}
	startProfiled()
	w.saveHeapProfile(ctx, host, flavour, "programmed")
	m, _ := w.Scrape(ctx, host)
	_, firstSync := m.Histogram("kubeproxy_sync_full_proxy_rules_duration_seconds", "ip_family", "IPv4")

	// The probe Service answers from the pod next to kproxy.
	w.awaitProbe(ctx, client, near, 30*time.Second)

	// Changes, each once kproxy is idle (no pending change, no sync for a
	// while, so neither a sync in progress nor minSyncPeriod delays them):
	// one endpoint of a loaded Service replaced, as the programming latency
	// kproxy records; then the probe Service's endpoint moved, until a new
	// connection reaches the new pod.
	const trafficRuns = 3
	var kernel, traffic []time.Duration
	for range max(*benchChanges, 1) {
		w.awaitIdle(ctx, host)
		kernel = append(kernel, w.changeOneEndpoint(ctx, host))
	}
	if *benchChurnRate > 0 {
		if flavour == "legacy" {
			b.Logf("churn: skipped for iptables-legacy (nft monitor does not see it)")
		} else {
			w.awaitIdle(ctx, host)
			r := w.churn(ctx, host, pid, *benchChurnRate, time.Duration(*benchChurnSeconds)*time.Second)
			b.Logf("churn: %v", r)
			b.ReportMetric(float64(r.p50.Microseconds())/1000, "churn-p50-ms")
			b.ReportMetric(float64(r.p99.Microseconds())/1000, "churn-p99-ms")
			b.ReportMetric(r.cpu, "churn-cores")
		}
	}
	targets := []string{far, near}
	for i := range trafficRuns {
		w.awaitIdle(ctx, host)
		t0 := time.Now()
		if _, err := w.Writer.SetEndpoints(ctx, w.probe, proxytest.Ready(targets[i%2])...); err != nil {
			b.Fatal(err)
		}
		w.awaitProbe(ctx, client, targets[i%2], 5*time.Minute)
		traffic = append(traffic, time.Since(t0))
	}

	// The data plane: new TCP connections from the client pod through the
	// probe Service's ClusterIP, and straight to its pod.
	// Rounds alternate the two, so that a slow moment of the machine (the
	// API server compacting, a collection) weighs on both alike; each
	// reports the median round's rate and the latencies of all rounds.
	var dp dataPlane
	if *benchDataPlane > 0 {
		w.awaitIdle(ctx, host)
		pod, _ := c.Topology.Host(targets[(trafficRuns-1)%2])
		dp = w.dataPlane(ctx, client, clusterIP(w.probe, v1.IPv4Protocol), netip.AddrPortFrom(pod.IPv4, proxytest.EchoPort),
			*benchDataPlane, *benchDataPlaneRounds)
		b.ReportMetric(dp.service.rate, "svc-conn/s")
		b.ReportMetric(dp.direct.rate, "pod-conn/s")
		b.ReportMetric(dp.ratio, "svc/pod")
		b.Logf("data plane: %d rounds of %d connections through the ClusterIP, alternating with as many straight to the pod: median %.0f/s (rounds %s), connect p50 %v p99 %v; straight to the pod: median %.0f/s (rounds %s), p50 %v p99 %v; ClusterIP/direct, median of rounds: %.3f",
			*benchDataPlaneRounds, *benchDataPlane, dp.service.rate, rates(dp.service.rounds), dp.service.p50, dp.service.p99,
			dp.direct.rate, rates(dp.direct.rounds), dp.direct.p50, dp.direct.p99, dp.ratio)
	}

	memEnd, err := ProcMemory(pid)
	if err != nil {
		b.Fatal(err)
	}
	heap := "?"
	if m, err := w.Scrape(ctx, host); err == nil {
		if v, ok := m.Get("go_memstats_heap_inuse_bytes"); ok {
			heap = MiB(int64(v))
		}
	}
	w.saveHeapProfile(ctx, host, flavour, "end")
	load1 := loadAvg()
	if err := p.Stop(30 * time.Second); err != nil {
		b.Errorf("stopping kproxy: %v", err)
	}
	live := "?"
	if l, ok := lastLiveHeap(p.Process().Output()); ok {
		live = strconv.Itoa(l)
	}

	kernelChange, trafficChange := median(kernel), median(traffic)
	b.ReportMetric(startTook.Seconds(), "start-s")
	b.ReportMetric(float64(kernelChange.Microseconds())/1000, "change-ms")
	b.ReportMetric(float64(percentile(kernel, 0.99).Microseconds())/1000, "change-p99-ms")
	b.ReportMetric(float64(trafficChange.Microseconds())/1000, "traffic-ms")
	b.ReportMetric(float64(memEnd.HWM)/(1<<20), "peak-MiB")
	b.ReportMetric(float64(rules), "rules")
	b.Logf("changes (kernel): %v; changes (traffic): %v", kernel, traffic)
	b.Logf("| %s | %s | %s (first full sync %s) | %s (p99 %s, max %s; %d changes) | %s | %s / %s / %s MiB (heap in use %s MiB, live %s MB) | %d / %d | %s | %s → %s |",
		fmtCount(w.n), flavour, round(startTook), round(time.Duration(firstSync*float64(time.Second))),
		round(kernelChange), round(percentile(kernel, 0.99)), round(slices.Max(kernel)), len(kernel), round(trafficChange),
		MiB(memProgrammed.RSS), MiB(memEnd.RSS), MiB(memEnd.HWM), heap, live, rules, chains,
		round(w.loadTook), load0, load1)
}

// nftFrontends counts the bench Services' ClusterIPs in kproxy's IPv4
// dispatch map.
func nftFrontends(ctx context.Context, c *netns.Cluster, host string, upstream bool) (int, error) {
	table, m := "kproxy", "frontends"
	if upstream {
		table, m = "kube-proxy", "service-ips"
	}
	out, err := c.Exec(ctx, host, "nft", "list", "map", "ip", table, m)
	if err != nil {
		return 0, nil // not there yet
	}
	return strings.Count(string(out), " . tcp . 80 :"), nil
}

// resetNode makes a node kproxy ran on fresh again: kproxy --cleanup of
// every mode, and the host firewall's FORWARD policy back to ACCEPT.
func (w *benchWorld) resetNode(ctx context.Context, host string) {
	p := w.Proxy(kproxyBin, host, w.b.TempDir())
	if out, err := p.Cleanup(ctx); err != nil {
		w.b.Fatalf("kproxy --cleanup on %s: %v\n%s", host, err, out)
	}
	for _, bin := range []string{"iptables-legacy", "ip6tables-legacy", "iptables-nft", "ip6tables-nft"} {
		for _, args := range [][]string{{"-w", "-P", "FORWARD", "ACCEPT"}, {"-w", "-F", "INPUT"}, {"-w", "-F", "FORWARD"}} {
			_, _ = w.Cluster.Exec(ctx, host, append([]string{bin}, args...)...)
		}
	}
}

// connStats are one data-plane measurement: the median round's rate,
// each round's, and the connect latencies of all rounds.
type connStats struct {
	rate     float64 // connections per second
	rounds   []float64
	p50, p99 time.Duration
}

// dataPlane is both measurements; ratio is the median of the rounds'
// ClusterIP rate over their direct one (the cost of the proxy, with what
// the machine was doing at the time divided out).
type dataPlane struct {
	service, direct connStats
	ratio           float64
}

// dataPlane runs rounds of n connections from client through service
// and n straight to direct, alternating one by one (so that a slow moment
// of the machine, the API server compacting or a collection, weighs on
// both alike), and summarizes each: the median round's rate and the
// connect latencies of all rounds. A rate is connections over the time
// their dials and closes took.
func (w *benchWorld) dataPlane(ctx context.Context, client string, service, direct netip.AddrPort, n, rounds int) dataPlane {
	ns, err := w.Cluster.MustNS(client)
	if err != nil {
		w.b.Fatal(err)
	}
	var dp dataPlane
	var sLat, dLat []time.Duration
	if err := ns.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		one := func(addr netip.AddrPort) (took, connect time.Duration, err error) {
			t0 := time.Now()
			conn, err := d.DialContext(ctx, "tcp", addr.String())
			if err != nil {
				return 0, 0, fmt.Errorf("connecting to %s from %s: %w", addr, client, err)
			}
			connect = time.Since(t0)
			_ = conn.Close()
			return time.Since(t0), connect, nil
		}
		for range max(rounds, 1) {
			var sTook, dTook time.Duration
			for range n {
				took, lat, err := one(service)
				if err != nil {
					return err
				}
				sTook, sLat = sTook+took, append(sLat, lat)
				if took, lat, err = one(direct); err != nil {
					return err
				}
				dTook, dLat = dTook+took, append(dLat, lat)
			}
			dp.service.rounds = append(dp.service.rounds, float64(n)/sTook.Seconds())
			dp.direct.rounds = append(dp.direct.rounds, float64(n)/dTook.Seconds())
		}
		return nil
	}); err != nil {
		w.b.Fatal(err)
	}
	summarize := func(c *connStats, lat []time.Duration) {
		r := slices.Sorted(slices.Values(c.rounds))
		c.rate = r[len(r)/2]
		slices.Sort(lat)
		c.p50, c.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	summarize(&dp.service, sLat)
	summarize(&dp.direct, dLat)
	var ratios []float64
	for i := range dp.service.rounds {
		ratios = append(ratios, dp.service.rounds[i]/dp.direct.rounds[i])
	}
	slices.Sort(ratios)
	dp.ratio = ratios[len(ratios)/2]
	return dp
}

// rates renders round rates as "5012, 4990, ...".
func rates(rs []float64) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, strconv.FormatFloat(r, 'f', 0, 64))
	}
	return strings.Join(parts, ", ")
}

// saveHeapProfile stores kproxy's heap profile (go tool pprof reads it)
// in -cluster-bench-profiles, when given.
func (w *benchWorld) saveHeapProfile(ctx context.Context, host, flavour, stage string) {
	if *benchProfiles == "" {
		return
	}
	code, body, err := w.Get(ctx, host, "http://"+MetricsAddr+"/debug/pprof/heap")
	if err != nil || code != http.StatusOK {
		w.b.Errorf("heap profile %s: status %d, %v", stage, code, err)
		return
	}
	name := filepath.Join(*benchProfiles, fmt.Sprintf("heap-%d-%s-%s.pb.gz", w.n, flavour, stage))
	if err := os.WriteFile(name, body, 0o644); err != nil {
		w.b.Errorf("heap profile: %v", err)
		return
	}
	w.b.Logf("heap profile %s: %s", stage, name)
}

// saveStartCPUProfile profiles the proxy's start on host, in
// -cluster-bench-profiles when given: from the first moment its metrics
// server answers (asked every 10 ms), a CPU profile of
// -cluster-bench-start-cpu. The returned function waits for it.
func (w *benchWorld) saveStartCPUProfile(ctx context.Context, host, flavour string) (wait func()) {
	if *benchProfiles == "" {
		return func() {}
	}
	secs := int(min(max(*benchStartCPU, time.Second), 4*time.Second) / time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", MetricsAddr, secs)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			code, body, err := w.Get(ctx, host, url)
			if err != nil {
				continue // not serving yet
			}
			if code != http.StatusOK {
				w.b.Errorf("start CPU profile: status %d: %s", code, body)
				return
			}
			name := filepath.Join(*benchProfiles, fmt.Sprintf("cpu-%d-%s-start.pb.gz", w.n, flavour))
			if err := os.WriteFile(name, body, 0o644); err != nil {
				w.b.Errorf("start CPU profile: %v", err)
				return
			}
			w.b.Logf("CPU profile of the first %d s: %s", secs, name)
			return
		}
		w.b.Errorf("start CPU profile: the metrics server never answered")
	}()
	return func() { <-done }
}

// awaitIdle waits until kproxy on host has no pending change and has not
// synced for 2 s (bounded by 10 minutes).
func (w *benchWorld) awaitIdle(ctx context.Context, host string) {
	b := w.b
	deadline := time.Now().Add(10 * time.Minute)
	var last float64
	since := time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
		m, err := w.Scrape(ctx, host)
		if err != nil {
			continue
		}
		t4, _ := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv4")
		t6, _ := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv6")
		pe, _ := m.Get("kubeproxy_sync_proxy_rules_endpoint_changes_pending")
		ps, _ := m.Get("kubeproxy_sync_proxy_rules_service_changes_pending")
		if ts := max(t4, t6); ts != last || pe+ps > 0 {
			last, since = ts, time.Now()
			continue
		}
		if time.Since(since) >= 2*time.Second {
			return
		}
	}
	b.Fatalf("kproxy on %s never went idle within 10 minutes", host)
}

// percentile returns the smallest sample at or above fraction q of d
// (nearest rank: with fewer than 100 samples, p99 is the largest).
func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// changeOneEndpoint replaces one endpoint of the middle Service with a
// fresh address and returns the network programming latency kproxy
// recorded for it.
func (w *benchWorld) changeOneEndpoint(ctx context.Context, host string) time.Duration {
	b := w.b
	before, err := w.Scrape(ctx, host)
	if err != nil {
		b.Fatal(err)
	}
	c0, s0 := before.Histogram(programmingLatency)
	i := w.n / 2
	svc, err := w.Admin.CoreV1().Services(benchNamespace).Get(ctx, benchService(i).Name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	slice := benchSlice(svc, i*w.eps, w.eps)
	// As the EndpointSlice controller does: the slice it changes is in its
	// informer's cache (read here before the trigger time), and the change
	// is one update. The trigger time is taken just before that write, so
	// the sample holds one API round trip, the watch and kproxy's sync.
	api := w.Admin.DiscoveryV1().EndpointSlices(benchNamespace)
	cur, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w.changed++
	fresh := benchEndpoint(w.n*w.eps + w.changed) // never used before
	slice.Endpoints[0].Addresses = []string{fresh}
	AsController(svc, time.Now(), slice)
	slice.ResourceVersion = cur.ResourceVersion
	if _, err := api.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		m, err := w.Scrape(ctx, host)
		if err == nil {
			if c1, s1 := m.Histogram(programmingLatency); c1 > c0 {
				return time.Duration((s1 - s0) / (c1 - c0) * float64(time.Second))
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("no network programming latency sample within 5 minutes of the change")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitProbe makes new connections from client to the probe Service until
// one is answered by want, and returns how long that took.
func (w *benchWorld) awaitProbe(ctx context.Context, client, want string, limit time.Duration) time.Duration {
	begin := time.Now()
	addr := clusterIP(w.probe, v1.IPv4Protocol)
	var last echo.Result
	for time.Since(begin) < limit {
		last = w.Cluster.Probe(ctx, client, "tcp", addr, echo.ProbeOptions{Timeout: 200 * time.Millisecond})
		if last.Outcome == echo.Answer && last.Reply.Name == want {
			return time.Since(begin)
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.b.Fatalf("probe Service %s never answered from %s within %v: last %v", addr, want, limit, last)
	return 0
}

// gcTrace matches the heap sizes of a GODEBUG=gctrace=1 line: heap at
// the start of the cycle, at its end, and live (marked) heap, in MB.
var gcTrace = regexp.MustCompile(`(?m)^gc \d+ @.* (\d+)->(\d+)->(\d+) MB`)

// lastLiveHeap returns the live heap (MB) reported by the last garbage
// collection in a Go program's gctrace output.
func lastLiveHeap(out string) (int, bool) {
	m := gcTrace.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0, false
	}
	v, err := strconv.Atoi(m[len(m)-1][3])
	return v, err == nil
}

var (
	benchComment = regexp.MustCompile(`--comment "?` + benchNamespace + `/(svc-\d+):`)
	ownedRule    = regexp.MustCompile(`(?m)^-A KPROXY-`)
	ownedJump    = regexp.MustCompile(`(?m)^-A [A-Z]+ .*-j KPROXY-`)
	ownedChain   = regexp.MustCompile(`(?m)^:KPROXY-`)
)

// countServices counts the distinct loaded Services named in rule comments.
func countServices(save string) int {
	seen := map[string]bool{}
	for _, m := range benchComment.FindAllStringSubmatch(save, -1) {
		seen[m[1]] = true
	}
	return len(seen)
}

// countOwned counts kproxy's rules (in its chains, plus its jumps from
// built-in chains) and chains in iptables-save output.
func countOwned(save string) (rules, chains int) {
	rules = len(ownedRule.FindAllStringIndex(save, -1))
	for _, l := range ownedJump.FindAllString(save, -1) {
		if !strings.HasPrefix(l, "-A KPROXY-") {
			rules++
		}
	}
	return rules, len(ownedChain.FindAllStringIndex(save, -1))
}

// loadAvg returns the 1-minute load average.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func round(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(100 * time.Microsecond).String()
	}
}

func fmtCount(n int) string {
	s := strconv.Itoa(n)
	if len(s) > 3 {
		s = s[:len(s)-3] + "," + s[len(s)-3:]
	}
	return s
}

func TestBenchHelpers(t *testing.T) {
	out := "I1130 log line\ngc 1 @0.010s 2%: 0.01+1.1+0.01 ms clock, 0.02+0.1/0.5/0+0.02 ms cpu, 4->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n" +
		"gc 2 @5.001s 1%: 0.02+3+0.01 ms clock, 0.04+0.2/1/0+0.02 ms cpu, 180->181->95 MB, 190 MB goal, 0 MB stacks, 0 MB globals, 2 P\nI1130 more\n"
	if v, ok := lastLiveHeap(out); !ok || v != 95 {
		t.Errorf("lastLiveHeap = %d, %v; want 95", v, ok)
	}
	if _, ok := lastLiveHeap("no trace"); ok {
		t.Error("lastLiveHeap found a trace in none")
	}
	save := `:KPROXY-SERVICES - [0:0]
:KPROXY-SVC-AAAA - [0:0]
-A PREROUTING -m comment --comment "kproxy service portals" -j KPROXY-SERVICES
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KPROXY-SERVICES -d 10.96.0.5/32 -p tcp -m comment --comment "bench/svc-00001:http" -m tcp --dport 80 -j KPROXY-SVC-AAAA
-A KPROXY-SERVICES -d 10.96.0.6/32 -p tcp -m comment --comment bench/svc-00002:http -m tcp --dport 80 -j KPROXY-SVC-BBBB
-A KPROXY-SVC-AAAA -p tcp -j DNAT --to-destination 10.128.0.1:8080
-A KPROXY-SERVICES -d 10.96.0.7/32 -p tcp -m comment --comment "default/probe:tcp" -m tcp --dport 80 -j KPROXY-SVC-CCCC
`
	if n := countServices(save); n != 2 {
		t.Errorf("countServices = %d, want 2", n)
	}
	if r, c := countOwned(save); r != 5 || c != 2 {
		t.Errorf("countOwned = %d rules, %d chains; want 5, 2", r, c)
	}
	if got := fmtCount(10000); got != "10,000" {
		t.Errorf("fmtCount = %q", got)
	}
	if got := median([]time.Duration{3, 1, 2}); got != 2 {
		t.Errorf("median = %v", got)
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100 - i)
	}
	for _, tc := range []struct {
		d    []time.Duration
		q    float64
		want time.Duration
	}{{hundred, 0.99, 99}, {hundred, 0.5, 50}, {[]time.Duration{5, 1, 9}, 0.99, 9}, {[]time.Duration{7}, 0.99, 7}} {
		if got := percentile(tc.d, tc.q); got != tc.want {
			t.Errorf("percentile(%d samples, %v) = %v, want %v", len(tc.d), tc.q, got, tc.want)
		}
	}
}
