package main

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/explaincmd"
	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

func examplesSnapshot(t *testing.T, mode string) (*config.Options, *proxy.Snapshot) {
	t.Helper()
	fs := newTestFlags(t, "--manifests", filepath.Join("..", "..", "docs", "examples"), "--hostname-override", "node1", "--proxy-mode", mode)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap, err := app.Snapshot(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	return fs, snap
}

func newTestFlags(t *testing.T, args ...string) *config.Options {
	t.Helper()
	o := tableOptionsFromArgs(t, args)
	return o
}

// TestExplainLiveIptablesDrift: --live over iptables-save output names what
// differs from the plan: nothing when the kernel holds the plan, the missing
// jump after an external flush of nat PREROUTING (and then nothing handles
// traffic arriving for a ClusterIP), every table without kproxy's chains after
// --cleanup, and a foreign rule in front of a jump.
func TestExplainLiveIptablesDrift(t *testing.T) {
	o, snap := examplesSnapshot(t, "iptables")
	local := []netip.Addr{netip.MustParseAddr("192.168.50.11"), netip.MustParseAddr("127.0.0.1")}
	cfg := modeconfig.IPTables(o, v1.IPv4Protocol)
	planned, err := linux.PlannedIptables(cfg, explaincmd.FullView(o, snap, v1.IPv4Protocol, local))
	if err != nil {
		t.Fatal(err)
	}
	save := planned.Save()
	q := explain.Query{To: netip.MustParseAddrPort("10.96.0.10:80"), Protocol: v1.ProtocolTCP,
		From: netip.MustParseAddr("10.244.1.5"), Origin: explain.FromPod, NodeAddrs: local}
	var liveText func(t *testing.T, save string, edit func(*iptmodel.Ruleset)) *explain.Result

	live := func(t *testing.T, edit func(*iptmodel.Ruleset)) *explain.Result {
		t.Helper()
		return liveText(t, save, edit)
	}
	liveText = func(t *testing.T, save string, edit func(*iptmodel.Ruleset)) *explain.Result {
		t.Helper()
		rs, err := iptmodel.Parse([]byte(save))
		if err != nil {
			t.Fatal(err)
		}
		edit(rs)
		v := explaincmd.FullView(o, snap, v1.IPv4Protocol, local)
		tr, err := linux.LiveIptables(cfg, v, []byte(rs.Save("nat")+rs.Save("filter")))
		if err != nil {
			t.Fatal(err)
		}
		res, err := explain.Explain("iptables", true, v, q, tr)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	t.Run("as planned", func(t *testing.T) {
		res := live(t, func(*iptmodel.Ruleset) {})
		if len(res.Drift) != 0 || res.Verdict != explain.DNAT || len(res.Targets) != 2 {
			t.Errorf("verdict %s targets %v drift %v, want DNAT to 2 endpoints and no drift", res.Verdict, res.Targets, res.Drift)
		}
	})
	t.Run("PREROUTING flushed", func(t *testing.T) {
		// iptables -t nat -F PREROUTING
		var kept []string
		for _, l := range strings.Split(save, "\n") {
			if !strings.HasPrefix(l, "-A PREROUTING ") {
				kept = append(kept, l)
			}
		}
		res := liveText(t, strings.Join(kept, "\n"), func(*iptmodel.Ruleset) {})
		if res.Verdict != explain.NotHandled {
			t.Errorf("verdict %s, want not handled", res.Verdict)
		}
		if len(res.Drift) != 1 || !strings.Contains(res.Drift[0], "missing jump in nat/PREROUTING") || !strings.Contains(res.Drift[0], "KPROXY-SERVICES") {
			t.Errorf("drift %q, want the missing PREROUTING jump only", res.Drift)
		}
	})
	t.Run("cleaned up", func(t *testing.T) {
		res := live(t, func(rs *iptmodel.Ruleset) { *rs = *iptmodel.New() })
		if res.Verdict != explain.NotHandled || res.Frontend == nil {
			t.Errorf("verdict %s frontend %v, want not handled for the Service's ClusterIP", res.Verdict, res.Frontend)
		}
		d := strings.Join(res.Drift, "\n")
		if !strings.Contains(d, "table nat has no KPROXY chain") || !strings.Contains(d, "table filter has no KPROXY chain") || !strings.Contains(d, "missing jump") {
			t.Errorf("drift %q, want both tables without kproxy's chains and the missing jumps", res.Drift)
		}
	})
	t.Run("foreign rule in front, stale chain", func(t *testing.T) {
		res := live(t, func(rs *iptmodel.Ruleset) {
			if err := rs.Insert("nat", "PREROUTING", 1, "-d", "10.96.0.10/32", "-j", "ACCEPT"); err != nil {
				t.Fatal(err)
			}
			if err := rs.Restore([]byte("*nat\n:KPROXY-SVC-OLD - [0:0]\nCOMMIT\n"), true); err != nil {
				t.Fatal(err)
			}
		})
		d := strings.Join(res.Drift, "\n")
		if !strings.Contains(d, "foreign rule in front of kproxy's jump to KPROXY-SERVICES in nat/PREROUTING: -A PREROUTING -d 10.96.0.10/32 -j ACCEPT") ||
			!strings.Contains(d, "stale chain nat/KPROXY-SVC-OLD") {
			t.Errorf("drift %q, want the foreign rule and the stale chain", res.Drift)
		}
		if res.Verdict != explain.NotHandled {
			t.Errorf("verdict %s, want not handled (the foreign ACCEPT wins)", res.Verdict)
		}
	})
}

// TestExplainLiveHNS: --live in kernelspace mode reads HNS through the
// backend's HNS interface (here the fake): after a sync it agrees with the
// plan; a load balancer deleted behind kproxy's back is named, and the
// connection is then not handled.
func TestExplainLiveHNS(t *testing.T) {
	o, snap := examplesSnapshot(t, "kernelspace")
	f := fakehns.New(hns.Version{Major: 15, Minor: 5})
	netID := f.AddNetwork(hns.Network{Name: "cbr0", Type: hns.NetworkTypeL2Bridge})
	f.AddEndpoint(hns.Endpoint{HostComputeNetwork: netID, Name: "web-1", IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.1.10"}}})
	for name, ip := range map[string]string{"ingress-1": "10.244.1.20", "draining-1": "10.244.1.30", "api-1": "10.244.1.40"} {
		f.AddEndpoint(hns.Endpoint{HostComputeNetwork: netID, Name: name, IPConfigurations: []hns.IPConfig{{IPAddress: ip}}})
	}
	o.Config.Winkernel.NetworkName = "cbr0"
	opts := modeconfig.HNS(o, v1.IPv4Protocol, f, app.Env{})
	opts.Interfaces = func() ([]windows.HostInterface, error) {
		return []windows.HostInterface{{Name: "Ethernet", MAC: "00-15-5d-00-00-01", Addrs: []netip.Addr{netip.MustParseAddr("192.168.50.11")}}}, nil
	}
	b, err := windows.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(context.Background(), windows.FullView(v1.IPv4Protocol, snap)); err != nil {
		t.Fatal(err)
	}
	q := explain.Query{To: netip.MustParseAddrPort("10.96.0.10:80"), Protocol: v1.ProtocolTCP,
		From: netip.MustParseAddr("10.244.1.5"), Origin: explain.FromPod, NodeAddrs: snap.Node.Addresses}
	run := func() *explain.Result {
		v := windows.FullView(v1.IPv4Protocol, snap)
		tr, err := b.Explainer(v, true)
		if err != nil {
			t.Fatal(err)
		}
		res, err := explain.Explain("kernelspace", true, v, q, tr)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := run()
	if res.Verdict != explain.DNAT || len(res.Targets) != 2 || len(res.Drift) != 0 {
		var buf bytes.Buffer
		_ = explain.WriteText(&buf, res)
		t.Fatalf("after a sync: want DNAT to 2 endpoints, no drift:\n%s", buf.String())
	}
	for _, lb := range f.LoadBalancers() {
		if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == "10.96.0.10" {
			if err := f.DeleteLoadBalancer(lb.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	res = run()
	if res.Verdict != explain.NotHandled || len(res.Drift) != 1 || !strings.Contains(res.Drift[0], "missing load balancer v4 TCP 10.96.0.10:80") {
		t.Errorf("after deleting the load balancer: verdict %s drift %q, want not handled and the missing load balancer", res.Verdict, res.Drift)
	}
}
