package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// validOptions returns completed, valid options for goos without flags.
func validOptions(goos string) *Options {
	o := testOptions(goos, nil)
	o.NodeName = "node-1"
	return o
}

func TestValidate(t *testing.T) {
	type kpc = v1alpha1.KubeProxyConfiguration
	for _, tc := range []struct {
		name   string
		mutate func(o *Options, c *kpc)
		want   []string // every field.Error, in order
	}{
		{name: "defaults are valid", mutate: func(*Options, *kpc) {}},
		{name: "logging formats text and json are valid", mutate: func(_ *Options, c *kpc) { c.Logging.Format = "json" }},
		{
			name:   "an unknown logging format is an error, as upstream",
			mutate: func(_ *Options, c *kpc) { c.Logging.Format = "xml" },
			want:   []string{`logging.format: Unsupported value: "xml": supported values: "text", "json"`},
		},
		{
			name:   "masquerade bit out of range",
			mutate: func(_ *Options, c *kpc) { c.IPTables.MasqueradeBit = ptr(int32(40)) },
			want:   []string{"iptables.masqueradeBit: Invalid value: 40: must be in the range [0, 31]"},
		},
		{
			name:   "masquerade bit bounds are valid",
			mutate: func(_ *Options, c *kpc) { c.IPTables.MasqueradeBit = ptr(int32(31)) },
		},
		{
			name: "sync periods",
			mutate: func(_ *Options, c *kpc) {
				c.IPTables.SyncPeriod.Duration = 0
				c.IPTables.MinSyncPeriod.Duration = -time.Second
				c.ConfigSyncPeriod.Duration = -time.Minute
			},
			want: []string{
				`iptables.syncPeriod: Invalid value: "0s": must be greater than 0`,
				`iptables.minSyncPeriod: Invalid value: "-1s": must be greater than or equal to 0`,
				`configSyncPeriod: Invalid value: "-1m0s": must be greater than 0`,
			},
		},
		{
			name: "minSyncPeriod above syncPeriod",
			mutate: func(_ *Options, c *kpc) {
				c.IPTables.SyncPeriod.Duration = 10 * time.Second
				c.IPTables.MinSyncPeriod.Duration = 20 * time.Second
			},
			want: []string{`iptables.minSyncPeriod: Invalid value: "20s": must not be greater than iptables.syncPeriod (10s)`},
		},
		{
			name:   "minSyncPeriod 0 is valid",
			mutate: func(_ *Options, c *kpc) { c.IPTables.MinSyncPeriod.Duration = 0 },
		},
		{
			name: "addresses",
			mutate: func(_ *Options, c *kpc) {
				c.BindAddress = "10.0.0.1:80"
				c.HealthzBindAddress = "0.0.0.0:0"
				c.MetricsBindAddress = "localhost:10249"
			},
			want: []string{
				`bindAddress: Invalid value: "10.0.0.1:80": must be an IP address`,
				`healthzBindAddress: Invalid value: "0.0.0.0:0": port "0" must be a number in [1, 65535]`,
				`metricsBindAddress: Invalid value: "localhost:10249": "localhost" is not an IP address`,
			},
		},
		{
			name: "missing port, and empty addresses disable servers",
			mutate: func(_ *Options, c *kpc) {
				c.HealthzBindAddress = ""
				c.MetricsBindAddress = "127.0.0.1"
			},
			want: []string{`metricsBindAddress: Invalid value: "127.0.0.1": must be IP:port`},
		},
		{
			name:   "IPv6 servers are valid",
			mutate: func(_ *Options, c *kpc) { c.HealthzBindAddress, c.MetricsBindAddress = "[::]:10256", "[::1]:10249" },
		},
		{
			name:   "cluster CIDR dual-stack pair is valid",
			mutate: func(_ *Options, c *kpc) { c.ClusterCIDR = "10.244.0.0/16, fd00:10:244::/56" },
		},
		{
			name:   "cluster CIDR not a CIDR",
			mutate: func(_ *Options, c *kpc) { c.ClusterCIDR = "10.244.0.0" },
			want:   []string{`clusterCIDR: Invalid value: "10.244.0.0": "10.244.0.0" is not a CIDR such as 10.244.0.0/16`},
		},
		{
			name:   "cluster CIDR same family twice",
			mutate: func(_ *Options, c *kpc) { c.ClusterCIDR = "10.244.0.0/16,10.245.0.0/16" },
			want:   []string{`clusterCIDR: Invalid value: "10.244.0.0/16,10.245.0.0/16": two CIDRs must be one IPv4 and one IPv6 (dual-stack)`},
		},
		{
			name:   "cluster CIDR three entries",
			mutate: func(_ *Options, c *kpc) { c.ClusterCIDR = "10.0.0.0/8,fd00::/64,10.1.0.0/16" },
			want:   []string{`clusterCIDR: Invalid value: "10.0.0.0/8,fd00::/64,10.1.0.0/16": must be one CIDR or a dual-stack pair such as 10.244.0.0/16,fd00:10:244::/56`},
		},
		{
			name: "nodePortAddresses entries",
			mutate: func(_ *Options, c *kpc) {
				c.NodePortAddresses = []string{"10.0.0.0/8", "primary", "10.1.2.3", "::1/128"}
			},
			want: []string{
				`nodePortAddresses[1]: Invalid value: "primary": "primary" cannot be combined with CIDRs`,
				`nodePortAddresses[2]: Invalid value: "10.1.2.3": must be a CIDR such as 10.0.0.0/8, or the single value "primary"`,
			},
		},
		{
			name:   "nodePortAddresses primary alone is valid",
			mutate: func(_ *Options, c *kpc) { c.NodePortAddresses = []string{"primary"} },
		},
		{
			name: "conntrack and oomScoreAdj",
			mutate: func(_ *Options, c *kpc) {
				c.Conntrack.MaxPerCore = ptr(int32(-1))
				c.Conntrack.Min = ptr(int32(-2))
				c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: -time.Second}
				c.Conntrack.UDPStreamTimeout.Duration = -time.Second
				c.OOMScoreAdj = ptr(int32(1001))
				c.ClientConnection.Burst = -1
			},
			want: []string{
				`oomScoreAdj: Invalid value: 1001: must be in the range [-1000, 1000]`,
				`clientConnection.burst: Invalid value: -1: must be greater than or equal to 0`,
				`conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0`,
				`conntrack.min: Invalid value: -2: must be greater than or equal to 0`,
				`conntrack.tcpEstablishedTimeout: Invalid value: "-1s": must be greater than or equal to 0`,
				`conntrack.udpStreamTimeout: Invalid value: "-1s": must be greater than or equal to 0`,
			},
		},
		{
			name:   "detectLocalMode unknown",
			mutate: func(_ *Options, c *kpc) { c.DetectLocalMode = "Guess" },
			want:   []string{`detectLocalMode: Unsupported value: "Guess": supported values: "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix"`},
		},
		{
			name:   "BridgeInterface needs a bridge",
			mutate: func(_ *Options, c *kpc) { c.DetectLocalMode = LocalModeBridgeInterface },
			want:   []string{`detectLocal.bridgeInterface: Required value: must be set when detectLocalMode is BridgeInterface`},
		},
		{
			name: "InterfaceNamePrefix needs a prefix",
			mutate: func(_ *Options, c *kpc) {
				c.DetectLocalMode = LocalModeInterfaceNamePrefix
				c.DetectLocal.InterfaceNamePrefix = " "
			},
			want: []string{`detectLocal.interfaceNamePrefix: Required value: must be set when detectLocalMode is InterfaceNamePrefix`},
		},
		{
			name: "source VIP checked in kernelspace mode",
			mutate: func(o *Options, c *kpc) {
				o.DryRun = true
				c.Mode = ModeKernelspace
				c.Winkernel.SourceVip = "10.0.0.300"
			},
			want: []string{`winkernel.sourceVip: Invalid value: "10.0.0.300": must be an IP address`},
		},
		{
			name:   "source VIP ignored in iptables mode",
			mutate: func(_ *Options, c *kpc) { c.Winkernel.SourceVip = "junk" },
		},
		{
			name:   "node name",
			mutate: func(o *Options, _ *kpc) { o.NodeName = "node_1" },
			want:   []string{`hostnameOverride: Invalid value: "node_1": node name a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`},
		},
		{
			name:   "node name unknown",
			mutate: func(o *Options, _ *kpc) { o.NodeName = "" },
			want:   []string{`hostnameOverride: Required value: the node name is unknown: call Complete, or set --hostname-override`},
		},
		{
			name:   "full sync period",
			mutate: func(o *Options, _ *kpc) { o.FullSyncPeriod = 0 },
			want:   []string{`--full-sync-period: Invalid value: "0s": must be greater than 0`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := validOptions("linux")
			tc.mutate(o, o.Config)
			err := o.Validate()
			var got []string
			if err != nil {
				var ve *ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("Validate error %T is not a *ValidationError: %v", err, err)
				}
				for _, fe := range ve.Errors {
					got = append(got, fe.Error())
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("validation errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidateMode(t *testing.T) {
	for _, tc := range []struct {
		goos   string
		mode   v1alpha1.ProxyMode
		dryRun bool
		want   string // "" for valid
	}{
		{"linux", "iptables", false, ""},
		{"windows", "kernelspace", false, ""},
		{"linux", "kernelspace", true, ""},
		{"windows", "iptables", true, ""},
		{"darwin", "iptables", true, ""},
		{"linux", "kernelspace", false, `mode: Invalid value: "kernelspace": kernelspace mode runs only on Windows (use iptables on Linux, or --dry-run to print the HNS plan)`},
		{"windows", "iptables", false, `mode: Invalid value: "iptables": iptables mode runs only on Linux (use kernelspace on Windows, or --dry-run to print the iptables rules)`},
		{"linux", "ipvs", false, ""},
		{"linux", "nftables", false, ""},
		{"windows", "nftables", true, ""},
		{"windows", "ipvs", false, `mode: Invalid value: "ipvs": runs only on Linux (use kernelspace on Windows)`},
		{"windows", "userspace", false, `mode: Unsupported value: "userspace": supported values: "iptables", "kernelspace", "ipvs", "nftables"`},
		{"linux", "", false, `mode: Required value`},
	} {
		t.Run(tc.goos+"/"+string(tc.mode), func(t *testing.T) {
			errs := validateMode(tc.mode, field.NewPath("mode"), tc.goos, tc.dryRun)
			got := ""
			if len(errs) > 0 {
				got = errs.ToAggregate().Error()
			}
			if got != tc.want {
				t.Errorf("validateMode(%q) on %s, dryRun=%v = %q, want %q", tc.mode, tc.goos, tc.dryRun, got, tc.want)
			}
		})
	}
}

// TestValidateListsEveryError checks that one Validate call reports every
// bad field of testdata/invalid/several.yaml, in a message kept as a golden file.
func TestValidateListsEveryError(t *testing.T) {
	o := testOptions("linux", nil)
	if _, err := parse(t, o, "--config", "testdata/invalid/several.yaml"); err != nil {
		t.Fatal(err)
	}
	err := o.Validate()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Validate error = %v, want a *ValidationError", err)
	}
	if len(ve.Errors) != 15 {
		t.Errorf("got %d errors, want 15", len(ve.Errors))
	}
	var fe *field.Error
	if !errors.As(err, &fe) {
		t.Error("errors.As cannot reach the *field.Error values")
	}
	golden(t, "invalid/several.golden", err.Error()+"\n")
}

func TestValidationErrorSingleLine(t *testing.T) {
	o := testOptions("linux", nil)
	if _, err := parse(t, o, "--iptables-masquerade-bit=40"); err != nil {
		t.Fatal(err)
	}
	err := o.Validate()
	const want = "invalid configuration: iptables.masqueradeBit: Invalid value: 40: must be in the range [0, 31] (set by --iptables-masquerade-bit)"
	if err == nil || err.Error() != want {
		t.Errorf("Validate() = %v, want %q", err, want)
	}
}

// TestProfilingOnlyOnLoopbackUnlessAllowed: --profiling with a metrics
// server reachable from the network is refused unless
// --profiling-allow-remote says so.
func TestProfilingOnlyOnLoopbackUnlessAllowed(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--profiling"}, true}, // default metrics address 127.0.0.1:10249
		{[]string{"--profiling", "--metrics-bind-address=0.0.0.0:10249"}, false},
		{[]string{"--profiling", "--metrics-bind-address=0.0.0.0:10249", "--profiling-allow-remote"}, true},
		{[]string{"--metrics-bind-address=0.0.0.0:10249"}, true},
	} {
		o := testOptions("linux", nil)
		if _, err := parse(t, o, tc.args...); err != nil {
			t.Fatal(err)
		}
		err := o.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "--profiling-allow-remote")) {
			t.Errorf("%q: Validate() = %v, want ok %v", tc.args, err, tc.ok)
		}
	}
}

// TestDeprecatedPortFlags: --healthz-port and --metrics-port as upstream:
// 0 disables the server, another port applies to a bare IP, and neither
// applies with --config.
func TestDeprecatedPortFlags(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		healthz, metr string
	}{
		{[]string{"--healthz-port=0"}, "", "127.0.0.1:10249"},
		{[]string{"--metrics-port=0"}, "0.0.0.0:10256", ""},
		{[]string{"--healthz-bind-address=10.0.0.1", "--healthz-port=12345"}, "10.0.0.1:12345", "127.0.0.1:10249"},
		// As upstream: the port flag does not change an address with a port.
		{[]string{"--healthz-port=12345"}, "0.0.0.0:10256", "127.0.0.1:10249"},
		{[]string{"--config=" + fullFile, "--healthz-port=0"}, "192.168.1.10:10256", "127.0.0.2:9100"},
	} {
		o := testOptions("linux", nil)
		if _, err := parse(t, o, tc.args...); err != nil {
			t.Fatal(err)
		}
		if o.Config.HealthzBindAddress != tc.healthz || o.Config.MetricsBindAddress != tc.metr {
			t.Errorf("%q: healthz %q metrics %q, want %q %q", tc.args, o.Config.HealthzBindAddress, o.Config.MetricsBindAddress, tc.healthz, tc.metr)
		}
	}
}
