package app

import (
	"fmt"
	"io"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Settings returns the node-wide settings the intent decisions read, from
// the configuration and what the mode's platform tells apart by itself.
func Settings(o *config.Options, mode Mode) intent.Settings {
	dl := o.DetectLocal()
	d := intent.DetectLocal{Mode: string(dl.Mode), ClusterCIDRs: o.ClusterCIDRs()}
	switch dl.Mode {
	case config.LocalModeBridgeInterface:
		d.Interface = dl.BridgeInterface
	case config.LocalModeInterfaceNamePrefix:
		d.Interface = dl.InterfaceNamePrefix
	}
	return intent.Settings{MasqueradeAll: o.MasqueradeAll(), DetectLocal: d, PodsAlwaysKnown: mode.PodsAlwaysKnown,
		PreserveDestination: mode.PreserveDestination}
}

// FullView builds, with a Builder of its own, the full View of family f for
// snap: what a dry run renders and kproxy explain traces, the same View the
// running proxy builds at a full sync.
func FullView(s intent.Settings, f v1.IPFamily, snap *proxy.Snapshot, local []netip.Addr) *intent.View {
	return intent.NewBuilder(f).Build(intent.Input{Config: s.Config(f, snap.Node, local), Ports: snap.Family(f),
		Node: snap.Node, LocalAddrs: local, Generation: snap.Generation, Changes: proxy.Changes{Full: true}})
}

// LocalAddrs lists the node's addresses the way mode does (none when the
// mode cannot read them here).
func LocalAddrs(mode Mode) ([]netip.Addr, error) {
	if mode.LocalAddrs == nil {
		return nil, nil
	}
	return mode.LocalAddrs()
}

// dryRun writes what the mode would program for snap: with
// --dry-run-output state the snapshot itself, otherwise each family's
// dry run of its full View.
func dryRun(o *config.Options, mode Mode, snap *proxy.Snapshot, w io.Writer) error {
	if o.DryRunOutput == config.DryRunState || mode.NewDryRun == nil {
		return proxy.WriteYAML(w, snap)
	}
	runners, err := mode.NewDryRun(o)
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	local, err := LocalAddrs(mode)
	if err != nil {
		return fmt.Errorf("dry run: listing local addresses: %w", err)
	}
	s := Settings(o, mode)
	for _, r := range runners {
		d, ok := r.Backend.(intent.DryRunner)
		if !ok {
			return fmt.Errorf("backend %T cannot render a dry run", r.Backend)
		}
		err = d.DryRun(w, FullView(s, r.Family, snap, local))
		if err != nil {
			return err
		}
	}
	return nil
}
