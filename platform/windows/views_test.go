package windows

import (
	"context"
	"reflect"
	"sync"
	"testing"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
	v1 "k8s.io/api/core/v1"
)

// testViews holds, for each backend under test, its intent views and the
// last snapshot synced, so that successive syncs share unchanged ports as
// the app's views do.
var testViews sync.Map // *Backend → *testSyncer

type testSyncer struct {
	views *Views
	last  *proxy.Snapshot
}

// syncSnap syncs b to the intent view of snap. The tests build a new
// snapshot for each sync and say only whether something changed (ch), so
// the ports that changed are found by comparing snap with the snapshot of
// b's previous syncSnap; when ch says something changed and no port did,
// the view says the node changed (as a Node event would), so that the
// backend syncs.
func syncSnap(ctx context.Context, b *Backend, snap *proxy.Snapshot, ch proxy.Changes) error {
	v, _ := testViews.LoadOrStore(b, &testSyncer{views: NewViews(b.opts.Family)})
	ts := v.(*testSyncer)
	real := proxy.Changes{Full: ch.Full, Node: ch.Node, Ports: map[proxy.ServicePortName]struct{}{}}
	for n := range ch.Ports {
		if n != (proxy.ServicePortName{}) {
			real.Ports[n] = struct{}{}
		}
	}
	if ts.last != nil {
		f := b.opts.Family
		for sp := range snap.Family(f).All() {
			if old := ts.last.Family(f).Get(sp.Name); old == nil || !reflect.DeepEqual(old, sp) {
				real.Ports[sp.Name] = struct{}{}
			}
		}
		for old := range ts.last.Family(f).All() {
			if snap.Family(f).Get(old.Name) == nil {
				real.Ports[old.Name] = struct{}{}
			}
		}
		if !reflect.DeepEqual(ts.last.Node, snap.Node) {
			real.Node = true
		}
	}
	if !ch.Empty() && real.Empty() {
		real.Node = true
	}
	ts.last = snap
	return b.Sync(ctx, ts.views.Of(snap, real))
}

func TestTestSettingsAreTheModes(t *testing.T) {
	if !reflect.DeepEqual(wt.Settings, Settings) {
		t.Errorf("wintest.Settings %+v, windows.Settings %+v", wt.Settings, Settings)
	}
}

// The backend reports only what HNS cannot do: the view's own problems
// (here an invalid protocol) are the app's to report, once, with the
// view; the plan still lists both, for a dry run and explain.
func TestUnsupportedLeavesTheViewsProblemsToTheApp(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	snap := wt.Snap(node(),
		wt.SvcPort("bad", "ICMP", "10.96.0.20", 80, wt.Eps(wt.LocalEP("10.244.1.5", 80))),
		wt.SvcPort("empty", v1.ProtocolTCP, "10.96.0.21", 80))
	v := FullView(v1.IPv4Protocol, snap)
	if err := h.b.Sync(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	reasons := func(us []proxy.Unsupported) (out []string) {
		for _, u := range us {
			out = append(out, u.Service.Name+" "+u.Reason)
		}
		return out
	}
	if got, want := reasons(v.Problems()), []string{"bad InvalidServicePort"}; !reflect.DeepEqual(got, want) {
		t.Errorf("view problems %v, want %v", got, want)
	}
	if got, want := reasons(h.b.Unsupported()), []string{"empty " + plan.ReasonRejectUnsupported}; !reflect.DeepEqual(got, want) {
		t.Errorf("backend reports %v, want %v (the view's problems are the app's)", got, want)
	}
	var both []string
	for _, w := range h.b.plan.Warnings {
		both = append(both, w.Service.Name+" "+w.Reason)
	}
	if want := []string{"bad InvalidServicePort", "empty " + plan.ReasonRejectUnsupported}; !reflect.DeepEqual(both, want) {
		t.Errorf("plan warnings %v, want %v", both, want)
	}
}
