package windows

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

// What a real HNS does that kproxy must survive (issue 24): one test per
// failure found reading the code, each on the fake HNS, which now does it
// too. They run on Linux and under Wine (make test-windows).

// lbWithHealthCheck: a LoadBalancer Service whose ingress IP gets a
// forwarded health check on the healthz port (10256), and a UDP DNS
// Service programmed after it (the DNS Service of issue 24).
func lbWithHealthCheck() *proxy.Snapshot {
	return wt.Snap(node(),
		wt.SvcPort("ingress", v1.ProtocolTCP, "10.96.0.20", 80, wt.LBIPs("203.0.113.7"), wt.Eps(wt.LocalEP("10.244.1.5", 8080))),
		wt.SvcPort("kube-dns", v1.ProtocolUDP, "10.96.0.10", 53, wt.Eps(wt.LocalEP("10.244.1.6", 53), wt.RemoteEP("10.244.2.9", 53))),
	)
}

// A load balancer HNS refuses with "already exists" even after a listing
// (Windows Server 2019 with forwardHealthCheckVip: the healthz port is held
// by a host socket) is that load balancer's quarantine: every other
// operation still runs, the sync succeeds, and it is retried with backoff.
// Before: apply stopped at it, so the load balancers after it (the UDP DNS
// one) were never created.
func TestBackendPersistentConflictIsQuarantined(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern, func(o *Options) {
		o.ForwardHealthCheckVIP = true
		o.RootHNSEndpointName = "pod-b" // 10.244.1.6 stands for the root endpoint
	})
	h.f.HoldHostPort(hns.ProtocolTCP, 10256)
	calls := h.mustSync(lbWithHealthCheck(), proxy.Changes{Full: true})
	dump := h.f.Dump()
	for _, want := range []string{"lb UDP 10.96.0.10:53 -> 53", "lb TCP 203.0.113.7:80 -> 8080", "lb TCP 10.96.0.20:80 -> 8080"} {
		if !strings.Contains(dump, want) {
			t.Errorf("%q not programmed past the refused health check load balancer:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, ":10256") {
		t.Errorf("the health check load balancer cannot exist while the port is held:\n%s", dump)
	}
	if calls[hns.OpListLoadBalancers] != 2 {
		t.Errorf("calls %s: want one listing more after the conflict", callsString(calls))
	}
	q := h.b.Quarantined()
	if len(q) != 1 || q[0].Name.Name != "ingress" || !strings.Contains(q[0].Reason, "port already exists") {
		t.Fatalf("quarantined: %+v, want the ingress Service's port for its health check", q)
	}

	// Retried with backoff: the creation, and after its conflict one
	// listing and the creation again; nothing else.
	h.clock.Step(QuarantineInitialBackoff)
	calls = h.mustSync(lbWithHealthCheck(), proxy.Changes{})
	expectCalls(t, "retry", calls, "CreateLoadBalancer=2 "+listCalls)
	if q := h.b.Quarantined(); len(q) != 1 || !q[0].Retry.Equal(h.clock.Now().Add(2*QuarantineInitialBackoff)) {
		t.Errorf("quarantined after the retry: %+v, want the backoff doubled", q)
	}
	// The host socket goes: the next retry programs it.
	h.f.ReleaseHostPort(hns.ProtocolTCP, 10256)
	h.clock.Step(2 * QuarantineInitialBackoff)
	h.mustSync(lbWithHealthCheck(), proxy.Changes{})
	if !strings.Contains(h.f.Dump(), "lb TCP 203.0.113.7:10256 -> 10256") {
		t.Errorf("after the port was released:\n%s", h.f.Dump())
	}
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined after the retry: %+v", q)
	}
}

// A creation "not found" (an endpoint gone under kproxy's feet) that
// stays so after a listing is quarantined too, and the rest programmed.
func TestBackendPersistentNotFoundIsQuarantined(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	notFound := hns.NewError(hns.OpCreateLoadBalancer, hns.CodeEndpointNotFound, errors.New("endpoint not found"))
	h.f.RejectLoadBalancers(func(lb *hns.LoadBalancer) error {
		if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == "10.96.0.10" {
			return notFound
		}
		return nil
	})
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	dump := h.f.Dump()
	if !strings.Contains(dump, "lb UDP 10.96.0.53:53") || !strings.Contains(dump, "lb TCP *:30080") {
		t.Errorf("the other load balancers must be programmed:\n%s", dump)
	}
	if q := h.b.Quarantined(); len(q) != 1 || q[0].Name.Name != "web" {
		t.Errorf("quarantined: %+v, want web's port", q)
	}
}

// A creation that fails half-way leaves a load balancer holding its port
// but listed without port mapping (malformed): kproxy owns it and deletes
// it before the creation that needs the port. Before: malformed orphans
// were deleted only in the last phase, after that creation had failed on
// them, so the slot stayed blocked.
func TestBackendPartlyCreatedLoadBalancerIsDeletedFirst(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.f.CreatePartially(1, hns.NewError(hns.OpCreateLoadBalancer, hns.CodeInvalidArg, errors.New("failed half-way")))
	h.mustSync(webAndDNS(), proxy.Changes{Full: true}) // the first creation (web's NodePort) fails half-way
	if q := h.b.Quarantined(); len(q) != 1 {
		t.Fatalf("quarantined: %+v, want the half-created load balancer's port", q)
	}
	if !strings.Contains(h.f.Dump(), "partial") {
		t.Fatalf("the fake must hold a partly created load balancer:\n%s", h.f.Dump())
	}
	h.clock.Step(QuarantineInitialBackoff)
	calls := h.mustSync(webAndDNS(), proxy.Changes{})
	wt.MustEqual(t, "after the retry", h.f.Dump(), webAndDNSDump)
	if calls[hns.OpDeleteLoadBalancer] != 1 {
		t.Errorf("retry: calls %s, want the partial load balancer deleted", callsString(calls))
	}
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined after the retry: %+v", q)
	}
}

// HNS restores its objects after its own restart (kubernetes#139519):
// kproxy, having found them gone, creates them again and meets "already
// exists"; one listing adopts what HNS restored, and nothing is left
// quarantined or duplicated.
func TestBackendObjectsRestoredAfterHNSRestart(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern, func(o *Options) { o.CheckPeriod = 30 * time.Second })
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	// Restored once the check has listed, before kproxy's creations.
	h.f.RestartRestoring(len(strings.Fields(checkCalls)) + len(strings.Fields(listCalls)) + 1)
	h.clock.Step(30 * time.Second)
	if _, err := h.sync(webAndDNS(), proxy.Changes{}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	wt.MustEqual(t, "after HNS restored its objects", h.f.Dump(), webAndDNSDump)
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined: %+v", q)
	}
	expectCalls(t, "then nothing", h.mustSync(webAndDNS(), changed), "")
}

// HNS not running answers 0x6b5 (RPC_S_UNKNOWN_IF, the code upstream
// checks): transient, so the sync fails and is retried whole, and nothing
// is quarantined or reported as rejected. Before: 0x6b5 was "Other", and
// the creations refused while HNS restarted were quarantined.
func TestBackendHNSNotRunningIsTransient(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	h.f.StopService(-1)
	churned := webAndDNS(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.6", 8080))
	_, err := h.sync(churned, changed)
	if !hns.IsTransient(err) {
		t.Fatalf("got %v, want a transient error", err)
	}
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined while HNS was not running: %+v", q)
	}
	h.f.Up()
	h.mustSync(churned, changed)
	wt.MustEqual(t, "once HNS runs again", h.f.Dump(), strings.NewReplacer("10.244.3.5", "10.244.3.6").Replace(webAndDNSDump))
}

// A source VIP endpoint HNS refuses: the overlay load balancers that would
// use it are not programmed with it; they are quarantined, reported with
// the reason, the rest is programmed and the sync succeeds. Before: the
// load balancers were programmed with a source VIP no endpoint held,
// nothing was quarantined, and health stayed silent.
func TestBackendRefusedSourceVIPEndpointQuarantinesOverlayLBs(t *testing.T) {
	h := newHarness(t, overlayNet(), wt.HNSModern)
	h.f.RejectEndpoints(func(ep *hns.Endpoint) error {
		if strings.HasPrefix(ep.Name, "kproxy-sourcevip-") {
			return hns.NewError(hns.OpCreateEndpoint, hns.CodeInvalidArg, errors.New("the parameter is incorrect"))
		}
		return nil
	})
	s := wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))),
		// Backed by another node's IP: its load balancer's source is the node IP.
		wt.SvcPort("hostnet", v1.ProtocolTCP, "10.96.0.11", 80, wt.Eps(wt.RemoteEP("10.0.0.2", 8080))),
	)
	h.mustSync(s, proxy.Changes{Full: true})
	dump := h.f.Dump()
	if strings.Contains(dump, "src=10.244.1.250") {
		t.Errorf("a load balancer uses the refused source VIP:\n%s", dump)
	}
	if !strings.Contains(dump, "lb TCP 10.96.0.11:80 -> 8080 flags=0 pflags=0 dist=0 src=10.0.0.1") {
		t.Errorf("the load balancer that does not use the source VIP must be programmed:\n%s", dump)
	}
	q := h.b.Quarantined()
	if len(q) != 1 || q[0].Name.Name != "web" || !strings.Contains(q[0].Reason, "source VIP endpoint 10.244.1.250") {
		t.Fatalf("quarantined: %+v, want web's port, saying the source VIP endpoint was refused", q)
	}
	h.f.RejectEndpoints(nil)
	h.clock.Step(QuarantineInitialBackoff)
	h.mustSync(s, proxy.Changes{})
	if !strings.Contains(h.f.Dump(), "lb TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 src=10.244.1.250") {
		t.Errorf("once HNS accepts the source VIP endpoint:\n%s", h.f.Dump())
	}
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined after the retry: %+v", q)
	}
}

// flannelCNI is the node's CNI configuration: flannel's conflist, network
// "cbr0" (its store is <dataDir>/cbr0), while the HNS network flanneld
// creates is "vxlan0".
func flannelCNI(t *testing.T) func() (*CNIConfig, error) {
	t.Helper()
	dir := wt.ScratchDir(t)
	conf := `{"name":"cbr0","cniVersion":"0.3.0","plugins":[{"type":"flannel","delegate":{"type":"win-overlay","policies":[]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "10-flannel.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() (*CNIConfig, error) { return ReadCNIConfig([]string{filepath.Join(dir, "missing"), dir}) }
}

// The source VIP is reserved in host-local's real store: the one the CNI
// configuration names (<dataDir>/<conflist name>), where the plugin
// allocates pods' addresses. Before: it went to <dataDir>/<HNS network
// name>, which the plugin never reads when the names differ, so a pod could
// get the source VIP.
func TestBackendReservesSourceVIPInTheCNIStore(t *testing.T) {
	dataDir := wt.ScratchDir(t)
	h := newHarness(t, overlayNet(), wt.HNSModern, noSourceVIP(dataDir), func(o *Options) { o.CNIConfig = flannelCNI(t) })
	h.mustSync(overlaySnap(), proxy.Changes{Full: true})
	if _, err := os.Stat(filepath.Join(dataDir, "cbr0", "10.244.1.254")); err != nil {
		t.Errorf("no reservation in the CNI network's store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "net")); err == nil {
		t.Errorf("a store named after the HNS network was written")
	}
	if !strings.Contains(h.f.Dump(), "src=10.244.1.254") {
		t.Errorf("want the reserved source VIP programmed:\n%s", h.f.Dump())
	}
}

// With no network name configured, the network the CNI configuration names
// wins over "the only L2Bridge/Overlay network": flannel's bootstrap
// "External" network of the same type beside it no longer makes the choice
// ambiguous. Before: kproxy refused to choose.
func TestBackendPrefersTheNetworkTheCNINames(t *testing.T) {
	f := fakehns.New(wt.HNSModern)
	f.AddNetwork(hns.Network{Name: "External", Type: hns.NetworkTypeL2Bridge})
	id := f.AddNetwork(hns.Network{Name: "cbr0", Type: hns.NetworkTypeL2Bridge})
	f.AddLocalEndpoint(id, wt.MustAddr("10.244.1.5"), "pod-a")
	f.AddLocalEndpoint(id, wt.MustAddr("10.244.1.6"), "pod-b")
	b, err := New(Options{HNS: f, CNIConfig: flannelCNI(t), Interfaces: func() ([]HostInterface, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, b: b}
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	wt.MustEqual(t, "programmed on the network the CNI names", f.Dump(), webAndDNSDump)

	// Without the CNI configuration, the same host is ambiguous (as before).
	b2, _ := New(Options{HNS: f, Interfaces: func() ([]HostInterface, error) { return nil, nil }})
	if err := syncSnap(t.Context(), b2, webAndDNS(), proxy.Changes{Full: true}); !errors.Is(err, ErrNoNetwork) {
		t.Errorf("without the CNI configuration: %v, want ErrNoNetwork", err)
	}
}

// A field HNS returns with another value than the one sent (a changed
// echo) is learned: the full listings after it reprogram nothing. Before:
// the load balancer was deleted and created again at every full listing.
// With the learned echoes kept on disk, a restart reprograms nothing
// either.
func TestBackendLearnsChangedEchoes(t *testing.T) {
	for _, v := range []hns.Version{wt.HNSModern, {Major: 15, Minor: 4}} {
		t.Run(v.String(), func(t *testing.T) {
			echoes := filepath.Join(wt.ScratchDir(t), "echoes.json")
			withEchoFile := func(o *Options) { o.EchoFile = echoes }
			h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, v, withEchoFile)
			// This HNS returns the NodePort's flags (VIPExternalIP |
			// LocalRoutedVIP, 18) with the ILB bit too.
			h.f.RewriteOnRead(fakehns.Rewrite{Field: hns.FieldPortFlags, From: 18, To: 19})
			h.mustSync(webAndDNS(), proxy.Changes{Full: true})
			want := h.f.Dump()
			for i := range 3 {
				h.clock.Step(DefaultResyncPeriod)
				expectCalls(t, "resync "+string(rune('1'+i)), h.mustSync(webAndDNS(), proxy.Changes{}), listCalls)
			}
			wt.MustEqual(t, "after the resyncs", h.f.Dump(), want)

			data, err := os.ReadFile(echoes)
			if err != nil || !strings.Contains(string(data), `"field": "PortFlags"`) || !strings.Contains(string(data), `"read": "19"`) {
				t.Errorf("learned echoes on disk: %s, %v", data, err)
			}
			h.b = h.newBackend(withEchoFile) // kproxy restarts
			expectCalls(t, "restart", h.mustSync(webAndDNS(), proxy.Changes{Full: true}), listCalls+" Version=1")
			wt.MustEqual(t, "after the restart", h.f.Dump(), want)
		})
	}
}

// Without the learned echoes on disk, a restart reprograms a rewritten
// field once (it may be someone else's setting), and learns it then: at
// most once per field and Windows build.
func TestBackendRelearnsChangedEchoOnceAfterRestart(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.f.RewriteOnRead(fakehns.Rewrite{Field: hns.FieldPortFlags, From: 18, To: 19})
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	h.b = h.newBackend() // kproxy restarts, nothing on disk
	calls := h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	if calls[hns.OpUpdateLoadBalancer] != 1 {
		t.Errorf("restart: calls %s, want the NodePort load balancer reprogrammed once", callsString(calls))
	}
	h.clock.Step(DefaultResyncPeriod)
	expectCalls(t, "resync after it", h.mustSync(webAndDNS(), proxy.Changes{}), listCalls)
}

// A difference in a listing that is not an echo (a change made out of
// band) is repaired, not learned: kproxy reprograms it, and HNS's answer
// shows the sent value.
func TestBackendOutOfBandChangeIsNotLearned(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	for _, lb := range h.f.LoadBalancers() {
		if len(lb.FrontendVIPs) == 0 { // the NodePort: an operator changes its flags
			lb.PortMappings[0].Flags = 16
			h.f.RemoveLoadBalancer(lb.ID)
			h.f.AddLoadBalancer(lb)
		}
	}
	h.clock.Step(DefaultResyncPeriod)
	calls := h.mustSync(webAndDNS(), proxy.Changes{})
	if calls[hns.OpUpdateLoadBalancer] != 1 {
		t.Errorf("resync: calls %s, want the changed load balancer repaired", callsString(calls))
	}
	wt.MustEqual(t, "after the repair", h.f.Dump(), webAndDNSDump)
	if l := h.b.rec.Echo.Learned; len(l) != 0 {
		t.Errorf("learned %v from an out-of-band change", l)
	}
}

// The fake answers with upper-case IDs, lists a network's endpoints naming
// it in lower case, and lists no endpoint (no error) for a network that is
// gone: kproxy compares IDs without regard to case, and a recreated network
// is still found and repaired at the next check.
func TestBackendCopesWithHNSIDs(t *testing.T) {
	h := newHarness(t, hns.Network{Name: "net", Type: hns.NetworkTypeL2Bridge}, wt.HNSModern, func(o *Options) { o.CheckPeriod = 30 * time.Second })
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	for i := range 2 {
		h.clock.Step(30 * time.Second)
		expectCalls(t, "check "+string(rune('1'+i)), h.mustSync(webAndDNS(), proxy.Changes{}), checkCalls)
	}
	h.net = h.f.RecreateNetwork(h.net)
	h.f.AddLocalEndpoint(h.net, netip.MustParseAddr("10.244.1.5"), "pod-a")
	h.f.AddLocalEndpoint(h.net, netip.MustParseAddr("10.244.1.6"), "pod-b")
	h.clock.Step(30 * time.Second)
	h.mustSync(webAndDNS(), proxy.Changes{})
	wt.MustEqual(t, "after the network was recreated", h.f.Dump(), webAndDNSDump)
}
