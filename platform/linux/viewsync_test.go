package linux

import (
	"context"
	"io"
	"net/netip"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// viewSyncer is a Linux backend of either mode, as the tests drive it.
type viewSyncer interface {
	intent.Backend
	intent.DryRunner
	intent.ConnectionCounter
	Family() v1.IPFamily
	settings() (facts.Config, Host)
}

func (b *Backend) settings() (facts.Config, Host)    { return b.m.opts.Rules, b.host }
func (b *NFTBackend) settings() (facts.Config, Host) { return b.m.opts.Rules, b.host }

var (
	buildersMu sync.Mutex
	builders   = map[viewSyncer]*intent.Builder{}
)

// viewOf builds, as the app does, the View of b's family for snap and ch
// with b's own Builder: the settings of b's configuration, the local
// addresses its Host seam lists, the least-connection counts b reads.
func viewOf(b viewSyncer, snap *proxy.Snapshot, ch proxy.Changes, builder *intent.Builder) *intent.View {
	cfg, host := b.settings()
	local, _ := host.LocalAddresses()
	fv := snap.Family(b.Family())
	conns, changed := b.Connections(fv, ch)
	s := intent.Settings{MasqueradeAll: cfg.MasqueradeAll, DetectLocal: cfg.DetectLocal()}
	return builder.Build(intent.Input{Config: s.Config(b.Family(), snap.Node, local), Ports: fv, Node: snap.Node,
		LocalAddrs: local, Generation: snap.Generation, Changes: ch, Conns: conns, ConnsChanged: changed})
}

// syncSnap syncs b with snap and ch as the app does (see viewOf).
func syncSnap(ctx context.Context, b viewSyncer, snap *proxy.Snapshot, ch proxy.Changes) error {
	buildersMu.Lock()
	builder := builders[b]
	if builder == nil {
		builder = intent.NewBuilder(b.Family())
		builders[b] = builder
	}
	buildersMu.Unlock()
	return b.Sync(ctx, viewOf(b, snap, ch, builder))
}

// dryRunSnap writes b's dry run of snap (a full View of its own).
func dryRunSnap(b viewSyncer, w io.Writer, snap *proxy.Snapshot) error {
	return b.DryRun(w, viewOf(b, snap, proxy.Changes{Full: true}, intent.NewBuilder(b.Family())))
}

// fullView builds a full View of cfg's family for the given ports, node,
// local addresses and least-connection counts, with a fresh Builder.
func fullView(cfg facts.Config, fv *proxy.FamilyView, node proxy.Node, local []netip.Addr, conns map[proxy.ServicePortName]map[netip.AddrPort]int) *intent.View {
	s := intent.Settings{MasqueradeAll: cfg.MasqueradeAll, DetectLocal: cfg.DetectLocal()}
	return intent.NewBuilder(cfg.Family).Build(intent.Input{Config: s.Config(cfg.Family, node, local), Ports: fv, Node: node,
		LocalAddrs: local, Changes: proxy.Changes{Full: true}, Conns: conns})
}
