package windows

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

func noNetworkName(o *Options) { o.NetworkName = "" }

// No network name configured: the host's only L2Bridge or Overlay network
// is used (a NAT network beside it does not count).
func TestBackendPicksTheOnlyUsableNetwork(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern, noNetworkName)
	h.f.AddNetwork(hns.Network{Name: "nat", Type: "NAT"})
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	wt.MustEqual(t, "programmed on the only L2Bridge network", h.f.Dump(), webAndDNSDump)
}

func TestBackendNetworkAmbiguous(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern, noNetworkName)
	h.f.AddNetwork(hns.Network{Name: "Calico", Type: hns.NetworkTypeOverlay})
	h.f.AddNetwork(hns.Network{Name: "nat", Type: "NAT"})
	_, err := h.sync(webAndDNS(), proxy.Changes{Full: true})
	if !errors.Is(err, ErrNoNetwork) {
		t.Fatalf("want ErrNoNetwork, got %v", err)
	}
	for _, want := range []string{`"Calico" (Overlay)`, `"net" (L2Bridge)`, `"nat" (NAT)`, "set one of Calico, net", "--network-name"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if n := len(h.f.LoadBalancers()); n != 0 {
		t.Errorf("%d load balancers programmed on an ambiguous host", n)
	}
}

func TestPickNetworkNone(t *testing.T) {
	_, _, err := pickNetwork([]hns.Network{{Name: "nat", Type: "NAT"}}, nil)
	if !errors.Is(err, ErrNoNetwork) || !strings.Contains(err.Error(), `"nat" (NAT)`) {
		t.Fatalf("got %v", err)
	}
}

// --cleanup after the CNI removed the network still deletes the load
// balancers of the family (and only of the family).
func TestCleanupWithoutNetwork(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	other := h.f.AddLoadBalancer(hns.LoadBalancer{Flags: hns.LBFlagIPv6, FrontendVIPs: []string{"fd00::10"},
		PortMappings: []hns.PortMapping{{Protocol: hns.ProtocolTCP, InternalPort: 80, ExternalPort: 80}}, HostComputeEndpoints: []string{"x"}})
	h.f.RemoveNetwork(h.net)
	if err := h.b.Cleanup(context.Background()); err != nil {
		t.Fatalf("cleanup without the network: %v", err)
	}
	lbs := h.f.LoadBalancers()
	if len(lbs) != 1 || lbs[0].ID != other {
		t.Errorf("left: %+v, want only the IPv6 load balancer", lbs)
	}
}

// Overlay networks are single-stack, as upstream: the IPv6 backend programs
// nothing and its syncs succeed (before, every sync failed for want of an
// IPv6 source VIP and /livez restarted kproxy). Likewise on an HNS without
// IPv6 load balancers.
func TestIPv6BackendIdleOnOverlayAndOldHNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    hns.Network
		v    hns.Version
	}{
		{"overlay", overlayNet(), wt.HNSModern},
		{"HNS 11.0", l2bridgeNet, hns.Version{Major: 11, Minor: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.n, tc.v)
			v6 := h.newBackend(func(o *Options) { o.Family = "IPv6" })
			s := wt.Snap([]string{"10.0.0.1", "fd00::1"},
				wt.SvcPort("web6", "TCP", "fd00:10:96::10", 80, wt.Eps(wt.RemoteEP("fd00:244:2::5", 8080))))
			if err := syncSnap(context.Background(), v6, s, proxy.Changes{Full: true}); err != nil {
				t.Fatalf("IPv6 sync: %v", err)
			}
			if n := len(h.f.LoadBalancers()); n != 0 {
				t.Errorf("%d load balancers programmed", n)
			}
		})
	}
}
