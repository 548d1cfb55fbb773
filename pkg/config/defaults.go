package config

import (
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// The proxy modes kproxy implements.
const (
	// DryRunRules prints, with --dry-run, what the backend would program.
	DryRunRules = "rules"
	// DryRunState prints, with --dry-run, the node-local desired state.
	DryRunState = "state"

	// ModeIPTables programs Linux iptables (nat and filter tables).
	ModeIPTables v1alpha1.ProxyMode = "iptables"
	// ModeKernelspace programs Windows HNS load balancers.
	ModeKernelspace v1alpha1.ProxyMode = "kernelspace"
	// ModeIPVS is upstream's ipvs mode: accepted on Linux, where kproxy runs
	// its iptables backend instead (warned).
	ModeIPVS v1alpha1.ProxyMode = "ipvs"
	// ModeNFTables programs a Linux nftables table of kproxy's own per IP
	// family (kproxy's nftables backend).
	ModeNFTables v1alpha1.ProxyMode = "nftables"
)

// The ways to tell traffic from local pods (detectLocalMode).
const (
	LocalModeClusterCIDR         v1alpha1.LocalMode = "ClusterCIDR"
	LocalModeNodeCIDR            v1alpha1.LocalMode = "NodeCIDR"
	LocalModeBridgeInterface     v1alpha1.LocalMode = "BridgeInterface"
	LocalModeInterfaceNamePrefix v1alpha1.LocalMode = "InterfaceNamePrefix"
)

// NodePortAddressesPrimary is the special nodePortAddresses value that limits
// NodePorts to the node's primary IPs (from its Node object).
const NodePortAddressesPrimary = "primary"

// Default values, as upstream kube-proxy has them for the v1alpha1 API.
const (
	DefaultHealthzPort         = 10256
	DefaultMetricsPort         = 10249
	DefaultMasqueradeBit       = 14
	DefaultSyncPeriod          = 30 * time.Second
	DefaultMinSyncPeriod       = 1 * time.Second
	DefaultConfigSyncPeriod    = 15 * time.Minute
	DefaultConntrackMaxPerCore = 32 * 1024
	DefaultConntrackMin        = 128 * 1024
	DefaultTCPEstablished      = 24 * time.Hour
	DefaultTCPCloseWait        = 1 * time.Hour
	DefaultOOMScoreAdj         = -999
	DefaultQPS                 = 5.0
	DefaultBurst               = 10
	DefaultContentType         = "application/vnd.kubernetes.protobuf"
	DefaultRootHNSEndpointName = "cbr0"
	DefaultFullSyncPeriod      = 1 * time.Hour
	DefaultTakeOverKubeProxy   = true
	DefaultLocalhostNodePorts  = true
	defaultIPVSScheduler       = "rr" // upstream's ipvs proxier's, for an empty ipvs.scheduler
	defaultBindAddress         = "0.0.0.0"
	kubeProxyConfigAPIVersion  = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyConfigKind        = "KubeProxyConfiguration"
	kubeNetworkEnv             = "KUBE_NETWORK"
	windowsGOOS                = "windows"
	healthzDefaultIPv4         = "0.0.0.0"
	healthzDefaultIPv6         = "::"
	metricsDefaultIPv4         = "127.0.0.1"
	metricsDefaultIPv6         = "::1"
	defaultDetectLocalMode     = LocalModeClusterCIDR
	maxOOMScoreAdj             = 1000
	minOOMScoreAdj             = -1000
	maxMasqueradeBit           = 31
)

// NewDefault returns an empty configuration with every default applied for
// this platform.
func NewDefault() *v1alpha1.KubeProxyConfiguration {
	c := &v1alpha1.KubeProxyConfiguration{}
	SetDefaults(c)
	return c
}

// SetDefaults fills every field kproxy uses that is unset (zero) with
// upstream kube-proxy's default. The proxy mode defaults by operating system:
// kernelspace on Windows, iptables elsewhere. SetDefaults is idempotent.
func SetDefaults(c *v1alpha1.KubeProxyConfiguration) {
	setDefaults(c, runtime.GOOS)
}

func setDefaults(c *v1alpha1.KubeProxyConfiguration, goos string) {
	if c.APIVersion == "" {
		c.APIVersion = kubeProxyConfigAPIVersion
	}
	if c.Kind == "" {
		c.Kind = kubeProxyConfigKind
	}
	if c.Mode == "" {
		c.Mode = defaultMode(goos)
	}
	if c.BindAddress == "" {
		c.BindAddress = defaultBindAddress
	}
	healthzIP, metricsIP := healthzDefaultIPv4, metricsDefaultIPv4
	if ip, err := netip.ParseAddr(c.BindAddress); err == nil && ip.Unmap().Is6() {
		healthzIP, metricsIP = healthzDefaultIPv6, metricsDefaultIPv6
	}
	c.HealthzBindAddress = defaultHostPort(c.HealthzBindAddress, healthzIP, DefaultHealthzPort)
	c.MetricsBindAddress = defaultHostPort(c.MetricsBindAddress, metricsIP, DefaultMetricsPort)

	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptr(int32(DefaultOOMScoreAdj))
	}
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = ptr(int32(DefaultMasqueradeBit))
	}
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = ptr(DefaultLocalhostNodePorts)
	}
	setDuration(&c.IPTables.SyncPeriod, DefaultSyncPeriod)
	setDuration(&c.IPTables.MinSyncPeriod, DefaultMinSyncPeriod)
	// As upstream: ipvs.minSyncPeriod has no default (0).
	setDuration(&c.IPVS.SyncPeriod, DefaultSyncPeriod)
	setDuration(&c.NFTables.SyncPeriod, DefaultSyncPeriod)
	setDuration(&c.NFTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = ptr(int32(DefaultMasqueradeBit))
	}
	if c.Mode == ModeNFTables && len(c.NodePortAddresses) == 0 {
		// Upstream's default in nftables mode.
		c.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	setDuration(&c.ConfigSyncPeriod, DefaultConfigSyncPeriod)

	if c.Conntrack.MaxPerCore == nil {
		c.Conntrack.MaxPerCore = ptr(int32(DefaultConntrackMaxPerCore))
	}
	if c.Conntrack.Min == nil {
		c.Conntrack.Min = ptr(int32(DefaultConntrackMin))
	}
	if c.Conntrack.TCPEstablishedTimeout == nil {
		c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: DefaultTCPEstablished}
	}
	if c.Conntrack.TCPCloseWaitTimeout == nil {
		c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: DefaultTCPCloseWait}
	}

	if c.DetectLocalMode == "" {
		c.DetectLocalMode = defaultDetectLocalMode
	}
	if c.Winkernel.RootHnsEndpointName == "" {
		c.Winkernel.RootHnsEndpointName = DefaultRootHNSEndpointName
	}

	if c.ClientConnection.ContentType == "" {
		c.ClientConnection.ContentType = DefaultContentType
	}
	if c.ClientConnection.QPS == 0 {
		c.ClientConnection.QPS = DefaultQPS
	}
	if c.ClientConnection.Burst == 0 {
		c.ClientConnection.Burst = DefaultBurst
	}
}

func defaultMode(goos string) v1alpha1.ProxyMode {
	if goos == windowsGOOS {
		return ModeKernelspace
	}
	return ModeIPTables
}

func setDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

// defaultHostPort returns defIP:port for an empty address, addr:port for a
// bare IP, and addr unchanged otherwise (validation judges it).
func defaultHostPort(addr, defIP string, port int) string {
	if addr == "" {
		return net.JoinHostPort(defIP, strconv.Itoa(port))
	}
	return appendPortIfNeeded(addr, port)
}

// appendPortIfNeeded adds port to a bare IP address ("10.0.0.1" or "::1");
// anything else is returned unchanged.
func appendPortIfNeeded(addr string, port int) string {
	if _, err := netip.ParseAddrPort(addr); err == nil {
		return addr
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	return netip.AddrPortFrom(ip, uint16(port)).String()
}

func ptr[T any](v T) *T { return &v }
