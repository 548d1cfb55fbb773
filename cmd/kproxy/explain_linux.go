package main

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux"
)

// liveIptablesTracer reads the nat and filter tables of fam with
// iptables-save (the flavour the host uses) and the node's addresses.
func liveIptablesTracer(ctx context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily) (explain.Tracer, []netip.Addr, error) {
	sys, err := linux.NewSystem(fam, linux.FlavourAuto)
	if err != nil {
		return nil, nil, fmt.Errorf("%s iptables tools: %w", fam, err)
	}
	local, err := sys.Host.LocalAddresses()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var save []byte
	for _, table := range []string{"nat", "filter"} {
		out, err := sys.Iptables.Save(ctx, table)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the %s table: %w", table, err)
		}
		save = append(save, out...)
	}
	t, err := linux.LiveIptables(iptablesConfig(o, fam), snap, local, save)
	return t, local, err
}
