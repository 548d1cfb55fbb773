package deploy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/pkg/config"
)

const (
	// sourceVIPEdit, followed by an address, asks startOptions to edit the
	// config as start.ps1 does with a node's source VIP.
	sourceVIPEdit = "edit:sourceVip="
	testNodeName  = "node-a"
	saDir         = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// TestProxyConfigFilesDecode loads every KubeProxyConfiguration under
// config/ with kproxy's strict loader.
func TestProxyConfigFilesDecode(t *testing.T) {
	files := deployFiles(t)[fileProxyConfig]
	if len(files) == 0 {
		t.Fatal("no configuration files")
	}
	for _, f := range files {
		if _, err := config.Load(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// startOptions builds kproxy's options the way kproxy does at start in a
// pod of ds: its container args and environment, with --config read from
// the rendered ConfigMap and $(NODE_NAME) expanded. extra args are appended
// (what start.ps1 adds). Validation runs as for a dry run, so that either
// OS's proxy mode is valid on the machine running the test; the tests check
// the mode themselves.
func startOptions(t *testing.T, r *rendered, ds *appsv1.DaemonSet, extra ...string) *config.Options {
	t.Helper()
	return containerOptions(t, r, ds, proxyContainer(ds), extra...)
}

// containerOptions is startOptions for container c of ds.
func containerOptions(t *testing.T, r *rendered, ds *appsv1.DaemonSet, c *v1.Container, extra ...string) *config.Options {
	t.Helper()
	cm, key, err := configSourceOf(r, ds, c)
	if err != nil {
		t.Fatalf("DaemonSet %s: %v", ds.Name, err)
	}
	file := filepath.Join(t.TempDir(), "config.conf")
	data := cm.Data[key]
	var rest []string
	for _, e := range extra {
		if vip, ok := strings.CutPrefix(e, sourceVIPEdit); ok {
			// What start.ps1 does: sourceVip added under winkernel.
			edited := strings.Replace(data, "\nwinkernel:\n", "\nwinkernel:\n  sourceVip: \""+vip+"\"\n", 1)
			if edited == data {
				t.Fatalf("DaemonSet %s: the config has no top-level winkernel: line for start.ps1 to edit", ds.Name)
			}
			data = edited
			continue
		}
		rest = append(rest, e)
	}
	extra = rest
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			t.Setenv(e.Name, e.Value)
		}
	}
	var args []string
	for _, a := range append(append([]string(nil), c.Args...), extra...) {
		a = strings.ReplaceAll(a, "$("+nodeNameEnv+")", testNodeName)
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + file
		}
		args = append(args, a)
	}
	args = append(args, "--dry-run")

	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o := config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("DaemonSet %s: kproxy rejects its arguments %q: %v", ds.Name, c.Args, err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatalf("DaemonSet %s: %v", ds.Name, err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("DaemonSet %s: %v", ds.Name, err)
	}
	return o
}

func TestDaemonSetStartsWithValidConfig(t *testing.T) {
	r := renderMain(t)
	for _, tc := range []struct {
		ds    string
		mode  v1alpha1.ProxyMode
		extra []string
	}{
		{linuxDaemonSet, config.ModeIPTables, nil},
		{windowsDaemonSet, config.ModeKernelspace, nil},
		// start.ps1 adds the node's source VIP to the config when it has one
		// (startOptions makes the same edit for this "extra").
		{windowsDaemonSet, config.ModeKernelspace, []string{sourceVIPEdit + "10.244.1.2"}},
	} {
		t.Run(tc.ds+strings.Join(tc.extra, ""), func(t *testing.T) {
			ds := r.daemonSet(t, tc.ds)
			o := startOptions(t, r, ds, tc.extra...)
			if got := o.ProxyMode(); got != tc.mode {
				t.Errorf("proxy mode %q, want %q", got, tc.mode)
			}
			if o.NodeName != testNodeName {
				t.Errorf("node name %q, want %q", o.NodeName, testNodeName)
			}
			if w := o.Warnings(); len(w) > 0 {
				t.Errorf("the configuration sets what kproxy ignores: %q", w)
			}
			if hz, ok := o.HealthzBindAddress(); !ok || hz.Port() != healthzPort || !hz.Addr().IsUnspecified() {
				t.Errorf("healthz on %v (enabled %v), want all addresses, port %d (the probes' port)", hz, ok, healthzPort)
			}
			kc := o.ClientConnection().Kubeconfig
			if kc == "" {
				t.Errorf("no kubeconfig: the in-cluster configuration needs the kubernetes Service, which the proxy itself programs")
			} else if _, key, err := mountedKey(r, ds, proxyContainer(ds), kc); err != nil {
				t.Errorf("kubeconfig: %v", err)
			} else if key != kubeconfigName {
				t.Errorf("kubeconfig %s is ConfigMap key %q, want %q", kc, key, kubeconfigName)
			}
			if ds.Spec.Template.Spec.AutomountServiceAccountToken != nil && !*ds.Spec.Template.Spec.AutomountServiceAccountToken {
				t.Errorf("the service account token the kubeconfig uses is not mounted")
			}
			if tc.mode == config.ModeKernelspace {
				// Empty: kproxy uses the node's only L2Bridge or Overlay
				// network; the ConfigMap is where an operator names one.
				if got := o.Winkernel().NetworkName; got != "" {
					t.Errorf("HNS network %q in the shipped configuration, want it empty (found on the node)", got)
				}
			}
		})
	}
}

// TestConfigsAgree checks that the Linux and Windows configurations agree
// on what is not platform-specific.
func TestConfigsAgree(t *testing.T) {
	r := renderMain(t)
	lin := startOptions(t, r, r.daemonSet(t, linuxDaemonSet)).Config
	win := startOptions(t, r, r.daemonSet(t, windowsDaemonSet)).Config
	for _, f := range []struct {
		name     string
		lin, win any
	}{
		{"clusterCIDR", lin.ClusterCIDR, win.ClusterCIDR},
		{"clientConnection", lin.ClientConnection, win.ClientConnection},
		{"healthzBindAddress", lin.HealthzBindAddress, win.HealthzBindAddress},
		{"metricsBindAddress", lin.MetricsBindAddress, win.MetricsBindAddress},
		{"iptables.syncPeriod", lin.IPTables.SyncPeriod, win.IPTables.SyncPeriod},
		{"iptables.minSyncPeriod", lin.IPTables.MinSyncPeriod, win.IPTables.MinSyncPeriod},
		{"configSyncPeriod", lin.ConfigSyncPeriod, win.ConfigSyncPeriod},
	} {
		if !reflect.DeepEqual(f.lin, f.win) {
			t.Errorf("%s: Linux %v, Windows %v", f.name, f.lin, f.win)
		}
	}
}

// TestKubeconfig decodes the kubeconfig strictly and checks that it
// authenticates with the pod's service account.
func TestKubeconfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(proxyConfigDir, kubeconfigName))
	if err != nil {
		t.Fatal(err)
	}
	var kc clientcmdv1.Config
	if err := sigsyaml.UnmarshalStrict(data, &kc); err != nil {
		t.Fatalf("%s: %v", kubeconfigName, err)
	}
	var ctx *clientcmdv1.Context
	for i := range kc.Contexts {
		if kc.Contexts[i].Name == kc.CurrentContext {
			ctx = &kc.Contexts[i].Context
		}
	}
	if ctx == nil {
		t.Fatalf("current-context %q is not defined", kc.CurrentContext)
	}
	for _, c := range kc.Clusters {
		if c.Name != ctx.Cluster {
			continue
		}
		if !strings.HasPrefix(c.Cluster.Server, "https://") {
			t.Errorf("server %q is not https", c.Cluster.Server)
		}
		if c.Cluster.CertificateAuthority != saDir+"/ca.crt" {
			t.Errorf("certificate-authority %q, want the service account's", c.Cluster.CertificateAuthority)
		}
	}
	for _, u := range kc.AuthInfos {
		if u.Name == ctx.AuthInfo && u.AuthInfo.TokenFile != saDir+"/token" {
			t.Errorf("user %s: tokenFile %q, want the service account's", u.Name, u.AuthInfo.TokenFile)
		}
	}
}

// TestCleanupUsesTheConfiguredNetwork: an operator who names the HNS network
// in config/windows.yaml (several networks on the host: nothing to detect)
// gets it in kproxy and in its cleanup alike.
func TestCleanupUsesTheConfiguredNetwork(t *testing.T) {
	dir := t.TempDir()
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if path == filepath.Join(proxyConfigDir, "windows.yaml") {
			edited := strings.Replace(string(data), `networkName: ""`, `networkName: "Calico"`, 1)
			if edited == string(data) {
				t.Fatalf("%s has no networkName: \"\" line to edit", path)
			}
			data = []byte(edited)
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, path), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	main := renderDir(t, dir)
	if got := startOptions(t, main, main.daemonSet(t, windowsDaemonSet)).Winkernel().NetworkName; got != "Calico" {
		t.Fatalf("kproxy-windows: network %q, want Calico", got)
	}
	cleanup := renderDir(t, filepath.Join(dir, "cleanup"))
	ds := cleanup.daemonSet(t, "kproxy-cleanup-windows")
	c := &ds.Spec.Template.Spec.InitContainers[0]
	if got := containerOptions(t, cleanup, ds, c).Winkernel().NetworkName; got != "Calico" {
		t.Errorf("kproxy-cleanup-windows: network %q, want Calico (from the ConfigMap, as kproxy-windows)", got)
	}
}
