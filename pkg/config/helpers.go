package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// The typed accessors below read o.Config. Call them after Validate: on an
// invalid configuration they skip entries that do not parse and never panic.

// ProxyMode returns the proxy mode kproxy runs: ModeIPTables, ModeNFTables
// or ModeKernelspace. ModeIPVS, which kproxy has no backend for, runs
// ModeIPTables; RequestedMode says what was asked.
func (o *Options) ProxyMode() v1alpha1.ProxyMode {
	switch m := o.RequestedMode(); m {
	case ModeIPVS:
		return ModeIPTables
	default:
		return m
	}
}

// RequestedMode is the configured mode (the OS's default when unset).
func (o *Options) RequestedMode() v1alpha1.ProxyMode {
	if o.Config.Mode == "" {
		return defaultMode(o.goos)
	}
	return o.Config.Mode
}

// SyncPeriod is the longest time between two syncs: the requested mode's
// (ipvs.syncPeriod in ipvs mode, nftables.syncPeriod in nftables mode,
// iptables.syncPeriod otherwise, kernelspace included), as upstream.
func (o *Options) SyncPeriod() time.Duration { return o.syncPeriods().SyncPeriod.Duration }

// MinSyncPeriod is the shortest time between two syncs, chosen as SyncPeriod.
func (o *Options) MinSyncPeriod() time.Duration { return o.syncPeriods().MinSyncPeriod.Duration }

// IPVSScheduler is ipvs.scheduler in ipvs mode ("" otherwise), with
// upstream's default: rr when it is empty. The caller maps it to the
// node-wide load-balancing algorithm (rr, sh, lc; others are not known).
func (o *Options) IPVSScheduler() string {
	if o.RequestedMode() != ModeIPVS {
		return ""
	}
	if s := strings.TrimSpace(o.Config.IPVS.Scheduler); s != "" {
		return s
	}
	return defaultIPVSScheduler
}

type periods struct{ SyncPeriod, MinSyncPeriod metav1.Duration }

func (o *Options) syncPeriods() periods {
	return modePeriods(o.Config)
}

// modePeriods returns the sync periods of c's mode.
func modePeriods(c *v1alpha1.KubeProxyConfiguration) periods {
	switch c.Mode {
	case ModeIPVS:
		return periods{c.IPVS.SyncPeriod, c.IPVS.MinSyncPeriod}
	case ModeNFTables:
		return periods{c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod}
	default:
		return periods{c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod}
	}
}

// modeSection is the configuration section holding c's mode's sync periods.
func modeSection(c *v1alpha1.KubeProxyConfiguration) string {
	switch c.Mode {
	case ModeIPVS:
		return "ipvs"
	case ModeNFTables:
		return "nftables"
	default:
		return "iptables"
	}
}

// ConfigSyncPeriod is the informers' resync period.
func (o *Options) ConfigSyncPeriod() time.Duration { return o.Config.ConfigSyncPeriod.Duration }

// ClusterCIDRs returns the pod CIDRs (at most one per family), masked, in
// the order given.
func (o *Options) ClusterCIDRs() []netip.Prefix {
	return parsePrefixes(strings.Split(o.Config.ClusterCIDR, ","))
}

// ClusterCIDR returns the pod CIDR of one family, if set.
func (o *Options) ClusterCIDR(family v1.IPFamily) (netip.Prefix, bool) {
	for _, p := range o.ClusterCIDRs() {
		if isFamily(p.Addr(), family) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// NodePortAddresses says on which node addresses NodePorts are accepted.
type NodePortAddresses struct {
	// Primary is set for the value "primary": only the node's primary IPs,
	// as listed in its Node object.
	Primary bool
	// CIDRs are the ranges given, masked, in order; empty for "every address".
	CIDRs []netip.Prefix
}

// NodePortAddresses returns the parsed nodePortAddresses.
func (o *Options) NodePortAddresses() NodePortAddresses {
	var n NodePortAddresses
	for _, s := range o.Config.NodePortAddresses {
		if strings.TrimSpace(s) == NodePortAddressesPrimary {
			n.Primary = true
		}
	}
	if !n.Primary {
		n.CIDRs = parsePrefixes(o.Config.NodePortAddresses)
	}
	return n
}

// ForFamily returns the CIDRs of one family that node addresses must be in,
// or all=true when every address of that family accepts NodePorts: when no
// CIDR of the family is given (even if the other family has some), or one
// of them is the zero CIDR. With Primary, it returns nothing and all=false:
// the caller selects the node's primary IP of the family.
func (n NodePortAddresses) ForFamily(family v1.IPFamily) (cidrs []netip.Prefix, all bool) {
	if n.Primary {
		return nil, false
	}
	for _, p := range n.CIDRs {
		if !isFamily(p.Addr(), family) {
			continue
		}
		if p.Bits() == 0 {
			return nil, true
		}
		cidrs = append(cidrs, p)
	}
	if len(cidrs) == 0 {
		return nil, true
	}
	return cidrs, false
}

// IncludesIPv4Loopback reports whether IPv4 NodePorts may be served on
// 127.0.0.1 as far as nodePortAddresses is concerned: every IPv4 address
// accepts NodePorts, or a CIDR covers a loopback address. Localhost NodePorts
// also need LocalhostNodePorts.
func (n NodePortAddresses) IncludesIPv4Loopback() bool {
	cidrs, all := n.ForFamily(v1.IPv4Protocol)
	if all {
		return true
	}
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	for _, p := range cidrs {
		if p.Overlaps(loopback) {
			return true
		}
	}
	return false
}

// MasqueradeBit is the packet-mark bit that flags packets to SNAT.
func (o *Options) MasqueradeBit() int {
	if o.Config.Mode == ModeNFTables {
		if b := o.Config.NFTables.MasqueradeBit; b != nil {
			return int(*b)
		}
		return DefaultMasqueradeBit
	}
	if b := o.Config.IPTables.MasqueradeBit; b != nil {
		return int(*b)
	}
	return DefaultMasqueradeBit
}

// MasqueradeMark is the packet mark for MasqueradeBit (1 << bit).
func (o *Options) MasqueradeMark() uint32 {
	b := o.MasqueradeBit()
	if b < 0 || b > maxMasqueradeBit {
		b = DefaultMasqueradeBit
	}
	return uint32(1) << uint(b)
}

// MasqueradeAll reports whether all traffic to ClusterIPs is SNATed.
// In nftables mode it is nftables.masqueradeAll, as upstream; in
// kernelspace mode it is false whatever the setting: HNS load balancers
// have no equivalent (docs/windows.md).
func (o *Options) MasqueradeAll() bool {
	switch o.ProxyMode() {
	case ModeNFTables:
		return o.Config.NFTables.MasqueradeAll
	case ModeKernelspace:
		return false
	}
	return o.Config.IPTables.MasqueradeAll
}

// LocalhostNodePorts reports whether IPv4 NodePorts are served on localhost
// (iptables mode; see also NodePortAddresses.IncludesIPv4Loopback).
func (o *Options) LocalhostNodePorts() bool {
	if p := o.Config.IPTables.LocalhostNodePorts; p != nil {
		return *p
	}
	return DefaultLocalhostNodePorts
}

// HealthzBindAddress returns the health check server's address; ok is false
// when the server is disabled (empty address).
func (o *Options) HealthzBindAddress() (addr netip.AddrPort, ok bool) {
	return parseAddrPort(o.Config.HealthzBindAddress)
}

// MetricsBindAddress returns the metrics server's address; ok is false when
// the server is disabled (empty address).
func (o *Options) MetricsBindAddress() (addr netip.AddrPort, ok bool) {
	return parseAddrPort(o.Config.MetricsBindAddress)
}

// BindAddressHardFail reports whether failing to bind a server port is fatal.
func (o *Options) BindAddressHardFail() bool { return o.Config.BindAddressHardFail }

// BindAddress returns bindAddress. A specific address overrides the node's
// primary IP of its family; an unspecified one (0.0.0.0 or ::) overrides
// nothing (setDefaults reads its family for the servers' default addresses).
func (o *Options) BindAddress() netip.Addr {
	a, err := netip.ParseAddr(o.Config.BindAddress)
	if err != nil {
		return netip.IPv4Unspecified()
	}
	return a.Unmap()
}

// OOMScoreAdj is the OOM score adjustment for the kproxy process (Linux).
func (o *Options) OOMScoreAdj() int32 {
	if p := o.Config.OOMScoreAdj; p != nil {
		return *p
	}
	return DefaultOOMScoreAdj
}

// DetectLocal says how traffic from local pods is recognised.
type DetectLocal struct {
	// Mode is one of the LocalMode* constants.
	Mode v1alpha1.LocalMode
	// ClusterCIDRs (for LocalModeClusterCIDR) are the pod CIDRs, one per family at most.
	ClusterCIDRs []netip.Prefix
	// BridgeInterface is set for LocalModeBridgeInterface.
	BridgeInterface string
	// InterfaceNamePrefix is set for LocalModeInterfaceNamePrefix.
	InterfaceNamePrefix string
}

// DetectLocal returns the local-traffic detection settings. For
// LocalModeNodeCIDR the CIDRs come from the Node object (snapshot), not from
// the configuration.
func (o *Options) DetectLocal() DetectLocal {
	d := DetectLocal{Mode: o.Config.DetectLocalMode}
	if d.Mode == "" {
		d.Mode = defaultDetectLocalMode
	}
	switch d.Mode {
	case LocalModeClusterCIDR:
		d.ClusterCIDRs = o.ClusterCIDRs()
	case LocalModeBridgeInterface:
		d.BridgeInterface = strings.TrimSpace(o.Config.DetectLocal.BridgeInterface)
	case LocalModeInterfaceNamePrefix:
		d.InterfaceNamePrefix = strings.TrimSpace(o.Config.DetectLocal.InterfaceNamePrefix)
	}
	return d
}

// Conntrack holds the conntrack settings (Linux). A zero duration means
// "leave the kernel's value".
type Conntrack struct {
	MaxPerCore            int32
	Min                   int32
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	TCPBeLiberal          bool
	UDPTimeout            time.Duration
	UDPStreamTimeout      time.Duration
}

// Conntrack returns the conntrack settings.
func (o *Options) Conntrack() Conntrack {
	c := o.Config.Conntrack
	out := Conntrack{
		MaxPerCore:       DefaultConntrackMaxPerCore,
		Min:              DefaultConntrackMin,
		TCPBeLiberal:     c.TCPBeLiberal,
		UDPTimeout:       c.UDPTimeout.Duration,
		UDPStreamTimeout: c.UDPStreamTimeout.Duration,
	}
	if c.MaxPerCore != nil {
		out.MaxPerCore = *c.MaxPerCore
	}
	if c.Min != nil {
		out.Min = *c.Min
	}
	if c.TCPEstablishedTimeout != nil {
		out.TCPEstablishedTimeout = c.TCPEstablishedTimeout.Duration
	}
	if c.TCPCloseWaitTimeout != nil {
		out.TCPCloseWaitTimeout = c.TCPCloseWaitTimeout.Duration
	}
	return out
}

// Max returns the conntrack table size to set on a machine with numCPU
// cores: MaxPerCore × numCPU, at least Min; 0 means "leave it alone"
// (MaxPerCore is 0).
func (c Conntrack) Max(numCPU int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	scaled := int(c.MaxPerCore) * numCPU
	if scaled < int(c.Min) {
		return int(c.Min)
	}
	return scaled
}

// Winkernel holds the Windows HNS settings (kernelspace mode).
type Winkernel struct {
	// NetworkName is the HNS network: --network-name, the config, or the
	// KUBE_NETWORK environment variable.
	NetworkName string
	// SourceVIP is the overlay source VIP (invalid Addr when unset).
	SourceVIP             netip.Addr
	EnableDSR             bool
	RootHNSEndpointName   string
	ForwardHealthCheckVIP bool
}

// Winkernel returns the HNS settings.
func (o *Options) Winkernel() Winkernel {
	w := o.Config.Winkernel
	out := Winkernel{
		NetworkName:           strings.TrimSpace(w.NetworkName),
		EnableDSR:             w.EnableDSR,
		RootHNSEndpointName:   w.RootHnsEndpointName,
		ForwardHealthCheckVIP: w.ForwardHealthCheckVip,
	}
	if a, err := netip.ParseAddr(strings.TrimSpace(w.SourceVip)); err == nil {
		out.SourceVIP = a.Unmap()
	}
	return out
}

// ClientConnection holds what is needed to build an API server client.
type ClientConnection struct {
	// Kubeconfig is the kubeconfig path ("" for in-cluster configuration).
	Kubeconfig string
	// Master overrides the kubeconfig's server ("" to keep it).
	Master             string
	ContentType        string
	AcceptContentTypes string
	QPS                float32
	Burst              int
}

// ClientConnection returns the API server connection settings.
func (o *Options) ClientConnection() ClientConnection {
	cc := o.Config.ClientConnection
	return ClientConnection{
		Kubeconfig:         cc.Kubeconfig,
		Master:             o.Master,
		ContentType:        cc.ContentType,
		AcceptContentTypes: cc.AcceptContentTypes,
		QPS:                cc.QPS,
		Burst:              int(cc.Burst),
	}
}

func parsePrefixes(in []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range in {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

func parseAddrPort(s string) (netip.AddrPort, bool) {
	if s == "" {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, false
	}
	return ap, true
}

func isFamily(a netip.Addr, family v1.IPFamily) bool {
	if family == v1.IPv6Protocol {
		return a.Is6() && !a.Is4In6()
	}
	return a.Unmap().Is4()
}
