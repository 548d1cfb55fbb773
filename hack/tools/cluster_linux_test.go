package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/hack/image/oci"
	"github.com/kproxy/kproxy/test/cluster"
	"github.com/kproxy/kproxy/test/netns"
)

// TestChartOnCluster installs the chart for real, as docs/install.md tells
// a user, into the cluster of make cluster (test/cluster: kubelets,
// containerd, the CNI bridge, CoreDNS) started with PROXY=none, so that no
// Service proxy runs before the chart's:
//
//   - helm install with a values file (the image of make images, which the
//     nodes imported; the API server; the pod CIDR), the DaemonSet's pods
//     Ready on both nodes; then a Deployment and a NodePort Service: a
//     pod's curl through the ClusterIP and through the Service's name
//     (CoreDNS, itself behind a ClusterIP), the NodePort of each node from
//     outside the cluster; the nodes have kproxy's iptables chains and no
//     nftables table of kproxy's;
//   - helm upgrade --reuse-values --set linux.mode=nftables: new pods on
//     both nodes, the same traffic, and now kproxy's nftables table and no
//     KPROXY- chain in either iptables flavour;
//   - the documented removal (docs/install.md, "Install with Helm"): helm
//     upgrade to the cleanup DaemonSet, its rollout, helm uninstall: no
//     DaemonSet or pod of the chart is left, and each node's ruleset
//     (iptables-nft, iptables-legacy, both families, and nft's) is the one
//     it had before helm install, rule for rule (counters aside; the CNI
//     plugins' chains, which follow the pods; and, in nft's listing, empty
//     built-in chains with policy accept: iptables-nft creates a base
//     chain when a rule goes into it and leaves it when the rule goes, and
//     iptables-nft-save lists it the same whether it exists or not).
//
// Root and KPROXY_KERNEL_TESTS=1 (make test-chart-cluster), the cluster's
// binaries and make images' archive; helm from make tools.
func TestChartOnCluster(t *testing.T) {
	netns.Require(t, "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save", "nft", "make", "curl", "nsenter", "unshare", "runc")
	root := repo(t)
	if err := cluster.Prerequisites(root); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: " + err.Error())
		}
		t.Skip(err)
	}
	helmBin := helm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	base, err := os.MkdirTemp("", "kh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	dir := filepath.Join(base, "cluster") // short: the nodes' sockets live under it
	// make runs outside ctx: the cleanup's make cluster-down runs after the
	// test function returned and cancelled it.
	mk := func(limit time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", append([]string{"-C", root, "--no-print-directory"}, append(args, "CLUSTER_DIR="+dir)...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err != nil {
			return
		}
		if t.Failed() {
			for _, f := range []string{cluster.LogFile, "node1/kubelet.log"} {
				if data, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
					t.Logf("end of %s:\n%s", f, tail(string(data), 30))
				}
			}
		}
		if out, err := mk(5*time.Minute, "cluster-down"); err != nil {
			t.Errorf("cleanup: %v", err)
		} else {
			t.Logf("cleanup: %s", out)
		}
	})
	begin := time.Now()
	out, err := mk(15*time.Minute, "cluster", "PROXY=none")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make cluster PROXY=none: up after %v", time.Since(begin).Round(time.Second))
	if !strings.Contains(out, "no Service proxy yet") {
		t.Errorf("make cluster PROXY=none did not say that no proxy runs:\n%s", out)
	}
	st, err := cluster.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}

	kubectl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(dir, cluster.BinDir, "kubectl"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	helmHome := filepath.Join(base, "helm")
	helmCmd := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		full := append([]string{"--net=/run/netns/" + st.Namespaces[cluster.ControlPlaneHost], "--", helmBin, "--kubeconfig", st.Kubeconfig}, args...)
		cmd := exec.CommandContext(ctx, "nsenter", full...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+helmHome+"/cache", "HELM_CONFIG_HOME="+helmHome+"/config", "HELM_DATA_HOME="+helmHome+"/data")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("helm %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	nodeRules := func(phase string) map[string]rules {
		t.Helper()
		m := map[string]rules{}
		for _, n := range st.Nodes {
			r, err := readNodeRules(ctx, st.Namespaces[n.Name])
			if err != nil {
				t.Fatalf("%s, %s: %v", phase, n.Name, err)
			}
			m[n.Name] = r
		}
		return m
	}
	if out := kubectl("-n", "kube-system", "get", "daemonsets", "-o", "name"); out != "" {
		t.Fatalf("PROXY=none runs DaemonSets before helm install: %q", out)
	}
	before := nodeRules("before helm install")
	for name, r := range before {
		if r.kproxyChains() != "" || r.kproxyTables() != "" {
			t.Fatalf("%s has kproxy's rules before helm install: %s %s", name, r.kproxyChains(), r.kproxyTables())
		}
	}

	// helm install, with a values file as docs/install.md writes one.
	ref, err := archiveRef(filepath.Join(root, ".build", "images", "kproxy-linux-amd64.oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(ref, ":")
	values := fmt.Sprintf(`image:
  linux: {repository: %s, tag: %s}
apiServer: https://%s:6443
config:
  clusterCIDR: %s
  # make cluster's nodes are network namespaces of one machine, whose
  # nf_conntrack_max they cannot set (kind does the same for kube-proxy).
  conntrack: {maxPerCore: 0}
`, ref[:i], ref[i+1:], cluster.ControlPlaneIP, cluster.ClusterCIDR)
	if !cluster.OOMScoreSettable() {
		values += "linux:\n  config:\n    oomScoreAdj: 0 # this machine's processes cannot lower their OOM score\n"
	}
	valuesFile := filepath.Join(base, "my-values.yaml")
	if err := os.WriteFile(valuesFile, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "charts", "kproxy")
	helmCmd("install", "kproxy", chart, "-n", "kube-system", "-f", valuesFile)
	kubectl("-n", "kube-system", "rollout", "status", "daemonset/kproxy", "--timeout=4m")
	pods1 := proxyPods(t, kubectl, st)
	for _, p := range pods1 {
		if !strings.HasSuffix(p, " "+ref) {
			t.Errorf("kproxy pod %q does not run %s", p, ref)
		}
	}
	kubectl("-n", "kube-system", "wait", "--for=condition=Ready", "pod", "-l", "k8s-app=kube-dns", "--timeout=3m")

	const agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	kubectl("create", "deployment", "web", "--image="+agnhost, "--replicas=4", "--", "/agnhost", "netexec", "--http-port=8080")
	kubectl("expose", "deployment", "web", "--port=80", "--target-port=8080", "--type=NodePort")
	kubectl("run", "client", "--image="+agnhost, "--restart=Never", "--command", "--", "sleep", "3600")
	kubectl("wait", "--for=condition=Available", "deployment/web", "--timeout=3m")
	kubectl("wait", "--for=condition=Ready", "pod/client", "--timeout=3m")
	clusterIP := strings.TrimSpace(kubectl("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	nodePort := strings.TrimSpace(kubectl("get", "service", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"))
	traffic := func(phase string) {
		t.Helper()
		for _, target := range []string{clusterIP, "web"} {
			seen := map[string]bool{}
			deadline := time.Now().Add(time.Minute)
			var last string
			for len(seen) < 2 && time.Now().Before(deadline) {
				last = kubectl("exec", "client", "--", "sh", "-c", "for i in $(seq 20); do curl -s --max-time 2 http://"+target+"/hostname; echo; done")
				for _, h := range strings.Fields(last) {
					if strings.HasPrefix(h, "web-") {
						seen[h] = true
					}
				}
			}
			if len(seen) < 2 {
				t.Fatalf("%s: through http://%s from pod client, %d pods answered (%v); last output:\n%s", phase, target, len(seen), seen, last)
			}
			t.Logf("%s: http://%s from pod client answered by %v", phase, target, keys(seen))
		}
		for _, n := range st.Nodes {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+st.Namespaces["outside"], "--",
				"curl", "-s", "--max-time", "5", "--retry", "5", "--retry-all-errors", fmt.Sprintf("http://%s:%s/hostname", n.IP, nodePort)).CombinedOutput()
			cancel()
			if err != nil || !strings.HasPrefix(string(out), "web-") {
				t.Fatalf("%s: NodePort %s:%s from outside: %v %q", phase, n.IP, nodePort, err, out)
			}
		}
		t.Logf("%s: NodePort %s answered from outside on every node", phase, nodePort)
	}
	// kubectl's plugin (bin/kubectl-kproxy, built from this tree), run by
	// kubectl as a plugin: status of both nodes' kproxy and a planned path
	// through the Service, from the API server.
	pluginDir := filepath.Join(base, "plugin")
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(pluginDir, "kubectl-kproxy"), "./cmd/kubectl-kproxy")
	build.Dir, build.Env = root, append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-kproxy: %v\n%s", err, out)
	}
	plugin := func(phase, mode string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		run := func(args ...string) string {
			cmd := exec.CommandContext(ctx, filepath.Join(dir, cluster.BinDir, "kubectl"), append([]string{"kproxy"}, args...)...)
			cmd.Env = append(os.Environ(), "PATH="+pluginDir+":"+os.Getenv("PATH"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: kubectl kproxy %s: %v\n%s", phase, strings.Join(args, " "), err, out)
			}
			return string(out)
		}
		var rows []struct {
			Node, Mode, Health string
		}
		out := run("status", "-o", "json")
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%s: kubectl kproxy status -o json: %v\n%s", phase, err, out)
		}
		if len(rows) != len(st.Nodes) {
			t.Errorf("%s: kubectl kproxy status lists %d nodes, want %d:\n%s", phase, len(rows), len(st.Nodes), out)
		}
		for _, r := range rows {
			if r.Health != "healthy" || r.Mode != mode {
				t.Errorf("%s: kubectl kproxy status: node %s %s in mode %q, want healthy in %s:\n%s", phase, r.Node, r.Health, r.Mode, mode, out)
			}
		}
		expl := run("explain", st.Nodes[0].Name, "--to", clusterIP+":80")
		for _, want := range []string{mode + " planned", "frontend    ClusterIP " + clusterIP + ":80 of default/web", "verdict     DNAT"} {
			if !strings.Contains(expl, want) {
				t.Errorf("%s: kubectl kproxy explain %s: no %q in:\n%s", phase, st.Nodes[0].Name, want, expl)
			}
		}
		t.Logf("%s: kubectl kproxy status and explain agree with the cluster", phase)
	}
	traffic("iptables mode")
	plugin("iptables mode", "iptables")
	for name, r := range nodeRules("after helm install") {
		if !strings.Contains(r.kproxyChains(), "KPROXY-SERVICES") || r.kproxyTables() != "" {
			t.Errorf("%s after helm install (mode iptables): kproxy's chains %q, its nftables tables %q; want KPROXY-SERVICES and no table", name, r.kproxyChains(), r.kproxyTables())
		}
	}

	// helm upgrade to the nftables mode: the pods roll.
	helmCmd("upgrade", "kproxy", chart, "-n", "kube-system", "--reuse-values", "--set", "linux.mode=nftables")
	kubectl("-n", "kube-system", "rollout", "status", "daemonset/kproxy", "--timeout=4m")
	pods2 := proxyPods(t, kubectl, st)
	for _, p := range pods2 {
		for _, q := range pods1 {
			if strings.Fields(p)[0] == strings.Fields(q)[0] {
				t.Errorf("pod %s still runs after the upgrade", strings.Fields(p)[0])
			}
		}
	}
	traffic("nftables mode")
	plugin("nftables mode", "nftables")
	for name, r := range nodeRules("after helm upgrade") {
		if c := r.kproxyChains(); c != "" {
			t.Errorf("%s after helm upgrade to nftables: kproxy's iptables chains are left: %s", name, c)
		}
		if !strings.Contains(r.kproxyTables(), "table ip kproxy") {
			t.Errorf("%s after helm upgrade to nftables: no table ip kproxy (%q)", name, r.kproxyTables())
		}
	}

	// The documented removal: the cleanup DaemonSet, then helm uninstall.
	kubectl("delete", "service", "web")
	kubectl("delete", "deployment", "web")
	kubectl("delete", "pod", "client", "--wait=true")
	helmCmd("upgrade", "kproxy", chart, "-n", "kube-system", "--reuse-values", "--set", "linux.enabled=false", "--set", "windows.enabled=false", "--set", "cleanup.enabled=true")
	kubectl("-n", "kube-system", "rollout", "status", "daemonset/kproxy-cleanup", "--timeout=4m")
	kubectl("-n", "kube-system", "wait", "--for=delete", "pod", "-l", "k8s-app=kproxy", "--timeout=2m")
	helmCmd("uninstall", "kproxy", "-n", "kube-system", "--wait")
	kubectl("-n", "kube-system", "wait", "--for=delete", "pod", "-l", "k8s-app=kproxy-cleanup", "--timeout=2m")
	if out := kubectl("-n", "kube-system", "get", "daemonsets,pods,configmaps,serviceaccounts", "-l", "app.kubernetes.io/part-of=kproxy", "-o", "name"); out != "" {
		t.Errorf("after helm uninstall: %s", out)
	}
	if out := kubectl("-n", "kube-system", "get", "pods", "-o", "name"); strings.Contains(out, "kproxy") {
		t.Errorf("after helm uninstall, kproxy pods: %s", out)
	}
	after := nodeRules("after helm uninstall")
	for _, n := range st.Nodes {
		if d := before[n.Name].diff(after[n.Name]); d != "" {
			t.Errorf("%s is not as it was before helm install:\n%s", n.Name, d)
		}
	}
}

// proxyPods lists the kproxy DaemonSet's pods as "NAME NODE IMAGE", one
// Ready per node (it fails the test otherwise).
func proxyPods(t *testing.T, kubectl func(...string) string, st *cluster.State) []string {
	t.Helper()
	out := kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kproxy", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status} {.spec.containers[0].image}{"\n"}{end}`)
	var pods []string
	nodes := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[2] != "True" {
			t.Fatalf("kproxy pod not Ready: %q (all: %q)", l, out)
		}
		nodes[f[1]] = true
		pods = append(pods, f[0]+" "+f[1]+" "+f[3])
	}
	for _, n := range st.Nodes {
		if !nodes[n.Name] {
			t.Fatalf("no kproxy pod on %s: %q", n.Name, out)
		}
	}
	return pods
}

// rules is a node's netfilter state: each iptables dump (flavour and
// family) and nft's ruleset, normalized (normalizeRules).
type rules map[string][]string

// ruleDumps are the commands whose output makes rules.
var ruleDumps = [][]string{
	{"iptables-nft-save"}, {"ip6tables-nft-save"},
	{"iptables-legacy-save"}, {"ip6tables-legacy-save"},
	{"nft", "list", "ruleset"},
}

// readNodeRules dumps the rules of the network namespace ns.
func readNodeRules(ctx context.Context, ns string) (rules, error) {
	r := rules{}
	for _, d := range ruleDumps {
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, "--"}, d...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(d, " "), err, stderr.String())
		}
		lines := normalizeRules(string(out))
		if d[0] == "nft" {
			lines = dropEmptyBaseChains(lines)
		}
		r[strings.Join(d, " ")] = lines
	}
	return r, nil
}

var (
	counterBrackets = regexp.MustCompile(`\[\d+:\d+\]`)
	nftCounter      = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	// The CNI plugins' chains (portmap's CNI-HOSTPORT-*, bridge's CNI-*)
	// come and go with pods, not with the proxy.
	cniChain = regexp.MustCompile(`CNI-`)
)

// normalizeRules drops comments (the dump's date), counters and the CNI
// plugins' lines.
func normalizeRules(dump string) []string {
	var out []string
	for _, l := range strings.Split(dump, "\n") {
		l = strings.TrimRight(l, " \t")
		if l == "" || strings.HasPrefix(l, "#") || cniChain.MatchString(l) {
			continue
		}
		l = counterBrackets.ReplaceAllString(l, "[0:0]")
		l = nftCounter.ReplaceAllString(l, "counter")
		out = append(out, l)
	}
	return out
}

// dropEmptyBaseChains removes, from nft list ruleset's lines, the chains
// whose only statement is their hook with policy accept: they accept every
// packet, as no chain does.
func dropEmptyBaseChains(lines []string) []string {
	var out []string
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "chain ") && strings.HasSuffix(l, "{") && i+2 < len(lines) {
			hook := strings.TrimSpace(lines[i+1])
			if strings.HasPrefix(hook, "type ") && strings.HasSuffix(hook, "policy accept;") && strings.TrimSpace(lines[i+2]) == "}" {
				i += 2
				continue
			}
		}
		out = append(out, lines[i])
	}
	return out
}

// kproxyChains lists the KPROXY- chains of the iptables dumps.
func (r rules) kproxyChains() string {
	var out []string
	for name, lines := range r {
		if !strings.Contains(name, "iptables") {
			continue
		}
		for _, l := range lines {
			if strings.HasPrefix(l, ":KPROXY-") {
				out = append(out, name+" "+strings.Fields(l)[0])
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// kproxyTables lists the tables named kproxy of nft's ruleset.
func (r rules) kproxyTables() string {
	var out []string
	for _, l := range r["nft list ruleset"] {
		if strings.HasPrefix(l, "table ") && strings.HasSuffix(strings.TrimSuffix(l, " {"), " kproxy") {
			out = append(out, strings.TrimSuffix(l, " {"))
		}
	}
	return strings.Join(out, ", ")
}

// diff lists, per dump, the lines only before (-) and only after (+), as
// multisets; empty when the rules are the same.
func (r rules) diff(after rules) string {
	var b strings.Builder
	var names []string
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		count := map[string]int{}
		for _, l := range r[n] {
			count[l]++
		}
		for _, l := range after[n] {
			count[l]--
		}
		var lines []string
		for l, c := range count {
			for ; c > 0; c-- {
				lines = append(lines, "- "+l)
			}
			for ; c < 0; c++ {
				lines = append(lines, "+ "+l)
			}
		}
		if len(lines) > 0 {
			sort.Strings(lines)
			fmt.Fprintf(&b, "%s:\n  %s\n", n, strings.Join(lines, "\n  "))
		}
	}
	return b.String()
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// archiveRef is the image name ctr gives an OCI archive.
func archiveRef(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	desc, _, _, err := oci.ReadArchive(f)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	ref := desc.Annotations["io.containerd.image.name"]
	if ref == "" || !strings.Contains(ref, ":") {
		return "", fmt.Errorf("%s names no image with a tag (io.containerd.image.name %q)", path, ref)
	}
	return ref, nil
}

// TestDropEmptyBaseChains: an empty base chain with policy accept goes, a
// base chain with a rule, a drop policy, or a regular chain stays.
func TestDropEmptyBaseChains(t *testing.T) {
	in := normalizeRules(`table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
	}
	chain FORWARD {
		type filter hook forward priority filter; policy drop;
	}
	chain OUTPUT {
		type filter hook output priority filter; policy accept;
		counter packets 3 bytes 180 jump KUBE-FIREWALL
	}
	chain KUBE-FIREWALL {
	}
}
`)
	got := strings.Join(dropEmptyBaseChains(in), "\n")
	want := strings.Join([]string{"table ip filter {", "\tchain FORWARD {", "\t\ttype filter hook forward priority filter; policy drop;", "\t}",
		"\tchain OUTPUT {", "\t\ttype filter hook output priority filter; policy accept;", "\t\tcounter jump KUBE-FIREWALL", "\t}",
		"\tchain KUBE-FIREWALL {", "\t}", "}"}, "\n")
	if got != want {
		t.Errorf("dropEmptyBaseChains:\n%s\nwant:\n%s", got, want)
	}
}
