// Package modeconfig maps kproxy's configuration (config.Options) onto the
// configuration of each proxy mode's backend: the iptables and nftables
// planners' facts.Config, the HNS backend's windows.Options, and the intent
// settings a mode implies. kproxy's binary (its backends, dry runs and
// explain) and the kubectl plugin (explain from the API server) both use
// it, so that a node's plan is computed from one mapping wherever it is
// asked for.
package modeconfig

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// IPTables maps kproxy's configuration onto the iptables planner's for one
// IP family.
func IPTables(o *config.Options, family v1.IPFamily) facts.Config {
	c := facts.DefaultConfig(family)
	c.MasqueradeBit = o.MasqueradeBit()
	if c.FilterBit == c.MasqueradeBit {
		c.FilterBit = facts.DefaultMasqueradeBit
	}
	c.MasqueradeAll = o.MasqueradeAll()
	dl := o.DetectLocal()
	c.ClusterCIDRs = o.ClusterCIDRs()
	c.LocalDetect = string(dl.Mode)
	switch dl.Mode {
	case config.LocalModeBridgeInterface:
		c.LocalInterface = dl.BridgeInterface
	case config.LocalModeInterfaceNamePrefix:
		c.LocalInterface = dl.InterfaceNamePrefix
	}
	np := o.NodePortAddresses()
	c.NodePortPrimary = np.Primary
	if cidrs, all := np.ForFamily(family); !all {
		c.NodePortAddresses = cidrs
	}
	c.LocalhostNodePorts = family == v1.IPv4Protocol && o.LocalhostNodePorts() && np.IncludesIPv4Loopback()
	c.TCPBeLiberal = o.Conntrack().TCPBeLiberal
	return c
}

// NFTables is the nftables backend's configuration of one family: the
// settings both Linux modes share, masquerading fully random (nftables has
// always had it).
func NFTables(o *config.Options, fam v1.IPFamily) facts.Config {
	cfg := IPTables(o, fam)
	cfg.RandomFully = true
	return cfg
}

// HNS maps kproxy's configuration onto the HNS backend's for one IP family.
// h is nil for a dry run or a planned explanation; env's logger and metrics
// are the running proxy's (zero elsewhere).
func HNS(o *config.Options, family v1.IPFamily, h hns.HNS, env app.Env) windows.Options {
	w := o.Winkernel()
	opts := windows.Options{
		HNS:                   h,
		Family:                family,
		NetworkName:           w.NetworkName,
		SourceVIP:             w.SourceVIP,
		EnableDSR:             w.EnableDSR,
		RootHNSEndpointName:   w.RootHNSEndpointName,
		ForwardHealthCheckVIP: w.ForwardHealthCheckVIP,
		CheckPeriod:           o.SyncPeriod(),
		Logger:                env.Logger,
	}
	if env.Metrics != nil {
		opts.Metrics = env.Metrics
	}
	if hz, ok := o.HealthzBindAddress(); ok {
		opts.HealthzPort = int(hz.Port())
	}
	return opts
}

// PodsAlwaysKnown tells whether mode's platform tells pods from other
// clients whatever the detect-local setting: HNS sees which endpoint a
// packet comes from (see intent.Settings).
func PodsAlwaysKnown(mode string) bool {
	return mode == string(config.ModeKernelspace)
}

// PreservesDestination tells whether mode honours the Service annotation
// preserve-destination: HNS does, as upstream's Windows proxy; the Linux
// modes ignore it, as upstream's.
func PreservesDestination(mode string) bool {
	return mode == string(config.ModeKernelspace)
}

// Settings are the intent settings of o's mode.
func Settings(o *config.Options) intent.Settings {
	m := string(o.ProxyMode())
	return app.Settings(o, app.Mode{PodsAlwaysKnown: PodsAlwaysKnown(m), PreserveDestination: PreservesDestination(m)})
}
