package explaincmd

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// traced is a mode's explain tracer for one family, the intent View its
// programming was made from, and the node's addresses (where NodePorts are
// served).
type traced struct {
	tracer    explain.Tracer
	view      *intent.View
	nodeAddrs []netip.Addr
}

// newTracer builds a mode's explain tracer for one family, planned or live.
type newTracer func(ctx context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily, live bool) (traced, error)

// modes are the modes explain covers. A mode is a tracer
// (plan → trace).
func modes() map[string]newTracer {
	return map[string]newTracer{
		string(config.ModeIPTables):    iptablesTracer,
		string(config.ModeNFTables):    nftablesTracer,
		string(config.ModeKernelspace): kernelspaceTracer,
	}
}

// plannedNodeAddrs are the node's addresses in a planned explanation: the
// Node object's, and loopback.
func plannedNodeAddrs(snap *proxy.Snapshot) []netip.Addr {
	return append(append([]netip.Addr(nil), snap.Node.Addresses...), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
}

// FullView is the full intent View of fam for snap on a node with these
// addresses, as the running proxy of o's mode builds it.
func FullView(o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily, local []netip.Addr) *intent.View {
	return app.FullView(modeconfig.Settings(o), fam, snap, local)
}

func iptablesTracer(ctx context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily, live bool) (traced, error) {
	if live {
		return liveIptablesTracer(ctx, o, snap, fam)
	}
	local := plannedNodeAddrs(snap)
	v := FullView(o, snap, fam, local)
	t, err := linux.PlannedIptables(modeconfig.IPTables(o, fam), v)
	return traced{t, v, local}, err
}

func nftablesTracer(ctx context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily, live bool) (traced, error) {
	if live {
		return liveNFTablesTracer(ctx, o, snap, fam)
	}
	local := plannedNodeAddrs(snap)
	v := FullView(o, snap, fam, local)
	t, err := linux.PlannedNFT(modeconfig.NFTables(o, fam), v)
	return traced{t, v, local}, err
}

func kernelspaceTracer(_ context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily, live bool) (traced, error) {
	var h hns.HNS
	if live {
		var err error
		if h, err = hns.NewHNS(); err != nil {
			return traced{}, fmt.Errorf("--live needs HNS (a Windows node): %w", err)
		}
	}
	t, v, err := HNSTracer(o, snap, fam, h, live)
	return traced{t, v, snap.Node.Addresses}, err
}

// HNSTracer is kernelspaceTracer with the HNS given (nil for planned without
// HNS; a fake HNS in tests); it returns the tracer and the intent View it
// traces.
func HNSTracer(o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily, h hns.HNS, live bool) (explain.Tracer, *intent.View, error) {
	opts := modeconfig.HNS(o, fam, h, app.Env{})
	if opts.NetworkName == "" {
		opts.NetworkName = "dry-run"
	}
	b, err := windows.New(opts)
	if err != nil {
		return nil, nil, err
	}
	v := FullView(o, snap, fam, nil)
	t, err := b.Explainer(v, live)
	if err != nil {
		return nil, nil, err
	}
	return t, v, nil
}
