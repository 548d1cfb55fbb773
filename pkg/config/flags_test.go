package config

import (
	"errors"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kube-proxy/config/v1alpha1"
)

const fullFile = "testdata/good/full.yaml"

// precedenceRows holds, for every flag that sets a configuration field, a
// value different from testdata/good/full.yaml's and the getter that shows it.
var precedenceRows = []struct {
	flag string
	args []string
	get  func(o *Options) any
	want any
}{
	{"kubeconfig", []string{"--kubeconfig=/etc/other"}, func(o *Options) any { return o.ClientConnection().Kubeconfig }, "/etc/other"},
	{"kube-api-content-type", []string{"--kube-api-content-type=application/yaml"}, func(o *Options) any { return o.ClientConnection().ContentType }, "application/yaml"},
	{"kube-api-qps", []string{"--kube-api-qps=7.5"}, func(o *Options) any { return o.ClientConnection().QPS }, float32(7.5)},
	{"kube-api-burst", []string{"--kube-api-burst=3"}, func(o *Options) any { return o.ClientConnection().Burst }, 3},
	{"config-sync-period", []string{"--config-sync-period=1m"}, func(o *Options) any { return o.ConfigSyncPeriod() }, time.Minute},
	{"hostname-override", []string{"--hostname-override= Other-Node "}, func(o *Options) any { return o.NodeName }, "other-node"},
	{"bind-address", []string{"--bind-address=10.1.1.1"}, func(o *Options) any { return o.BindAddress() }, netip.MustParseAddr("10.1.1.1")},
	{"healthz-bind-address", []string{"--healthz-bind-address=127.0.0.1"}, func(o *Options) any { return o.Config.HealthzBindAddress }, "127.0.0.1:10256"},
	{"metrics-bind-address", []string{"--metrics-bind-address="}, func(o *Options) any { _, ok := o.MetricsBindAddress(); return ok }, false},
	{"profiling", []string{"--profiling=false"}, func(o *Options) any { return o.Config.EnableProfiling }, false},
	{"bind-address-hard-fail", []string{"--bind-address-hard-fail=false"}, func(o *Options) any { return o.BindAddressHardFail() }, false},
	{"oom-score-adj", []string{"--oom-score-adj=100"}, func(o *Options) any { return o.OOMScoreAdj() }, int32(100)},
	{"proxy-mode", []string{"--proxy-mode=kernelspace"}, func(o *Options) any { return o.ProxyMode() }, ModeKernelspace},
	{"cluster-cidr", []string{"--cluster-cidr=10.0.0.0/8"}, func(o *Options) any { return o.ClusterCIDRs() }, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	{"nodeport-addresses", []string{"--nodeport-addresses=primary"}, func(o *Options) any { return o.NodePortAddresses() }, NodePortAddresses{Primary: true}},
	{"masquerade-all", []string{"--masquerade-all=false"}, func(o *Options) any { return o.MasqueradeAll() }, false},
	{"iptables-masquerade-bit", []string{"--iptables-masquerade-bit=3"}, func(o *Options) any { return o.MasqueradeBit() }, 3},
	{"iptables-localhost-nodeports", []string{"--iptables-localhost-nodeports=true"}, func(o *Options) any { return o.LocalhostNodePorts() }, true},
	{"iptables-sync-period", []string{"--iptables-sync-period=2m"}, func(o *Options) any { return o.SyncPeriod() }, 2 * time.Minute},
	{"iptables-min-sync-period", []string{"--iptables-min-sync-period=0"}, func(o *Options) any { return o.MinSyncPeriod() }, time.Duration(0)},
	{"detect-local-mode", []string{"--detect-local-mode=NodeCIDR"}, func(o *Options) any { return o.DetectLocal().Mode }, LocalModeNodeCIDR},
	{"pod-bridge-interface", []string{"--pod-bridge-interface=cbr0"}, func(o *Options) any { return o.Config.DetectLocal.BridgeInterface }, "cbr0"},
	{"pod-interface-name-prefix", []string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=cali"}, func(o *Options) any { return o.DetectLocal().InterfaceNamePrefix }, "cali"},
	{"conntrack-max-per-core", []string{"--conntrack-max-per-core=10"}, func(o *Options) any { return o.Conntrack().MaxPerCore }, int32(10)},
	{"conntrack-min", []string{"--conntrack-min=0"}, func(o *Options) any { return o.Conntrack().Min }, int32(0)},
	{"conntrack-tcp-timeout-established", []string{"--conntrack-tcp-timeout-established=0"}, func(o *Options) any { return o.Conntrack().TCPEstablishedTimeout }, time.Duration(0)},
	{"conntrack-tcp-timeout-close-wait", []string{"--conntrack-tcp-timeout-close-wait=1m"}, func(o *Options) any { return o.Conntrack().TCPCloseWaitTimeout }, time.Minute},
	{"conntrack-tcp-be-liberal", []string{"--conntrack-tcp-be-liberal=false"}, func(o *Options) any { return o.Conntrack().TCPBeLiberal }, false},
	{"conntrack-udp-timeout", []string{"--conntrack-udp-timeout=0"}, func(o *Options) any { return o.Conntrack().UDPTimeout }, time.Duration(0)},
	{"conntrack-udp-timeout-stream", []string{"--conntrack-udp-timeout-stream=0s"}, func(o *Options) any { return o.Conntrack().UDPStreamTimeout }, time.Duration(0)},
	{"network-name", []string{"--network-name=l2bridge"}, func(o *Options) any { return o.Winkernel().NetworkName }, "l2bridge"},
	{"source-vip", []string{"--source-vip=10.0.0.9"}, func(o *Options) any { return o.Winkernel().SourceVIP }, netip.MustParseAddr("10.0.0.9")},
	{"enable-dsr", []string{"--enable-dsr=false"}, func(o *Options) any { return o.Winkernel().EnableDSR }, false},
	{"feature-gates", []string{"--feature-gates=A=true,B=false"}, func(o *Options) any { return o.Config.FeatureGates }, map[string]bool{"A": true, "B": false}},
	{"show-hidden-metrics-for-version", []string{"--show-hidden-metrics-for-version=1.36"}, func(o *Options) any { return o.Config.ShowHiddenMetricsForVersion }, "1.36"},
	{"ipvs-sync-period", []string{"--proxy-mode=ipvs", "--ipvs-sync-period=3m"}, func(o *Options) any { return o.SyncPeriod() }, 3 * time.Minute},
	{"ipvs-min-sync-period", []string{"--proxy-mode=ipvs", "--ipvs-min-sync-period=2s"}, func(o *Options) any { return o.MinSyncPeriod() }, 2 * time.Second},
	{"ipvs-scheduler", []string{"--proxy-mode=ipvs", "--ipvs-scheduler=sh"}, func(o *Options) any { return o.IPVSScheduler() }, "sh"},
	{"ipvs-exclude-cidrs", []string{"--ipvs-exclude-cidrs=10.9.0.0/16"}, func(o *Options) any { return o.Config.IPVS.ExcludeCIDRs }, []string{"10.9.0.0/16"}},
	{"ipvs-strict-arp", []string{"--ipvs-strict-arp"}, func(o *Options) any { return o.Config.IPVS.StrictARP }, true},
	{"ipvs-tcp-timeout", []string{"--ipvs-tcp-timeout=5s"}, func(o *Options) any { return o.Config.IPVS.TCPTimeout.Duration }, 5 * time.Second},
	{"ipvs-tcpfin-timeout", []string{"--ipvs-tcpfin-timeout=6s"}, func(o *Options) any { return o.Config.IPVS.TCPFinTimeout.Duration }, 6 * time.Second},
	{"ipvs-udp-timeout", []string{"--ipvs-udp-timeout=7s"}, func(o *Options) any { return o.Config.IPVS.UDPTimeout.Duration }, 7 * time.Second},
	{"root-hnsendpoint-name", []string{"--root-hnsendpoint-name=cbr9"}, func(o *Options) any { return o.Winkernel().RootHNSEndpointName }, "cbr9"},
	{"forward-healthcheck-vip", []string{"--forward-healthcheck-vip=false"}, func(o *Options) any { return o.Winkernel().ForwardHealthCheckVIP }, false},
}

// TestConfigFileIgnoresFlags checks upstream kube-proxy's precedence for
// every flag that sets a configuration field: without --config the flag
// sets it; with --config the file's value holds, the flag is ignored and
// warned about, except --hostname-override, which still wins.
func TestConfigFileIgnoresFlags(t *testing.T) {
	for _, row := range precedenceRows {
		t.Run(row.flag, func(t *testing.T) {
			resetKlogFlags(t)
			fileOnly := testOptions("linux", nil)
			if _, err := parse(t, fileOnly, "--config", fullFile); err != nil {
				t.Fatal(err)
			}
			fromFile := row.get(fileOnly)
			if reflect.DeepEqual(fromFile, row.want) {
				t.Fatalf("without the flag the value is already %v: the row cannot fail", fromFile)
			}

			flagsOnly := testOptions("linux", nil)
			if _, err := parse(t, flagsOnly, row.args...); err != nil {
				t.Fatal(err)
			}
			if got := row.get(flagsOnly); !reflect.DeepEqual(got, row.want) {
				t.Errorf("without --config, %v: got %#v, want %#v", row.args, got, row.want)
			}
			if flagsOnly.setBy[bindingFor(t, flagsOnly, row.flag).field] != row.flag {
				t.Errorf("setBy does not record --%s", row.flag)
			}

			withFile := testOptions("linux", nil)
			if _, err := parse(t, withFile, append([]string{"--config", fullFile}, row.args...)...); err != nil {
				t.Fatal(err)
			}
			got := row.get(withFile)
			warned := strings.Contains(strings.Join(withFile.Warnings(), "\n"), "--"+row.flag+" is ignored because --config is given")
			if row.flag == "hostname-override" {
				if !reflect.DeepEqual(got, row.want) || warned {
					t.Errorf("with --config, %v: got %#v (warned %v), want %#v, not warned", row.args, got, warned, row.want)
				}
				return
			}
			if !reflect.DeepEqual(got, fromFile) {
				t.Errorf("with --config, %v: got %#v, want the file's %#v", row.args, got, fromFile)
			}
			if !warned {
				t.Errorf("with --config, %v: no warning that --%s is ignored; warnings: %q", row.args, row.flag, withFile.Warnings())
			}
		})
	}
}

func bindingFor(t *testing.T, o *Options, flag string) binding {
	t.Helper()
	for _, b := range o.bindings {
		if b.flag == flag {
			return b
		}
	}
	t.Fatalf("no binding for --%s", flag)
	return binding{}
}

// TestEveryBindingIsTested keeps precedenceRows complete and each binding's
// field path real, so a new flag cannot silently miss either.
func TestEveryBindingIsTested(t *testing.T) {
	o := testOptions("linux", nil)
	if _, err := parse(t, o); err != nil {
		t.Fatal(err)
	}
	var bound, tested []string
	for _, b := range o.bindings {
		bound = append(bound, b.flag)
		if !fieldExists(reflect.TypeFor[v1alpha1.KubeProxyConfiguration](), b.field) {
			t.Errorf("--%s claims field %q, which KubeProxyConfiguration does not have", b.flag, b.field)
		}
	}
	for _, r := range precedenceRows {
		tested = append(tested, r.flag)
	}
	sort.Strings(bound)
	sort.Strings(tested)
	if diff := cmp.Diff(bound, tested); diff != "" {
		t.Errorf("flags bound to the configuration vs flags in precedenceRows (-bound +tested):\n%s", diff)
	}
}

func fieldExists(t reflect.Type, path string) bool {
	for _, seg := range strings.Split(path, ".") {
		ft, ok := jsonFields(derefType(t))[seg]
		if !ok {
			return false
		}
		t = ft
	}
	return true
}

func TestFlagsWithoutConfigFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		goos string
		args []string
		get  func(o *Options) any
		want any
	}{
		{"mode defaults to iptables on linux", "linux", nil, func(o *Options) any { return o.ProxyMode() }, ModeIPTables},
		{"mode defaults to kernelspace on windows", "windows", nil, func(o *Options) any { return o.ProxyMode() }, ModeKernelspace},
		{"derived default follows --bind-address", "linux", []string{"--bind-address=::"}, func(o *Options) any { return o.Config.HealthzBindAddress }, "[::]:10256"},
		{"explicit empty healthz address disables the server", "linux", []string{"--healthz-bind-address="}, func(o *Options) any { _, ok := o.HealthzBindAddress(); return ok }, false},
		{"explicit zero sync period is kept for validation", "linux", []string{"--iptables-sync-period=0"}, func(o *Options) any { return o.SyncPeriod() }, time.Duration(0)},
		{"nodeport addresses are trimmed", "linux", []string{"--nodeport-addresses= 10.0.0.0/8 , fd00::/64"}, func(o *Options) any { return o.Config.NodePortAddresses }, []string{"10.0.0.0/8", "fd00::/64"}},
		// As upstream's ipvs proxier: no scheduler means rr.
		{"ipvs mode without a scheduler is round robin", "linux", []string{"--proxy-mode=ipvs"}, func(o *Options) any { return o.IPVSScheduler() }, "rr"},
		{"ipvs mode with a blank scheduler is round robin", "linux", []string{"--proxy-mode=ipvs", "--ipvs-scheduler= "}, func(o *Options) any { return o.IPVSScheduler() }, "rr"},
		{"the scheduler only counts in ipvs mode", "linux", []string{"--ipvs-scheduler=sh"}, func(o *Options) any { return o.IPVSScheduler() }, ""},
		// Upstream's flags-only configuration starts from one minSyncPeriod
		// of 1s whatever the mode; --ipvs-min-sync-period changes it.
		{"flags-only ipvs mode: minSyncPeriod 1s", "linux", []string{"--proxy-mode=ipvs"}, func(o *Options) any { return o.MinSyncPeriod() }, time.Second},
		{"flags-only ipvs mode: explicit zero minSyncPeriod kept", "linux", []string{"--proxy-mode=ipvs", "--ipvs-min-sync-period=0"}, func(o *Options) any { return o.MinSyncPeriod() }, time.Duration(0)},
		{"kproxy's own flags", "linux", []string{"--manifests=/m", "--dry-run", "--dry-run-output=state", "--cleanup", "--version", "--take-over-kube-proxy=false", "--full-sync-period=2h", "--master=https://api:6443"},
			func(o *Options) any {
				return []any{o.Manifests, o.DryRun, o.DryRunOutput, o.Cleanup, string(o.Version), o.TakeOverKubeProxy, o.FullSyncPeriod, o.ClientConnection().Master}
			},
			[]any{"/m", true, "state", true, "true", false, 2 * time.Hour, "https://api:6443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(tc.goos, nil)
			if _, err := parse(t, o, tc.args...); err != nil {
				t.Fatal(err)
			}
			if got := tc.get(o); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

// TestIPVSConfigFile: in a config file, mode ipvs without a scheduler is
// round robin too, and ipvs.minSyncPeriod keeps upstream's zero default.
func TestIPVSConfigFile(t *testing.T) {
	o := testOptions("linux", nil)
	if _, err := parse(t, o, "--config", writeConfig(t, "mode: ipvs\n")); err != nil {
		t.Fatal(err)
	}
	if got := o.IPVSScheduler(); got != "rr" {
		t.Errorf("IPVSScheduler = %q, want rr", got)
	}
	if got := o.MinSyncPeriod(); got != 0 {
		t.Errorf("MinSyncPeriod = %v, want 0 (ipvs.minSyncPeriod unset in the file)", got)
	}
	if w := o.ModeWarning(); !strings.Contains(w, `ipvs.scheduler "rr"`) {
		t.Errorf("ModeWarning %q does not name the rr scheduler", w)
	}
}

func TestNodeName(t *testing.T) {
	fileWithName := writeConfig(t, "hostnameOverride: ' File-Node '\n")
	for _, tc := range []struct {
		name     string
		args     []string
		hostname string
		hostErr  error
		want     string
		wantErr  string
	}{
		{name: "flag wins over the file", args: []string{"--config", fileWithName, "--hostname-override=Flag-Node"}, want: "flag-node"},
		{name: "file's hostnameOverride, trimmed and lowercased", args: []string{"--config", fileWithName}, want: "file-node"},
		{name: "OS hostname, trimmed and lowercased", hostname: " MyHost.Local ", want: "myhost.local"},
		{name: "explicitly empty flag falls back to the hostname", args: []string{"--hostname-override="}, hostname: "h", want: "h"},
		{name: "hostname failure", hostErr: errors.New("uname failed"), wantErr: "uname failed"},
		// As upstream: blank names are errors, an empty flag is no flag.
		{name: "blank flag is an error", args: []string{"--hostname-override=  "}, hostname: "h", wantErr: "empty --hostname-override is invalid"},
		{name: "blank flag is an error with --config too", args: []string{"--config", fileWithName, "--hostname-override= \t"}, wantErr: "empty --hostname-override is invalid"},
		{name: "empty flag keeps the file's name", args: []string{"--config", fileWithName, "--hostname-override="}, want: "file-node"},
		{name: "blank hostnameOverride in the file is an error", args: []string{"--config", writeConfig(t, "hostnameOverride: '  '\n")}, hostname: "h", wantErr: "hostnameOverride is only white space"},
		{name: "blank OS hostname is an error", hostname: " \n", wantErr: "the OS hostname is only white space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions("linux", nil)
			o.hostname = func() (string, error) { return tc.hostname, tc.hostErr }
			_, err := parse(t, o, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Complete error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.NodeName != tc.want {
				t.Errorf("NodeName = %q, want %q", o.NodeName, tc.want)
			}
		})
	}
}

func TestNetworkNameFromEnvironment(t *testing.T) {
	env := map[string]string{"KUBE_NETWORK": " vxlan0 "}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"kernelspace reads KUBE_NETWORK", []string{"--proxy-mode=kernelspace"}, "vxlan0"},
		{"the flag wins", []string{"--proxy-mode=kernelspace", "--network-name=l2"}, "l2"},
		{"iptables ignores it", []string{"--proxy-mode=iptables"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions("linux", env)
			if _, err := parse(t, o, tc.args...); err != nil {
				t.Fatal(err)
			}
			if got := o.Winkernel().NetworkName; got != tc.want {
				t.Errorf("NetworkName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLoggingFlagsAndFile(t *testing.T) {
	file := writeConfig(t, "logging:\n  verbosity: 3\n  vmodule:\n  - filePattern: cache*\n    verbosity: 6\n")
	for _, tc := range []struct {
		name                    string
		args                    []string
		wantV, wantVModule      string
		wantConfigV             uint32
		wantConfigVModulePrefix string
	}{
		{"file applies to klog", []string{"--config", file}, "3", "cache*=6", 3, "cache*"},
		{"flags win and are recorded", []string{"--config", file, "-v=5", "--vmodule=runner=4"}, "5", "runner=4", 5, "runner"},
		{"no file, no flags", nil, "0", "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetKlogFlags(t)
			o := testOptions("linux", nil)
			fs, err := parse(t, o, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got := fs.Lookup("v").Value.String(); got != tc.wantV {
				t.Errorf("-v = %q, want %q", got, tc.wantV)
			}
			if got := fs.Lookup("vmodule").Value.String(); got != tc.wantVModule {
				t.Errorf("--vmodule = %q, want %q", got, tc.wantVModule)
			}
			if got := uint32(o.Config.Logging.Verbosity); got != tc.wantConfigV {
				t.Errorf("logging.verbosity = %d, want %d", got, tc.wantConfigV)
			}
			var pattern string
			if len(o.Config.Logging.VModule) > 0 {
				pattern = o.Config.Logging.VModule[0].FilePattern
			}
			if pattern != tc.wantConfigVModulePrefix {
				t.Errorf("logging.vmodule[0] = %q, want %q", pattern, tc.wantConfigVModulePrefix)
			}
		})
	}
}

func TestCompleteReportsFileErrors(t *testing.T) {
	o := testOptions("linux", nil)
	_, err := parse(t, o, "--config", "testdata/bad/wrong-type.yaml")
	var de *DecodeError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "testdata/bad/wrong-type.yaml:") {
		t.Errorf("Complete error = %v, want the decode error naming file and line", err)
	}
}

// TestCompleteUnknownFieldIsAWarning: as upstream, a file whose only
// problems are unknown fields is decoded leniently, with one warning per
// field naming file, line and field.
func TestCompleteUnknownFieldIsAWarning(t *testing.T) {
	o := testOptions("linux", nil)
	if _, err := parse(t, o, "--config", "testdata/bad/unknown-field.yaml"); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	want := `config file testdata/bad/unknown-field.yaml (line 4): unknown field "iptables.masqueradeBits": ignored, as upstream kube-proxy's lenient decoding does`
	if w := o.Warnings(); !slices.Contains(w, want) {
		t.Errorf("Warnings = %q, want one %q", w, want)
	}
}

func TestShortAndLongVerbosityFlags(t *testing.T) {
	for _, args := range [][]string{{"-v=4"}, {"--v=4"}, {"-v", "4"}} {
		resetKlogFlags(t)
		o := testOptions("linux", nil)
		if _, err := parse(t, o, args...); err != nil {
			t.Fatal(err)
		}
		if o.Config.Logging.Verbosity != 4 {
			t.Errorf("%v: logging.verbosity = %d, want 4", args, o.Config.Logging.Verbosity)
		}
	}
}

// writeConfig writes a KubeProxyConfiguration with body after the type
// header to a temporary file and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := t.TempDir() + "/kproxy.yaml"
	doc := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + body
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
