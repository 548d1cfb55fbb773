package e2e

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestNodeRejectsLikeUpstream: a process of the node sending UDP to a
// Service port without endpoints (issue 27, kind 2). Its own NodePort —
// on the node's address, a local destination — is refused on the input
// path, so sendto succeeds and the client reads "connection refused" from
// the ICMP error, as with kube-proxy in both modes (an EPERM at sendto, as
// a reject in OUTPUT gives, is an error many UDP clients do not retry).
// The ClusterIP is refused in the output path (EPERM), as upstream does
// in both modes; an externalIP too (upstream's nftables mode does the
// same, its iptables mode lets the packet leave unanswered: a documented
// difference).
func TestNodeRejectsLikeUpstream(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("node-rejects", 108, proxytest.WithNodePort(), proxytest.WithExternalIPs())
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: []any{svc}})
	ctx := e.ctx(time.Minute)
	node1, _ := top.Node(proxytest.Node1)
	for _, fam := range families() {
		nodePort := netip.AddrPortFrom(node1.Addr(fam), uint16(svc.Spec.Ports[0].NodePort))
		probe := func(to netip.AddrPort) echo.Result {
			return e.c.Probe(ctx, proxytest.Node1, "udp", to, echo.ProbeOptions{Timeout: 2 * time.Second})
		}
		if r := probe(nodePort); r.Outcome != echo.Rejected || !errors.Is(r.Err, syscall.ECONNREFUSED) {
			t.Errorf("%s: node1 -> its NodePort %s/udp: %v (%v), want connection refused on the input path, not EPERM at send", fam, nodePort, r.Outcome, r.Err)
		}
		cip := netip.AddrPortFrom(netip.MustParseAddr(clusterIPOf(svc, fam)), uint16(svc.Spec.Ports[0].Port))
		if r := probe(cip); r.Outcome != echo.Rejected || !errors.Is(r.Err, syscall.EPERM) {
			t.Errorf("%s: node1 -> ClusterIP %s/udp: %v (%v), want EPERM at send (rejected in the output path, as upstream)", fam, cip, r.Outcome, r.Err)
		}
		ext := netip.AddrPortFrom(netip.MustParseAddr(externalIPOf(svc, fam)), uint16(svc.Spec.Ports[0].Port))
		if r := probe(ext); r.Outcome != echo.Rejected || !errors.Is(r.Err, syscall.EPERM) {
			t.Errorf("%s: node1 -> externalIP %s/udp: %v (%v), want EPERM at send (node-udp-external-eperm)", fam, ext, r.Outcome, r.Err)
		}
	}
}

// externalIPOf returns svc's externalIP of family fam.
func externalIPOf(svc *v1.Service, fam v1.IPFamily) string {
	for _, ip := range svc.Spec.ExternalIPs {
		if a := netip.MustParseAddr(ip); a.Is4() == (fam == v1.IPv4Protocol) {
			return ip
		}
	}
	return ""
}

// clusterIPOf returns svc's ClusterIP of family fam.
func clusterIPOf(svc *v1.Service, fam v1.IPFamily) string {
	for _, ip := range svc.Spec.ClusterIPs {
		if a := netip.MustParseAddr(ip); a.Is4() == (fam == v1.IPv4Protocol) {
			return ip
		}
	}
	return ""
}
