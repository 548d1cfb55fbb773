package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestRollback is the rollback of docs/install.md ("After kproxy is gone"):
// kproxy (iptables mode, then nftables mode) runs in node1 against the real
// control plane; it stops (its DaemonSet deleted: its rules stay and keep
// serving), the cleanup runs there with the arguments of deploy/cleanup's
// Linux DaemonSet ("kproxy --cleanup ..."), and upstream kube-proxy v1.37.2
// starts in the same node namespace, in the same mode, as
// "kubeadm init phase addon kube-proxy" brings it back. Then a ClusterIP
// (both families, from a pod) and a NodePort (from outside) answer through
// kube-proxy, and neither iptables flavour, in either family and any table,
// holds a KPROXY rule, nor does nftables hold kproxy's tables or anything
// else naming kproxy — right after the cleanup and again once kube-proxy
// has synced. (TestDropInSwap covers the other order, kube-proxy back
// before the cleanup, without a failed connection.)
func TestRollback(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { testRollback(t, mode) })
	}
}

func testRollback(t *testing.T, mode string) {
	netns.Require(t, "iptables-legacy-save", "ip6tables-legacy-save", "ip6tables-nft-save", "nft")
	d := newDropInEnv(t)
	ctx := testCtx(t, 4*time.Minute)
	cleanupArgs := deployCleanupArgs(t)

	kx := d.Proxy(kproxyBin, "", d.logDir, d.proxyArgs(mode)...)
	kp := d.Proxy(d.kubeProxy, "", d.logDir, d.proxyArgs(mode)...)
	for _, p := range []*e2e.Proxy{kx, kp} {
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
	targets := []target{
		{proxytest.Client1, clusterIP(svc, v1.IPv4Protocol)},
		{proxytest.Client1, clusterIP(svc, v1.IPv6Protocol)},
		{proxytest.Outside, d.nodePort(svc)},
	}
	both := expectation{backends: []string{proxytest.PodA1, proxytest.PodB1}}

	d.startProxy(kx, "kproxy ("+mode+")")
	for _, tg := range targets {
		d.await(tg.from, "tcp", tg.addr, both, 20*time.Second)
	}
	if left := d.kproxyLeftovers(ctx); left == "" {
		t.Fatalf("kproxy (%s) runs but node1 shows nothing of it: the leftover check would see nothing either", mode)
	} else if mode == "nftables" && !strings.Contains(left, "table ip kproxy") {
		t.Fatalf("kproxy in nftables mode made no table ip kproxy:\n%s", left)
	}

	// kubectl delete -k deploy/...: the rules stay in the kernel and serve.
	d.stopProxy(kx, "kproxy")
	for _, tg := range targets {
		d.await(tg.from, "tcp", tg.addr, both, 10*time.Second)
	}

	// kubectl apply -k deploy/cleanup/: its init container on node1.
	argv := append([]string{kproxyBin}, cleanupArgs...)
	out, err := d.Cluster.Exec(ctx, proxytest.Node1, argv...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	t.Logf("ran %s", strings.Join(argv, " "))
	if left := d.kproxyLeftovers(ctx); left != "" {
		t.Errorf("left by the cleanup:\n%s", left)
	}
	// Nothing serves the Service now: the cleanup removed what did.
	d.await(proxytest.Client1, "tcp", targets[0].addr, expectation{notAnswered: true}, 10*time.Second)

	// kubeadm init phase addon kube-proxy: kube-proxy's pod starts.
	d.startProxy(kp, "kube-proxy ("+mode+")")
	for _, tg := range targets {
		d.await(tg.from, "tcp", tg.addr, both, 20*time.Second)
	}
	switch mode {
	case "iptables":
		if d.rulesOf(ctx, "KUBE-SERVICES") == "" {
			t.Errorf("kube-proxy (iptables) runs without a KUBE-SERVICES chain in node1")
		}
	case "nftables":
		if !strings.Contains(d.nftTables(ctx), "kube-proxy") {
			t.Errorf("kube-proxy (nftables) runs without its nftables table in node1:\n%s", d.nftTables(ctx))
		}
	}
	if left := d.kproxyLeftovers(ctx); left != "" {
		t.Errorf("kproxy's state under kube-proxy:\n%s", left)
	}
}

// deployCleanupArgs returns the arguments deploy/cleanup's Linux DaemonSet
// gives kproxy in its init container, for node1.
func deployCleanupArgs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "cleanup", "linux.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := sigsyaml.UnmarshalStrict(data, &ds); err != nil {
		t.Fatalf("deploy/cleanup/linux.yaml: %v", err)
	}
	var args []string
	for _, c := range ds.Spec.Template.Spec.InitContainers {
		if len(c.Command) == 1 && filepath.Base(c.Command[0]) == "kproxy" {
			args = c.Args
		}
	}
	if !slices.Contains(args, "--cleanup") {
		t.Fatalf("deploy/cleanup/linux.yaml: no init container runs kproxy --cleanup (args %q)", args)
	}
	out := make([]string, 0, len(args))
	for _, a := range args {
		out = append(out, strings.ReplaceAll(a, "$(NODE_NAME)", proxytest.Node1))
	}
	return out
}

// kproxyLeftovers lists what of kproxy node1 still holds: every line
// naming KPROXY in iptables-save of both flavours and both families (all
// tables), and every line of the nftables ruleset naming kproxy (its own
// tables, and iptables-nft's tables with KPROXY chains).
func (d *dropInEnv) kproxyLeftovers(ctx context.Context) string {
	d.t.Helper()
	var out []string
	for _, fl := range []string{"legacy", "nft"} {
		for _, bin := range []string{"iptables-" + fl + "-save", "ip6tables-" + fl + "-save"} {
			save, err := d.Cluster.Exec(ctx, proxytest.Node1, bin)
			if err != nil {
				d.t.Fatalf("%s: %v\n%s", bin, err, save)
			}
			if g := grep(string(save), "KPROXY"); g != "" {
				out = append(out, bin+":\n"+g)
			}
		}
	}
	ruleset, err := d.Cluster.Exec(ctx, proxytest.Node1, "nft", "list", "ruleset")
	if err != nil {
		d.t.Fatalf("nft list ruleset: %v\n%s", err, ruleset)
	}
	var nft []string
	table := ""
	for _, l := range strings.Split(string(ruleset), "\n") {
		if strings.HasPrefix(l, "table ") {
			table = strings.TrimSuffix(l, " {")
		}
		if strings.Contains(strings.ToLower(l), "kproxy") {
			nft = append(nft, table+": "+strings.TrimSpace(l))
		}
	}
	if len(nft) > 0 {
		out = append(out, "nft list ruleset:\n"+strings.Join(nft, "\n"))
	}
	return strings.Join(out, "\n")
}
