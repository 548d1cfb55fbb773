package config

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

var (
	v4 = v1.IPv4Protocol
	v6 = v1.IPv6Protocol
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// TestAccessors checks each typed accessor on defaults and on set values.
func TestAccessors(t *testing.T) {
	type kpc = v1alpha1.KubeProxyConfiguration
	for _, tc := range []struct {
		name   string
		goos   string
		mutate func(o *Options, c *kpc)
		get    func(o *Options) any
		want   any
	}{
		{"ProxyMode default linux", "linux", nil, func(o *Options) any { return o.ProxyMode() }, ModeIPTables},
		{"ProxyMode default windows", "windows", nil, func(o *Options) any { return o.ProxyMode() }, ModeKernelspace},
		{"ProxyMode empty falls back to the OS default", "windows", func(_ *Options, c *kpc) { c.Mode = "" }, func(o *Options) any { return o.ProxyMode() }, ModeKernelspace},
		{"SyncPeriod default", "linux", nil, func(o *Options) any { return o.SyncPeriod() }, 30 * time.Second},
		{"MinSyncPeriod default", "linux", nil, func(o *Options) any { return o.MinSyncPeriod() }, time.Second},
		{"ConfigSyncPeriod default", "linux", nil, func(o *Options) any { return o.ConfigSyncPeriod() }, 15 * time.Minute},
		{"ClusterCIDRs empty", "linux", nil, func(o *Options) any { return o.ClusterCIDRs() }, []netip.Prefix(nil)},
		{"ClusterCIDRs dual-stack, masked, spaces", "linux", func(_ *Options, c *kpc) { c.ClusterCIDR = " 10.244.1.7/16 , fd00:10:244::1/56" },
			func(o *Options) any { return o.ClusterCIDRs() }, prefixes("10.244.0.0/16", "fd00:10:244::/56")},
		{"ClusterCIDRs skips junk", "linux", func(_ *Options, c *kpc) { c.ClusterCIDR = "junk,fd00::/64" },
			func(o *Options) any { return o.ClusterCIDRs() }, prefixes("fd00::/64")},
		{"ClusterCIDR per family v6", "linux", func(_ *Options, c *kpc) { c.ClusterCIDR = "10.244.0.0/16,fd00::/64" },
			func(o *Options) any { p, ok := o.ClusterCIDR(v6); return []any{p, ok} }, []any{netip.MustParsePrefix("fd00::/64"), true}},
		{"ClusterCIDR per family missing", "linux", func(_ *Options, c *kpc) { c.ClusterCIDR = "fd00::/64" },
			func(o *Options) any { p, ok := o.ClusterCIDR(v4); return []any{p, ok} }, []any{netip.Prefix{}, false}},
		{"NodePortAddresses default: every address", "linux", nil, func(o *Options) any { return o.NodePortAddresses() }, NodePortAddresses{}},
		{"NodePortAddresses primary", "linux", func(_ *Options, c *kpc) { c.NodePortAddresses = []string{"primary"} },
			func(o *Options) any { return o.NodePortAddresses() }, NodePortAddresses{Primary: true}},
		{"NodePortAddresses CIDRs masked", "linux", func(_ *Options, c *kpc) { c.NodePortAddresses = []string{"10.1.2.3/24", "fd00::/64"} },
			func(o *Options) any { return o.NodePortAddresses() }, NodePortAddresses{CIDRs: prefixes("10.1.2.0/24", "fd00::/64")}},
		{"MasqueradeBit default", "linux", nil, func(o *Options) any { return o.MasqueradeBit() }, 14},
		{"MasqueradeMark default", "linux", nil, func(o *Options) any { return o.MasqueradeMark() }, uint32(0x4000)},
		{"MasqueradeMark bit 0", "linux", func(_ *Options, c *kpc) { c.IPTables.MasqueradeBit = ptr(int32(0)) }, func(o *Options) any { return o.MasqueradeMark() }, uint32(1)},
		{"MasqueradeMark bit 31", "linux", func(_ *Options, c *kpc) { c.IPTables.MasqueradeBit = ptr(int32(31)) }, func(o *Options) any { return o.MasqueradeMark() }, uint32(0x80000000)},
		{"MasqueradeMark invalid bit never panics", "linux", func(_ *Options, c *kpc) { c.IPTables.MasqueradeBit = ptr(int32(99)) }, func(o *Options) any { return o.MasqueradeMark() }, uint32(0x4000)},
		{"MasqueradeAll", "linux", func(_ *Options, c *kpc) { c.IPTables.MasqueradeAll = true }, func(o *Options) any { return o.MasqueradeAll() }, true},
		{"MasqueradeAll has no HNS equivalent", "windows", func(_ *Options, c *kpc) { c.IPTables.MasqueradeAll = true }, func(o *Options) any { return o.MasqueradeAll() }, false},
		{"LocalhostNodePorts default", "linux", nil, func(o *Options) any { return o.LocalhostNodePorts() }, true},
		{"LocalhostNodePorts off", "linux", func(_ *Options, c *kpc) { c.IPTables.LocalhostNodePorts = ptr(false) }, func(o *Options) any { return o.LocalhostNodePorts() }, false},
		{"LocalhostNodePorts unset", "linux", func(_ *Options, c *kpc) { c.IPTables.LocalhostNodePorts = nil }, func(o *Options) any { return o.LocalhostNodePorts() }, true},
		{"HealthzBindAddress default", "linux", nil, func(o *Options) any { a, ok := o.HealthzBindAddress(); return []any{a, ok} },
			[]any{netip.MustParseAddrPort("0.0.0.0:10256"), true}},
		{"HealthzBindAddress disabled", "linux", func(_ *Options, c *kpc) { c.HealthzBindAddress = "" },
			func(o *Options) any { _, ok := o.HealthzBindAddress(); return ok }, false},
		{"MetricsBindAddress default", "linux", nil, func(o *Options) any { a, ok := o.MetricsBindAddress(); return []any{a, ok} },
			[]any{netip.MustParseAddrPort("127.0.0.1:10249"), true}},
		{"MetricsBindAddress IPv6", "linux", func(_ *Options, c *kpc) { c.MetricsBindAddress = "[::]:9100" },
			func(o *Options) any { a, _ := o.MetricsBindAddress(); return a }, netip.MustParseAddrPort("[::]:9100")},
		{"BindAddress default", "linux", nil, func(o *Options) any { return o.BindAddress() }, netip.IPv4Unspecified()},
		{"BindAddress junk never panics", "linux", func(_ *Options, c *kpc) { c.BindAddress = "x" }, func(o *Options) any { return o.BindAddress() }, netip.IPv4Unspecified()},
		{"BindAddressHardFail", "linux", func(_ *Options, c *kpc) { c.BindAddressHardFail = true }, func(o *Options) any { return o.BindAddressHardFail() }, true},
		{"OOMScoreAdj default", "linux", nil, func(o *Options) any { return o.OOMScoreAdj() }, int32(-999)},
		{"DetectLocal default", "linux", func(_ *Options, c *kpc) { c.ClusterCIDR = "10.0.0.0/8" },
			func(o *Options) any { return o.DetectLocal() }, DetectLocal{Mode: LocalModeClusterCIDR, ClusterCIDRs: prefixes("10.0.0.0/8")}},
		{"DetectLocal bridge", "linux", func(_ *Options, c *kpc) {
			c.DetectLocalMode = LocalModeBridgeInterface
			c.DetectLocal.BridgeInterface = "cbr0"
			c.ClusterCIDR = "10.0.0.0/8"
		}, func(o *Options) any { return o.DetectLocal() }, DetectLocal{Mode: LocalModeBridgeInterface, BridgeInterface: "cbr0"}},
		{"DetectLocal prefix", "linux", func(_ *Options, c *kpc) {
			c.DetectLocalMode = LocalModeInterfaceNamePrefix
			c.DetectLocal.InterfaceNamePrefix = "veth"
		}, func(o *Options) any { return o.DetectLocal() }, DetectLocal{Mode: LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"}},
		{"DetectLocal node CIDR", "linux", func(_ *Options, c *kpc) { c.DetectLocalMode = LocalModeNodeCIDR; c.ClusterCIDR = "10.0.0.0/8" },
			func(o *Options) any { return o.DetectLocal() }, DetectLocal{Mode: LocalModeNodeCIDR}},
		{"Conntrack default", "linux", nil, func(o *Options) any { return o.Conntrack() }, Conntrack{
			MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}},
		{"Conntrack set", "linux", func(_ *Options, c *kpc) {
			c.Conntrack.MaxPerCore = ptr(int32(0))
			c.Conntrack.TCPBeLiberal = true
			c.Conntrack.UDPTimeout = metav1.Duration{Duration: time.Second}
			c.Conntrack.UDPStreamTimeout = metav1.Duration{Duration: time.Minute}
		}, func(o *Options) any { return o.Conntrack() }, Conntrack{
			MaxPerCore: 0, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
			TCPBeLiberal: true, UDPTimeout: time.Second, UDPStreamTimeout: time.Minute}},
		{"Winkernel default", "windows", nil, func(o *Options) any { return o.Winkernel() }, Winkernel{RootHNSEndpointName: "cbr0"}},
		{"Winkernel set", "windows", func(_ *Options, c *kpc) {
			c.Winkernel = v1alpha1.KubeProxyWinkernelConfiguration{NetworkName: " vxlan0 ", SourceVip: "10.244.0.2", EnableDSR: true, RootHnsEndpointName: "cbr1", ForwardHealthCheckVip: true}
		}, func(o *Options) any { return o.Winkernel() }, Winkernel{
			NetworkName: "vxlan0", SourceVIP: netip.MustParseAddr("10.244.0.2"), EnableDSR: true, RootHNSEndpointName: "cbr1", ForwardHealthCheckVIP: true}},
		{"ClientConnection", "linux", func(o *Options, c *kpc) { o.Master = "https://k:6443"; c.ClientConnection.Kubeconfig = "/k" },
			func(o *Options) any { return o.ClientConnection() }, ClientConnection{
				Kubeconfig: "/k", Master: "https://k:6443", ContentType: DefaultContentType, QPS: 5, Burst: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(tc.goos, nil)
			if tc.mutate != nil {
				tc.mutate(o, o.Config)
			}
			got := tc.get(o)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestNodePortAddressesForFamily(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         NodePortAddresses
		family    v1.IPFamily
		wantCIDRs []netip.Prefix
		wantAll   bool
		wantLoop  bool
	}{
		{"unset: all", NodePortAddresses{}, v4, nil, true, true},
		{"primary: the caller picks", NodePortAddresses{Primary: true}, v4, nil, false, false},
		{"family filter", NodePortAddresses{CIDRs: prefixes("10.0.0.0/8", "fd00::/64")}, v6, prefixes("fd00::/64"), false, false},
		{"no CIDR of the family: all of it", NodePortAddresses{CIDRs: prefixes("fd00::/64")}, v4, nil, true, true},
		{"zero CIDR: all", NodePortAddresses{CIDRs: prefixes("10.0.0.0/8", "0.0.0.0/0")}, v4, nil, true, true},
		{"loopback covered", NodePortAddresses{CIDRs: prefixes("127.0.0.1/32")}, v4, prefixes("127.0.0.1/32"), false, true},
		{"loopback not covered", NodePortAddresses{CIDRs: prefixes("10.0.0.0/8")}, v4, prefixes("10.0.0.0/8"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cidrs, all := tc.n.ForFamily(tc.family)
			if diff := cmp.Diff(tc.wantCIDRs, cidrs, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" || all != tc.wantAll {
				t.Errorf("ForFamily(%s) = %v, %v; want %v, %v", tc.family, cidrs, all, tc.wantCIDRs, tc.wantAll)
			}
			if got := tc.n.IncludesIPv4Loopback(); got != tc.wantLoop {
				t.Errorf("IncludesIPv4Loopback() = %v, want %v", got, tc.wantLoop)
			}
		})
	}
}

func TestConntrackMax(t *testing.T) {
	for _, tc := range []struct {
		perCore, min int32
		cpus, want   int
	}{
		{32768, 131072, 2, 131072},  // the floor wins on small machines
		{32768, 131072, 16, 524288}, // scaled
		{0, 131072, 16, 0},          // leave the kernel's limit
		{100, 0, 3, 300},
	} {
		c := Conntrack{MaxPerCore: tc.perCore, Min: tc.min}
		if got := c.Max(tc.cpus); got != tc.want {
			t.Errorf("Conntrack{MaxPerCore: %d, Min: %d}.Max(%d) = %d, want %d", tc.perCore, tc.min, tc.cpus, got, tc.want)
		}
	}
}

func TestWarnings(t *testing.T) {
	type kpc = v1alpha1.KubeProxyConfiguration
	for _, tc := range []struct {
		name   string
		mutate func(c *kpc)
		want   []string
	}{
		{"nothing to say", func(c *kpc) { c.ClusterCIDR = "10.0.0.0/8" }, nil},
		{"ignored fields", func(c *kpc) {
			c.ClusterCIDR = "10.0.0.0/8"
			c.FeatureGates = map[string]bool{"B": true, "A": false}
			c.PortRange = "30000-31000"
			c.ShowHiddenMetricsForVersion = "1.36"
			c.WindowsRunAsService = true
		}, []string{
			"featureGates are ignored: kproxy has no feature gates (A, B)",
			"portRange is ignored: it only applied to the removed userspace proxy",
			"showHiddenMetricsForVersion is ignored: kproxy hides no metrics",
			"windowsRunAsService in the config file is ignored, as upstream: use the --windows-service flag",
		}},
		{"no cluster CIDR for ClusterCIDR detection", func(*kpc) {}, []string{
			"detectLocalMode is ClusterCIDR but clusterCIDR is empty: local-traffic detection is off (off-cluster traffic to ClusterIPs is not masqueraded)",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions("linux", nil)
			tc.mutate(o.Config)
			if diff := cmp.Diff(tc.want, o.Warnings()); diff != "" {
				t.Errorf("Warnings (-want +got):\n%s", diff)
			}
		})
	}
}
