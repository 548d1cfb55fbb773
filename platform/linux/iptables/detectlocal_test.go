package iptables

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// TestDetectLocalModes checks how each detect-local mode matches local pod
// traffic: for the masquerade of off-cluster traffic to a ClusterIP and for
// the short-circuit of pod traffic to an externalTrafficPolicy Local address.
func TestDetectLocalModes(t *testing.T) {
	etpLocal := func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal = true }
	ports := func() *proxy.FamilyView {
		return view(v1.IPv4Protocol,
			svc("ns/a", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 80, false))),
			svc("ns/b", "10.96.0.2", 80, v1.ProtocolTCP, withLB("203.0.113.1"), etpLocal,
				withEndpoints(ep("10.244.1.1", 80, true), ep("10.244.2.2", 80, false))))
	}
	tests := []struct {
		mode, iface string
		podCIDRs    []string
		want        []string // lines that must appear
		absent      []string
	}{
		{mode: facts.LocalClusterCIDR, want: []string{"! -s 10.244.0.0/16 -d 10.96.0.1/32", "-s 10.244.0.0/16 -j KPROXY-SVC-"}},
		{mode: facts.LocalBridgeInterface, iface: "cbr0", want: []string{"-d 10.96.0.1/32 ! -i cbr0", "-i cbr0 -j KPROXY-SVC-"}, absent: []string{"10.244.0.0/16"}},
		{mode: facts.LocalInterfaceNamePrefix, iface: "veth", want: []string{"-d 10.96.0.1/32 ! -i veth+", "-i veth+ -j KPROXY-SVC-"}, absent: []string{"10.244.0.0/16"}},
		{mode: facts.LocalNodeCIDR, podCIDRs: []string{"10.244.1.0/24", "fd00:10:1::/64"}, want: []string{"! -s 10.244.1.0/24 -d 10.96.0.1/32", "-s 10.244.1.0/24 -j KPROXY-SVC-"}, absent: []string{"10.244.0.0/16", "fd00"}},
		{mode: facts.LocalNodeCIDR, absent: []string{"10.244.0.0/16", "! -s 10.", "-i "}}, // node not known yet: nothing is local
	}
	for _, tc := range tests {
		t.Run(tc.mode+tc.iface+strings.Join(tc.podCIDRs, ","), func(t *testing.T) {
			cfg := testConfig(v1.IPv4Protocol)
			cfg.LocalDetect, cfg.LocalInterface = tc.mode, tc.iface
			p := mustPlanner(t, cfg)
			in := fullInput(ports())
			for _, c := range tc.podCIDRs {
				in.Node.PodCIDRs = append(in.Node.PodCIDRs, netip.MustParsePrefix(c))
			}
			out := string(planned(p, in).Restore)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("missing %q in:\n%s", w, out)
				}
			}
			for _, w := range tc.absent {
				if strings.Contains(out, w) {
					t.Errorf("unexpected %q in:\n%s", w, out)
				}
			}
		})
	}
}

// TestNodeCIDRChangeRewritesEverything: with NodeCIDR detection, the first
// sync may come before the Node; when its pod CIDRs arrive, a partial sync
// becomes full and every service chain uses them.
func TestNodeCIDRChangeRewritesEverything(t *testing.T) {
	cfg := testConfig(v1.IPv4Protocol)
	cfg.LocalDetect = facts.LocalNodeCIDR
	p := mustPlanner(t, cfg)
	v := view(v1.IPv4Protocol, svc("ns/a", "10.96.0.1", 80, v1.ProtocolTCP, withEndpoints(ep("10.244.2.1", 80, false))))
	in := fullInput(v)
	planned(p, in)
	in.Changes = proxy.Changes{}
	if plan := planned(p, in); plan.Full || len(plan.Restore) != 0 {
		t.Fatalf("no-change plan: full=%v restore=%q", plan.Full, plan.Restore)
	}
	in.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}
	in.Changes = proxy.Changes{Node: true}
	plan := planned(p, in)
	if !plan.Full || !strings.Contains(string(plan.Restore), "! -s 10.244.7.0/24 -d 10.96.0.1/32") {
		t.Fatalf("after the node's pod CIDR arrived: full=%v\n%s", plan.Full, plan.Restore)
	}
}

func TestDetectLocalValidation(t *testing.T) {
	for _, tc := range []struct {
		mode, iface string
		ok          bool
	}{
		{"", "", true}, {facts.LocalNodeCIDR, "", true}, {facts.LocalBridgeInterface, "cbr0", true},
		{facts.LocalBridgeInterface, "", false}, {facts.LocalInterfaceNamePrefix, "bad name", false},
		{facts.LocalInterfaceNamePrefix, "abcdefghijklmnop", false}, {"Nope", "", false},
	} {
		cfg := testConfig(v1.IPv4Protocol)
		cfg.LocalDetect, cfg.LocalInterface = tc.mode, tc.iface
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s %q: err %v, want ok=%v", tc.mode, tc.iface, err, tc.ok)
		}
	}
}
