package windows

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

func overlaySnap() *proxy.Snapshot {
	s := wt.Snap(node(), wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080),
		wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))))
	s.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
	return s
}

func noSourceVIP(dataDir string) func(*Options) {
	return func(o *Options) {
		o.SourceVIP = netip.Addr{}
		o.CheckPeriod = 30 * time.Second
		if dataDir != "" {
			o.ReserveSourceVIP = ReserveInIPAMStore()
			o.IPAMDataDir = dataDir
		}
	}
}

// A fresh wt.Overlay node with no source VIP configured (flannel writes none):
// kproxy reserves one in the IPAM store and programs everything; a restart
// finds the same address and changes nothing.
func TestBackendReservesSourceVIPOnFreshOverlayNode(t *testing.T) {
	dataDir := wt.ScratchDir(t)
	dir := filepath.Join(dataDir, "net") // the store of the HNS network "net"
	h := newHarness(t, overlayNet(), wt.HNSModern, noSourceVIP(dataDir))
	s := overlaySnap()
	h.mustSync(s, proxy.Changes{Full: true})
	dump := h.f.Dump()
	if !strings.Contains(dump, "src=10.244.1.254") || !strings.Contains(dump, "ep 10.244.1.254 local name=kproxy-sourcevip-10.244.1.254") {
		t.Fatalf("want the reserved source VIP 10.244.1.254 programmed:\n%s", dump)
	}
	owner, err := os.ReadFile(filepath.Join(dir, "10.244.1.254"))
	if err != nil || !strings.HasPrefix(string(owner), SourceVIPReservationID+"\r\n") {
		t.Errorf("reservation file: %q, %v", owner, err)
	}
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined: %+v", q)
	}

	h.b = h.newBackend(noSourceVIP(dataDir)) // kproxy restarts
	calls := h.mustSync(s, proxy.Changes{Full: true})
	expectCalls(t, "restart", calls, listCalls+" Version=1")
	wt.MustEqual(t, "after the restart", h.f.Dump(), dump)
}

// On Calico, the Calico_ep endpoint's address is the source VIP; kproxy
// creates no endpoint of its own for it.
func TestBackendUsesCalicoEndpointAsSourceVIP(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern, noSourceVIP(""))
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.2"), "Calico_ep")
	h.mustSync(overlaySnap(), proxy.Changes{Full: true})
	dump := h.f.Dump()
	if !strings.Contains(dump, "src=10.244.1.2 ") || strings.Contains(dump, "sourcevip") {
		t.Fatalf("want Calico_ep's address as source VIP and no endpoint of kproxy's for it:\n%s", dump)
	}
}

// Neither a Calico endpoint nor a way to reserve: the sync succeeds (no
// /livez restart loop), every port is reported with the reason and each
// Service warned once; when Calico_ep appears, the next check period
// programs everything.
func TestBackendWithoutSourceVIPStaysHealthy(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern, noSourceVIP(""))
	s := overlaySnap()
	if _, err := h.sync(s, proxy.Changes{Full: true}); err != nil {
		t.Fatalf("sync without a source VIP must not fail (it would restart kproxy in a loop): %v", err)
	}
	q := h.b.Quarantined()
	if len(q) != 1 || q[0].Name.Name != "web" || !strings.Contains(q[0].Reason, "source VIP") {
		t.Fatalf("quarantined: %+v", q)
	}
	if strings.Join(h.warns, ",") != "ns/web "+plan.ReasonNoSourceVIP {
		t.Errorf("warnings: %v", h.warns)
	}
	if strings.Contains(h.f.Dump(), "lb ") {
		t.Errorf("nothing can be programmed without a source VIP:\n%s", h.f.Dump())
	}
	h.mustSync(s, changed)
	if len(h.warns) != 1 {
		t.Errorf("warned again: %v", h.warns)
	}

	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.2"), "Calico_ep")
	h.clock.Step(30 * time.Second)
	h.mustSync(s, proxy.Changes{})
	if !strings.Contains(h.f.Dump(), "src=10.244.1.2 ") {
		t.Fatalf("programmed once Calico_ep exists:\n%s", h.f.Dump())
	}
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("still quarantined: %+v", q)
	}
}

func TestHostLocalReservation(t *testing.T) {
	dir := wt.ScratchDir(t)
	r := HostLocalReservation{Dir: dir}
	// host-local gave .254 to a pod already; HNS has .253.
	if err := os.WriteFile(filepath.Join(dir, "10.244.1.254"), []byte("0123abcd\r\neth0"), 0o644); err != nil {
		t.Fatal(err)
	}
	avoid := func(ip netip.Addr) bool { return ip == wt.MustAddr("10.244.1.253") }
	ip, err := r.Reserve(netip.MustParsePrefix("10.244.1.0/24"), avoid)
	if err != nil || ip != wt.MustAddr("10.244.1.252") {
		t.Fatalf("Reserve: %v, %v; want 10.244.1.252", ip, err)
	}
	again, err := r.Reserve(netip.MustParsePrefix("10.244.1.0/24"), nil)
	if err != nil || again != ip {
		t.Fatalf("Reserve again: %v, %v; want the same %v", again, err, ip)
	}
	ip6, err := r.Reserve(netip.MustParsePrefix("fd00:244:1::/64"), nil)
	if err != nil || ip6 != wt.MustAddr("fd00:244:1::ffff:ffff:ffff:ffff") {
		t.Fatalf("Reserve IPv6: %v, %v", ip6, err)
	}
	// A /30 has two usable addresses: the gateway and one more.
	small := HostLocalReservation{Dir: filepath.Join(dir, "small")}
	if ip, err := small.Reserve(netip.MustParsePrefix("10.1.0.0/30"), nil); err != nil || ip != wt.MustAddr("10.1.0.2") {
		t.Fatalf("Reserve /30: %v, %v", ip, err)
	}
	full := HostLocalReservation{Dir: filepath.Join(dir, "full")}
	if _, err := full.Reserve(netip.MustParsePrefix("10.1.0.0/30"), func(netip.Addr) bool { return true }); err == nil {
		t.Fatal("Reserve in a full subnet must fail")
	}
}
