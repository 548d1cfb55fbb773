package windows

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// Settings are the intent settings of the kernelspace mode with default
// options: HNS applies a ClusterIP's load balancer to this node's pods and
// to the node itself, so pods are always told apart from other clients;
// --masquerade-all has no HNS equivalent (see config.Options.MasqueradeAll);
// the preserve-destination annotation is honoured.
var Settings = intent.Settings{PodsAlwaysKnown: true, PreserveDestination: true}

// Views builds one family's intent views from snapshots the way the app
// does for the kernelspace mode, for callers that hold snapshots rather
// than a running app (check-hns, the winkernel comparison, tests). Like the
// app's, successive views share every port that did not change.
type Views struct {
	b *intent.Builder
}

// NewViews returns a Views of family f.
func NewViews(f v1.IPFamily) *Views { return &Views{b: intent.NewBuilder(f)} }

// Of returns the view of snap, ch being what changed since the snapshot of
// the previous call.
func (vs *Views) Of(snap *proxy.Snapshot, ch proxy.Changes) *intent.View {
	f := vs.b.Family()
	return vs.b.Build(intent.Input{Config: Settings.Config(f, snap.Node, nil), Ports: snap.Family(f),
		Node: snap.Node, Generation: snap.Generation, Changes: ch})
}

// FullView returns the full view of family f of snap.
func FullView(f v1.IPFamily, snap *proxy.Snapshot) *intent.View {
	return NewViews(f).Of(snap, proxy.Changes{Full: true})
}
