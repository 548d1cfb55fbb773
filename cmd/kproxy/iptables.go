package main

import (
	"errors"
	"os/exec"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// iptablesConfig maps kproxy's configuration onto the iptables planner's for
// one IP family.
func iptablesConfig(o *config.Options, family v1.IPFamily) facts.Config {
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

// classifyIPTablesError names the cause of an iptables backend's sync
// error: a tool (iptables-restore, iptables-save) that ran and exited with
// an error status rejected what kproxy asked; other errors are left to
// metrics.Classify.
func classifyIPTablesError(err error) metrics.Cause {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return metrics.CauseRejected
	}
	return ""
}
