package config

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// linuxDefaults is the fully defaulted empty configuration on Linux, spelled out.
func linuxDefaults() *v1alpha1.KubeProxyConfiguration {
	c := &v1alpha1.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
		Mode:               "iptables",
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		OOMScoreAdj:        ptr(int32(-999)),
		ConfigSyncPeriod:   metav1.Duration{Duration: 15 * time.Minute},
		DetectLocalMode:    "ClusterCIDR",
	}
	c.IPTables.MasqueradeBit = ptr(int32(14))
	c.IPTables.LocalhostNodePorts = ptr(true)
	c.IPTables.SyncPeriod.Duration = 30 * time.Second
	c.IPTables.MinSyncPeriod.Duration = time.Second
	c.IPVS.SyncPeriod.Duration = 30 * time.Second
	c.NFTables.SyncPeriod.Duration = 30 * time.Second
	c.NFTables.MinSyncPeriod.Duration = time.Second
	c.NFTables.MasqueradeBit = ptr(int32(14))
	c.Conntrack.MaxPerCore = ptr(int32(32768))
	c.Conntrack.Min = ptr(int32(131072))
	c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	c.Winkernel.RootHnsEndpointName = "cbr0"
	c.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	c.ClientConnection.QPS = 5
	c.ClientConnection.Burst = 10
	return c
}

func TestSetDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		goos string
		in   func(c *v1alpha1.KubeProxyConfiguration)
		want func(c *v1alpha1.KubeProxyConfiguration)
	}{
		{
			name: "empty on linux",
			goos: "linux",
			in:   func(*v1alpha1.KubeProxyConfiguration) {},
			want: func(*v1alpha1.KubeProxyConfiguration) {},
		},
		{
			name: "empty on windows: kernelspace",
			goos: "windows",
			in:   func(*v1alpha1.KubeProxyConfiguration) {},
			want: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = "kernelspace" },
		},
		{
			name: "IPv6 bind address: servers default to IPv6",
			goos: "linux",
			in:   func(c *v1alpha1.KubeProxyConfiguration) { c.BindAddress = "fd00::1" },
			want: func(c *v1alpha1.KubeProxyConfiguration) {
				c.BindAddress = "fd00::1"
				c.HealthzBindAddress = "[::]:10256"
				c.MetricsBindAddress = "[::1]:10249"
			},
		},
		{
			name: "bare IPs get the default ports",
			goos: "linux",
			in: func(c *v1alpha1.KubeProxyConfiguration) {
				c.HealthzBindAddress = "10.0.0.1"
				c.MetricsBindAddress = "::1"
			},
			want: func(c *v1alpha1.KubeProxyConfiguration) {
				c.HealthzBindAddress = "10.0.0.1:10256"
				c.MetricsBindAddress = "[::1]:10249"
			},
		},
		{
			name: "set values are kept",
			goos: "linux",
			in: func(c *v1alpha1.KubeProxyConfiguration) {
				c.Mode = "kernelspace"
				c.HealthzBindAddress = "127.0.0.1:1"
				c.IPTables.MasqueradeBit = ptr(int32(0))
				c.IPTables.LocalhostNodePorts = ptr(false)
				c.IPTables.SyncPeriod.Duration = time.Minute
				c.Conntrack.MaxPerCore = ptr(int32(0))
				c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{}
				c.DetectLocalMode = "NodeCIDR"
				c.ClientConnection.QPS = 50
			},
			want: func(c *v1alpha1.KubeProxyConfiguration) {
				c.Mode = "kernelspace"
				c.HealthzBindAddress = "127.0.0.1:1"
				c.IPTables.MasqueradeBit = ptr(int32(0))
				c.IPTables.LocalhostNodePorts = ptr(false)
				c.IPTables.SyncPeriod.Duration = time.Minute
				c.Conntrack.MaxPerCore = ptr(int32(0))
				c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{}
				c.DetectLocalMode = "NodeCIDR"
				c.ClientConnection.QPS = 50
			},
		},
		{
			name: "an unparsable address is left for validation",
			goos: "linux",
			in:   func(c *v1alpha1.KubeProxyConfiguration) { c.MetricsBindAddress = "localhost" },
			want: func(c *v1alpha1.KubeProxyConfiguration) { c.MetricsBindAddress = "localhost" },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := &v1alpha1.KubeProxyConfiguration{}
			tc.in(got)
			setDefaults(got, tc.goos)
			want := linuxDefaults()
			tc.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("setDefaults (-want +got):\n%s", diff)
			}
			again := got.DeepCopy()
			setDefaults(again, tc.goos)
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("setDefaults is not idempotent (-first +second):\n%s", diff)
			}
		})
	}
}

func TestNewOptionsDefaults(t *testing.T) {
	o := testOptions("linux", nil)
	if diff := cmp.Diff(linuxDefaults(), o.Config); diff != "" {
		t.Errorf("NewOptions().Config (-want +got):\n%s", diff)
	}
	if !o.TakeOverKubeProxy || o.FullSyncPeriod != time.Hour {
		t.Errorf("TakeOverKubeProxy = %v, FullSyncPeriod = %v; want true, 1h", o.TakeOverKubeProxy, o.FullSyncPeriod)
	}
	if NewDefault().Mode == "" {
		t.Error("NewDefault() left the mode empty")
	}
}
