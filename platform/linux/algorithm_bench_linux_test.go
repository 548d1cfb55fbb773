package linux

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// BenchmarkKernelFirstPacket measures, in a throwaway namespace, one new
// TCP connection (connect, accept, close) from the node to one ClusterIP
// among 10,000 Services of 3 local endpoints each, all with one algorithm:
// the cost of the nat traversal of the first packet beside everything else
// a connection costs, in the iptables mode (both flavours) and the
// nftables mode. Run with -benchtime 3000x; compare each algorithm with
// random.
func BenchmarkKernelFirstPacket(b *testing.B) {
	for _, m := range firstPacketModes {
		for _, alg := range proxy.Algorithms {
			b.Run(fmt.Sprintf("%s/%s", m, alg), func(b *testing.B) {
				inNetns(b, func() { firstPacket(b, m, alg, 10_000) })
			})
		}
	}
}

// BenchmarkKernelFirstPacketScale is the data path's cost of the number of
// Services: the same connection (random) with 10 and with 10,000 Services
// programmed, in each mode, beside a direct connection to the endpoint.
// The nftables mode's dispatch is one map lookup whatever the number; the
// iptables mode's walks a list.
func BenchmarkKernelFirstPacketScale(b *testing.B) {
	for _, m := range firstPacketModes {
		for _, n := range []int{10, 10_000} {
			b.Run(fmt.Sprintf("%s/services=%d", m, n), func(b *testing.B) {
				inNetns(b, func() { firstPacket(b, m, proxy.AlgorithmRandom, n) })
			})
		}
	}
	b.Run("direct", func(b *testing.B) {
		inNetns(b, func() { firstPacket(b, "direct", proxy.AlgorithmRandom, 0) })
	})
}

// firstPacketModes: the iptables mode per flavour, then the nftables mode.
var firstPacketModes = []string{string(FlavourLegacy), string(FlavourNFT), "nftables"}

func firstPacket(b *testing.B, mode string, alg proxy.Algorithm, n int) {
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pods0"}, PeerName: "pods1"}
	if err := netlink.LinkAdd(link); err != nil {
		b.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		b.Fatal(err)
	}
	var eps []proxy.Endpoint
	for i := range 3 {
		a := netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)})
		addr, _ := netlink.ParseAddr(a.String() + "/32")
		if err := netlink.AddrAdd(link, addr); err != nil {
			b.Fatal(err)
		}
		eps = append(eps, proxy.Endpoint{IP: a, Port: 8080, Ready: true, Serving: true, Local: true})
	}
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: all}); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "0.0.0.0:8080")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	ports := make(map[proxy.ServicePortName]*proxy.ServicePort, n)
	for i := range n {
		name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}, Port: "http", Protocol: v1.ProtocolTCP}
		ports[name] = &proxy.ServicePort{
			Name: name, Family: v1.IPv4Protocol, Type: v1.ServiceTypeClusterIP,
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Protocol: v1.ProtocolTCP,
			HasAnyEndpoints: true, ClusterEndpoints: eps, Algorithm: alg,
		}
	}
	target := netip.AddrPortFrom(eps[0].IP, 8080).String()
	if mode != "direct" {
		var be viewSyncer
		if mode == "nftables" {
			be = systemNFTBackend(b, v1.IPv4Protocol)
		} else {
			be = systemBackend(b, v1.IPv4Protocol, Flavour(mode), func(o *Options) { o.KeepUpstream = true })
		}
		if err := syncSnap(context.Background(), be, snapOfPorts(ports), proxy.Changes{Full: true}); err != nil {
			b.Fatal(err)
		}
		target = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte((n - 1) >> 8), byte((n - 1) & 0xff)}), 80).String()
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	b.ResetTimer()
	for range b.N {
		c, err := d.Dial("tcp4", target)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
}
