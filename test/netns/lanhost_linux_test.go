package netns

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestAddLANHost: a host added to the node network reaches node1 and the
// outside client in both families (node1 runs no proxy, so the TCP probes
// are refused: a refusal proves the SYN got there and back), and bad
// arguments are refused before anything is created.
func TestAddLANHost(t *testing.T) {
	c := New(t, Options{Pods: []string{proxytest.PodA1}})
	ctx := testContext(t, time.Minute)
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name, host string
		v4, v6     netip.Addr
		want       string
	}{
		{"name too long", "control-plane1", a("192.168.50.10"), a("fd00:50::10"), "1-13 characters"},
		{"existing host", proxytest.Node1, a("192.168.50.10"), a("fd00:50::10"), "already exists"},
		{"outside the node network", "cp", a("192.168.51.10"), a("fd00:50::10"), "node network"},
		{"families swapped", "cp", a("fd00:50::10"), a("192.168.50.10"), "node network"},
		{"a node's address", "cp", a("192.168.50.1"), a("fd00:50::10"), "belongs to node1"},
		{"the router's address", "cp", a("192.168.50.10"), a("fd00:50::254"), "lan router"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.AddLANHost(ctx, tc.host, tc.v4, tc.v6)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AddLANHost(%s, %s, %s) = %v, want an error containing %q", tc.host, tc.v4, tc.v6, err, tc.want)
			}
		})
	}
	if c.NS("cp") != nil {
		t.Fatal("a refused AddLANHost left a namespace behind")
	}

	ns, err := c.AddLANHost(ctx, "control-plane", a("192.168.50.10"), a("fd00:50::10"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NS("control-plane"); got != ns || !strings.HasPrefix(ns.Name, c.ID+"-") {
		t.Fatalf("NS(control-plane) = %v, want %v named after the cluster %s", got, ns, c.ID)
	}
	for _, dst := range []string{proxytest.Node1, proxytest.Outside} {
		h, _ := c.Topology.Host(dst)
		for _, ip := range []netip.Addr{h.IPv4, h.IPv6} {
			r := c.Probe(ctx, "control-plane", "tcp", netip.AddrPortFrom(ip, 9), echo.ProbeOptions{Timeout: 2 * time.Second})
			if r.Outcome != echo.Rejected {
				t.Errorf("control-plane → %s %s:9: %v, want rejected (reachable, nothing listening)", dst, ip, r)
			}
		}
	}
}
