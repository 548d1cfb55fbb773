package check

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	v1 "k8s.io/api/core/v1"
)

// liveObjects programs a "real" Service through a backend, as kproxy on the
// node would have, so the check can prove it leaves it alone.
func liveObjects(t *testing.T, f *fakehns.Fake, o Options) {
	t.Helper()
	b, err := windows.New(windows.Options{HNS: f, NetworkName: "vxlan0", SourceVIP: o.SourceVIP, NodeIP: o.NodeIP, Interfaces: o.Interfaces})
	if err != nil {
		t.Fatal(err)
	}
	s := wt.Snap([]string{"10.0.0.1"}, wt.SvcPort("web", "TCP", "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080))))
	if err := b.Sync(context.Background(), windows.FullView(v1.IPv4Protocol, s)); err != nil {
		t.Fatal(err)
	}
}

func TestCheckHNSAgainstExactFake(t *testing.T) {
	f, o := FakeNode(0)
	liveObjects(t, f, o)
	before := f.Dump()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := res.Write(&out); err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("an exact HNS must pass:\n%s", out.String())
	}
	for _, want := range []string{
		"endpoint 10.244.2.254", "Policies.ProviderAddress       10.0.0.2",
		"load balancer v4 TCP *:32767", "PortMappings.Flags", "18",
		"load balancer v4 TCP 198.18.0.10:80", "load balancer v4 TCP 198.18.0.11:80",
		"load balancer v4 TCP 198.18.0.13:81", "SourceVIP", "10.244.1.250",
		"load balancer v4 TCP 198.18.0.13:10256", // the forwarded health check
		"OK: HNS returned every field",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	wt.MustEqual(t, "HNS after the check (everything it created deleted, the rest untouched)", f.Dump(), before)
}

// An HNS that does not return the un-echoed fields: the table shows each
// one, the exit status is non-zero, but the resync check passes (kproxy's
// record fills them in), and everything is cleaned up.
func TestCheckHNSAgainstDroppingFake(t *testing.T) {
	f, o := FakeNode(hns.FieldsUnechoed)
	before := f.Dump()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := res.Write(&out); err != nil {
		t.Fatal(err)
	}
	if res.OK() {
		t.Fatalf("fields left out must be reported:\n%s", out.String())
	}
	if len(res.Problems) != 0 {
		t.Errorf("a resync must change nothing even when HNS leaves fields out: %q", res.Problems)
	}
	var diff []string
	for _, r := range res.Rows {
		if !r.OK() {
			diff = append(diff, r.Field)
		}
	}
	got := strings.Join(uniq(diff), ",")
	if got != "Policies.ProviderAddress,SourceVIP,PortMappings.DistributionType,PortMappings.Flags,Flags" {
		t.Errorf("different fields: %s\n%s", got, out.String())
	}
	if !strings.Contains(out.String(), "(not returned)") || !strings.Contains(out.String(), "DIFFERENCES") {
		t.Errorf("output:\n%s", out.String())
	}
	wt.MustEqual(t, "HNS after the check", f.Dump(), before)
}

// The check never deletes or changes what it did not create: an address it
// would use that already has a kproxy endpoint is used as it is.
func TestCheckHNSReusesExistingEndpoint(t *testing.T) {
	f, o := FakeNode(0)
	o.RemoteIP = netip.MustParseAddr("10.244.2.5")
	liveObjects(t, f, o) // holds a remote endpoint for 10.244.2.5
	before := f.Dump()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 0 {
		t.Errorf("problems: %q", res.Problems)
	}
	wt.MustEqual(t, "HNS after the check", f.Dump(), before)
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// writeCheck renders a result for the test's messages.
func writeCheck(t *testing.T, res *Result) string {
	t.Helper()
	var out bytes.Buffer
	if err := res.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// An HNS that leaves out every field it may leave out (frontend VIPs,
// names and MACs too): reported, and neither the simulated resync nor a
// fresh backend's sync would change anything.
func TestCheckHNSAgainstFakeDroppingAll(t *testing.T) {
	f, o := FakeNode(hns.FieldsAll)
	before := f.Dump()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	out := writeCheck(t, res)
	if len(res.Problems) != 0 {
		t.Errorf("problems: %q\n%s", res.Problems, out)
	}
	var diff []string
	for _, r := range res.Rows {
		if !r.OK() {
			diff = append(diff, r.Field)
		}
	}
	for _, want := range []string{"Name", "MacAddress", "FrontendVIPs", "Policies.ProviderAddress", "SourceVIP"} {
		if !strings.Contains(","+strings.Join(uniq(diff), ",")+",", ","+want+",") {
			t.Errorf("%s not reported as not returned:\n%s", want, out)
		}
	}
	wt.MustEqual(t, "HNS after the check", f.Dump(), before)
}

// The fresh backend's sync is real: what it would change is a problem. Here
// the check's ClusterIP load balancer disappears between the simulated
// resync and the fresh backend's listing (the third listing of load
// balancers).
func TestCheckHNSFreshSyncFindsChanges(t *testing.T) {
	f, o := FakeNode(0)
	before := f.Dump()
	o.HNS = &onList{HNS: f, at: 3, do: func() {
		for _, lb := range f.LoadBalancers() {
			if len(lb.FrontendVIPs) == 1 && lb.FrontendVIPs[0] == "198.18.0.10" {
				f.RemoveLoadBalancer(lb.ID)
			}
		}
	}}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	out := writeCheck(t, res)
	if len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "a sync from a fresh backend") ||
		!strings.Contains(res.Problems[0], "CreateLoadBalancer TCP 198.18.0.10:80") {
		t.Errorf("problems %q, want the fresh sync's creation of the lost load balancer\n%s", res.Problems, out)
	}
	if res.OK() {
		t.Errorf("a check with a problem is not OK")
	}
	wt.MustEqual(t, "HNS after the check (nothing created by the fresh sync)", f.Dump(), before)
}

// onList runs do before the at-th listing of load balancers.
type onList struct {
	hns.HNS
	at, n int
	do    func()
}

func (h *onList) ListLoadBalancers() ([]hns.LoadBalancer, error) {
	if h.n++; h.n == h.at {
		h.do()
	}
	return h.HNS.ListLoadBalancers()
}

// Overlay networks are single-stack for kproxy: no IPv6 round there, even
// when the node has an IPv6 address (the IPv6 round could only fail).
func TestCheckHNSOverlaySkipsIPv6(t *testing.T) {
	_, o := FakeNode(0)
	o.NodeIPv6 = netip.MustParseAddr("2001:db8::1")
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	out := writeCheck(t, res)
	if !res.OK() {
		t.Errorf("not OK:\n%s", out)
	}
	for _, r := range res.Rows {
		if r.Family == "IPv6" {
			t.Fatalf("an IPv6 row on an overlay network:\n%s", out)
		}
	}
	if !strings.Contains(out, "IPv6 not checked: network \"vxlan0\" is an overlay network") {
		t.Errorf("output does not say why IPv6 was not checked:\n%s", out)
	}
}

// A flannel node where the check is given no source VIP: it uses the one
// kproxy uses, as the backend finds it, and says which; with none it says
// which flags to pass.
func TestCheckHNSFindsTheSourceVIP(t *testing.T) {
	reservation := func(t *testing.T, ip string) func(string, bool) (netip.Addr, bool, error) {
		dir := wt.ScratchDir(t)
		if ip != "" {
			if err := os.MkdirAll(filepath.Join(dir, "vxlan0"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "vxlan0", ip), []byte(windows.SourceVIPReservationID+"\r\nkproxy"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return func(store string, v6 bool) (netip.Addr, bool, error) {
			if filepath.Base(store) != "vxlan0" {
				t.Errorf("store %s, want one named by the network", store)
			}
			return windows.FindInIPAMStore()(filepath.Join(dir, "vxlan0"), v6)
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, f *fakehns.Fake, o *Options)
		want  string // the note, or the error
		err   bool
	}{
		{"reserved by kproxy", func(t *testing.T, f *fakehns.Fake, o *Options) {
			o.ReservedSourceVIP = reservation(t, "10.244.1.254")
		}, "source VIP 10.244.1.254 (kproxy's reservation in the IPAM store", false},
		{"kproxy's endpoint", func(t *testing.T, f *fakehns.Fake, o *Options) {
			live := *o
			live.SourceVIP = netip.MustParseAddr("10.244.1.250")
			liveObjects(t, f, live)
			o.ReservedSourceVIP = reservation(t, "")
		}, "source VIP 10.244.1.250 (kproxy's source VIP endpoint on the network)", false},
		{"Calico", func(t *testing.T, f *fakehns.Fake, o *Options) {
			f.AddLocalEndpoint(fakeNetID(t, f, "vxlan0"), netip.MustParseAddr("10.244.1.1"), windows.CalicoEndpointName)
			o.ReservedSourceVIP = reservation(t, "10.244.1.254")
		}, "source VIP 10.244.1.1 (the Calico_ep endpoint)", false},
		{"reserved in --pod-cidr", func(t *testing.T, f *fakehns.Fake, o *Options) {
			o.ReservedSourceVIP = reservation(t, "")
			o.ReserveSourceVIP = windows.ReserveInIPAMStore()
			o.IPAMDataDir = wt.ScratchDir(t)
		}, "source VIP 10.244.1.254 (reserved in the IPAM store", false},
		{"none", func(t *testing.T, f *fakehns.Fake, o *Options) {
			o.ReservedSourceVIP = reservation(t, "")
			o.PodCIDRs = nil
		}, "pass --source-vip, or --pod-cidr", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, o := FakeNode(0)
			o.SourceVIP = netip.Addr{} // not given
			tc.setup(t, f, &o)
			before := f.Dump()
			res, err := Run(context.Background(), o)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out := writeCheck(t, res)
			if !res.OK() || !strings.Contains(out, tc.want) {
				t.Errorf("want OK and %q:\n%s", tc.want, out)
			}
			wt.MustEqual(t, "HNS after the check", f.Dump(), before)
		})
	}
}

// The forwarded health check goes to the root endpoint when the network has
// it.
func TestCheckHNSHealthCheckToRootEndpoint(t *testing.T) {
	f, o := FakeNode(0)
	f.AddLocalEndpoint(fakeNetID(t, f, "vxlan0"), netip.MustParseAddr("10.244.1.2"), "cbr0")
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	out := writeCheck(t, res)
	if !res.OK() || strings.Contains(out, "health check load balancer goes to") {
		t.Errorf("want OK without a fallback note:\n%s", out)
	}
	var hcEndpoints string
	for _, r := range res.Rows {
		if r.Object == "load balancer v4 TCP 198.18.0.13:10256" && r.Field == "HostComputeEndpoints" {
			hcEndpoints = r.Sent
		}
	}
	var root string
	for _, ep := range f.Endpoints() {
		if ep.Name == "cbr0" {
			root = strings.ToLower(ep.ID)
		}
	}
	if hcEndpoints == "" || hcEndpoints != root {
		t.Errorf("health check load balancer endpoints %q, want the root endpoint %s:\n%s", hcEndpoints, root, out)
	}
}

// The first call (Version) is bounded like every other: a hung HNS fails
// the check instead of hanging it.
func TestCheckHNSVersionTimesOut(t *testing.T) {
	f, o := FakeNode(0)
	release := f.Hang(hns.OpVersion)
	defer release()
	o.CallTimeout = 20 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), o)
		done <- err
	}()
	select {
	case err := <-done:
		var he *hns.Error
		if !errors.As(err, &he) || he.Code != hns.CodeTimeout {
			t.Errorf("got %v, want a timeout of %s", err, hns.OpVersion)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("check-hns hangs on a hung Version call")
	}
}

func fakeNetID(t *testing.T, f *fakehns.Fake, name string) string {
	t.Helper()
	n, err := f.GetNetwork(name)
	if err != nil {
		t.Fatal(err)
	}
	return n.ID
}
