package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/test/controlplane"
)

// chartTarget is a cluster the chart is installed into: a kubeconfig for
// helm, a client for the checks, and how helm is run to reach it. The
// API-server-only target below is the first; a cluster with kubelets
// (test/cluster) is the next, whose test adds traffic through a Service
// and the node's rules after uninstall to the same steps.
type chartTarget interface {
	// Helm runs helm with args against the cluster.
	Helm(ctx context.Context, args ...string) ([]byte, error)
	Client() kubernetes.Interface
}

// apiServerTarget is a kube-apiserver and etcd (test/controlplane) in a
// network namespace of the test's: no kubelet, so the DaemonSets get no
// pods; helm reaches the API server from inside the namespace (ip netns
// exec).
type apiServerTarget struct {
	ns, helm, kubeconfig string
	client               kubernetes.Interface
}

func (a *apiServerTarget) Client() kubernetes.Interface { return a.client }

func (a *apiServerTarget) Helm(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"netns", "exec", a.ns, a.helm, "--kubeconfig", a.kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, "ip", full...)
	d := filepath.Dir(a.kubeconfig)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+d+"/cache", "HELM_CONFIG_HOME="+d+"/config", "HELM_DATA_HOME="+d+"/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// requireRoot skips without root or ip, except under CI=true, which fails.
func requireRoot(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root (a network namespace for the API server)"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "needs ip (iproute2)"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why + " (CI=true makes this a failure)")
	}
	t.Skip(why)
}

// newAPIServerTarget starts etcd and kube-apiserver in a namespace of the
// test's (removed at the end) and returns the target.
func newAPIServerTarget(t *testing.T, ctx context.Context) *apiServerTarget {
	t.Helper()
	requireRoot(t)
	bins, err := controlplane.EnsureBinaries(ctx, t.Logf)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("no control plane binaries (make controlplane, or KPROXY_CONTROLPLANE_CACHE): %v", err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "kproxy-helm-" + hex.EncodeToString(b)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", ns, err, out)
		}
	})
	listen := netip.MustParseAddr("10.250.0.10")
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "addr", "add", listen.String()+"/32", "dev", "lo")
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Binaries: bins, ListenIP: listen,
		CommandPrefix: controlplane.NetnsExecPrefix(ns), Dial: controlplane.NetnsDialer(ns),
		// As kubeadm and every cluster that runs a kube-proxy: privileged
		// and HostProcess pods allowed.
		ExtraAPIServerArgs: []string{"--allow-privileged=true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	kc, err := cp.Kubeconfig(controlplane.Admin)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := cp.RESTConfig(controlplane.Admin)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &apiServerTarget{ns: ns, helm: helm(t), kubeconfig: path, client: client}
}

// TestChartInstallUpgradeUninstall installs the chart for real with helm
// into a kube-apiserver: helm install creates every object the chart
// renders (RBAC, ConfigMap, both DaemonSets, in kube-system); helm upgrade
// --set linux.mode=nftables makes a new ConfigMap (its name is its data's
// hash) whose linux.yaml loads with mode nftables, changes the Linux
// DaemonSet's spec (a new generation: it rolls), and deletes the old
// ConfigMap; helm uninstall removes everything it created, its release
// records included.
func TestChartInstallUpgradeUninstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	target := newAPIServerTarget(t, ctx)
	chartInstallUpgradeUninstall(t, ctx, target)
}

func chartInstallUpgradeUninstall(t *testing.T, ctx context.Context, target chartTarget) {
	chart := filepath.Join(repo(t), "charts", "kproxy")
	c := target.Client()
	const ns = "kube-system"
	if _, err := target.Helm(ctx, "install", "kproxy", chart, "--namespace", ns, "--set", "apiServer=https://10.250.0.10:6443"); err != nil {
		t.Fatal(err)
	}
	ds1, err := c.AppsV1().DaemonSets(ns).Get(ctx, "kproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after helm install: %v", err)
	}
	if _, err := c.AppsV1().DaemonSets(ns).Get(ctx, "kproxy-windows", metav1.GetOptions{}); err != nil {
		t.Fatalf("after helm install: %v", err)
	}
	for _, get := range []func() error{
		func() error {
			_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "kproxy", metav1.GetOptions{})
			return err
		},
		func() error { _, err := c.RbacV1().ClusterRoles().Get(ctx, "kproxy", metav1.GetOptions{}); return err },
		func() error {
			_, err := c.RbacV1().ClusterRoleBindings().Get(ctx, "kproxy", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Fatalf("after helm install: %v", err)
		}
	}
	cm1 := configMapOf(t, ctx, c, ds1)
	mode := func(cm *v1.ConfigMap) string {
		cfg, err := config.Decode([]byte(cm.Data["linux.yaml"]))
		if err != nil {
			t.Fatalf("ConfigMap %s: linux.yaml: %v", cm.Name, err)
		}
		return string(cfg.Mode)
	}
	if m := mode(cm1); m != "iptables" {
		t.Fatalf("installed with mode %q, want iptables", m)
	}

	if _, err := target.Helm(ctx, "upgrade", "kproxy", chart, "--namespace", ns, "--reuse-values", "--set", "linux.mode=nftables"); err != nil {
		t.Fatal(err)
	}
	ds2, err := c.AppsV1().DaemonSets(ns).Get(ctx, "kproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm2 := configMapOf(t, ctx, c, ds2)
	if cm2.Name == cm1.Name {
		t.Errorf("the upgrade kept ConfigMap %s: the DaemonSet would not roll", cm1.Name)
	}
	if m := mode(cm2); m != "nftables" {
		t.Errorf("after helm upgrade --set linux.mode=nftables: mode %q", m)
	}
	if ds2.Generation == ds1.Generation {
		t.Errorf("the DaemonSet's spec did not change (generation %d)", ds2.Generation)
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Get(ctx, cm1.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the old ConfigMap %s after the upgrade: %v, want it deleted by helm", cm1.Name, err)
	}

	if _, err := target.Helm(ctx, "uninstall", "kproxy", "--namespace", ns, "--wait"); err != nil {
		t.Fatal(err)
	}
	left := leftovers(ctx, c, ns)
	if len(left) > 0 {
		t.Errorf("after helm uninstall: %v", left)
	}
}

// configMapOf returns the ConfigMap ds's config volume mounts.
func configMapOf(t *testing.T, ctx context.Context, c kubernetes.Interface, ds *appsv1.DaemonSet) *v1.ConfigMap {
	t.Helper()
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			cm, err := c.CoreV1().ConfigMaps(ds.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("DaemonSet %s mounts ConfigMap %s: %v", ds.Name, v.ConfigMap.Name, err)
			}
			return cm
		}
	}
	t.Fatalf("DaemonSet %s mounts no ConfigMap", ds.Name)
	return nil
}

// leftovers lists what carries the chart's part-of label, or its names,
// after an uninstall.
func leftovers(ctx context.Context, c kubernetes.Interface, ns string) []string {
	var out []string
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kproxy"}
	if l, err := c.AppsV1().DaemonSets(ns).List(ctx, sel); err != nil || len(l.Items) > 0 {
		out = append(out, fmt.Sprintf("DaemonSets: %d, %v", len(l.Items), err))
	}
	if l, err := c.CoreV1().ConfigMaps(ns).List(ctx, sel); err != nil || len(l.Items) > 0 {
		out = append(out, fmt.Sprintf("ConfigMaps: %d, %v", len(l.Items), err))
	}
	if l, err := c.CoreV1().ServiceAccounts(ns).List(ctx, sel); err != nil || len(l.Items) > 0 {
		out = append(out, fmt.Sprintf("ServiceAccounts: %d, %v", len(l.Items), err))
	}
	if l, err := c.RbacV1().ClusterRoles().List(ctx, sel); err != nil || len(l.Items) > 0 {
		out = append(out, fmt.Sprintf("ClusterRoles: %d, %v", len(l.Items), err))
	}
	if l, err := c.RbacV1().ClusterRoleBindings().List(ctx, sel); err != nil || len(l.Items) > 0 {
		out = append(out, fmt.Sprintf("ClusterRoleBindings: %d, %v", len(l.Items), err))
	}
	if l, err := c.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"}); err != nil || len(l.Items) > 0 {
		out = append(out, fmt.Sprintf("helm release Secrets: %d, %v", len(l.Items), err))
	}
	return out
}
