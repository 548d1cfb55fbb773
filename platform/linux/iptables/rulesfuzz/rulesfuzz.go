// Package rulesfuzz turns arbitrary bytes into planner input: service ports
// with arbitrary names (any bytes: newlines, quotes, NUL, invalid UTF-8),
// addresses, ports and counts. The planner's fuzz target (package rules)
// and the kernel test that feeds the same inputs to iptables-restore
// (package linux) share it, so the kernel sees exactly what the fuzzer
// explores. Values respect the snapshot's documented invariants (addresses
// of the view's family, sorted lists, endpoints sorted and unique) and
// nothing else.
package rulesfuzz

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Bounds keep one input small enough for a fast fuzz loop.
const (
	maxPorts     = 8
	maxEndpoints = 16
	maxAddrs     = 3
	maxName      = 80
)

// reader hands out bytes; once the input is exhausted it returns zeros.
type reader struct {
	data []byte
}

func (r *reader) byte() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return b
}

func (r *reader) bytes(n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = r.byte()
	}
	return out
}

func (r *reader) int32() int32 { return int32(binary.BigEndian.Uint32(r.bytes(4))) }

// port mostly yields valid ports, sometimes any int32.
func (r *reader) port() int32 {
	if r.byte()%8 == 0 {
		return r.int32()
	}
	return int32(binary.BigEndian.Uint16(r.bytes(2)))
}

func (r *reader) str() string { return string(r.bytes(int(r.byte()) % (maxName + 1))) }

func (r *reader) addr(fam v1.IPFamily) netip.Addr {
	if fam == v1.IPv6Protocol {
		return netip.AddrFrom16([16]byte(r.bytes(16)))
	}
	return netip.AddrFrom4([4]byte(r.bytes(4)))
}

func (r *reader) addrs(fam v1.IPFamily) []netip.Addr {
	var out []netip.Addr
	for n := int(r.byte() % (maxAddrs + 1)); n > 0; n-- {
		out = append(out, r.addr(fam))
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

var protocols = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "tcp", "ICMP", ""}

// Input returns the view, node and local addresses decoded from data for a
// planner of family fam.
func Input(data []byte, fam v1.IPFamily) (*proxy.FamilyView, proxy.Node, []netip.Addr) {
	r := &reader{data: data}
	node := proxy.Node{Name: r.str(), Known: r.byte()%4 != 0}
	node.Addresses = r.addrs(fam)
	local := r.addrs(fam)
	ports := map[proxy.ServicePortName]*proxy.ServicePort{}
	for n := int(r.byte() % (maxPorts + 1)); n > 0; n-- {
		sp := port(r, fam)
		ports[sp.Name] = sp
	}
	return proxy.NewFamilyView(fam, ports), node, local
}

func port(r *reader, fam v1.IPFamily) *proxy.ServicePort {
	flags := r.byte()
	proto := protocols[int(r.byte())%len(protocols)]
	sp := &proxy.ServicePort{
		Name: proxy.ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: r.str(), Name: r.str()},
			Port:           r.str(),
			Protocol:       proto,
		},
		Family:    fam,
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: r.addr(fam),
		Port:      r.port(),
		Protocol:  proto,
	}
	if flags&1 != 0 {
		sp.Type = v1.ServiceTypeNodePort
		sp.NodePort = r.port()
	}
	if flags&2 != 0 {
		sp.ExternalIPs = r.addrs(fam)
	}
	if flags&4 != 0 {
		sp.Type = v1.ServiceTypeLoadBalancer
		sp.LoadBalancerIPs = r.addrs(fam)
		for _, a := range r.addrs(fam) {
			bits := int(r.byte()) % (a.BitLen() + 1)
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.PrefixFrom(a, bits).Masked())
		}
		slices.SortFunc(sp.LoadBalancerSourceRanges, func(a, b netip.Prefix) int {
			if c := a.Addr().Compare(b.Addr()); c != 0 {
				return c
			}
			return a.Bits() - b.Bits()
		})
		sp.LoadBalancerSourceRanges = slices.Compact(sp.LoadBalancerSourceRanges)
	}
	if flags&8 != 0 {
		sp.AffinityTimeoutSeconds = r.int32()
	}
	sp.InternalPolicyLocal = flags&16 != 0
	sp.ExternalPolicyLocal = flags&32 != 0 && sp.ExternallyAccessible()
	if flags&64 != 0 {
		sp.HealthCheckNodePort = r.port()
	}
	sp.TrafficDistribution = r.str()

	var eps []proxy.Endpoint
	for n := int(r.byte() % (maxEndpoints + 1)); n > 0; n-- {
		f := r.byte()
		eps = append(eps, proxy.Endpoint{
			IP: r.addr(fam), Port: r.port(), Where: proxy.At(r.str(), r.str()),
			Ready: f&1 != 0, Serving: f&2 != 0, Terminating: f&4 != 0, Local: f&8 != 0,
		})
	}
	proxy.SortEndpoints(eps)
	eps = slices.CompactFunc(eps, func(a, b proxy.Endpoint) bool { return a.AddrPort() == b.AddrPort() })
	sp.HasAnyEndpoints = len(eps) > 0 || flags&128 != 0
	if sp.UsesClusterEndpoints() {
		sp.ClusterEndpoints = eps
	}
	if sp.UsesLocalEndpoints() {
		for _, e := range eps {
			if e.Local {
				sp.LocalEndpoints = append(sp.LocalEndpoints, e)
			}
		}
	}
	return sp
}

// Seeds are inputs worth keeping in every run: hostile names (a newline that
// would start a new restore command, quotes, backslashes, NUL, a name longer
// than a comment may be), plus ordinary ones. Each is the encoding of one
// input; see Encode.
func Seeds(fam v1.IPFamily) [][]byte {
	hostile := []string{
		"evil\n-A KPROXY-SERVICES -j ACCEPT",
		`a"b`, `a\"`, `\`, "'", "x\x00y", "tab\there", "cr\rlf", "\u2028", "\xff\xfe",
		"COMMIT\n*filter",
	}
	var out [][]byte
	out = append(out, Encode(fam, "default", "web", "http"))
	for _, h := range hostile {
		out = append(out, Encode(fam, h, "web", "http"), Encode(fam, "ns", h, "p"), Encode(fam, "ns", "web", h))
	}
	long := string(make([]byte, 80))
	out = append(out, Encode(fam, "ns"+long, "n"+long, "p"+long))
	return out
}

// Encode builds an input holding one NodePort + externalIP + LoadBalancer
// service port
// of family fam with the given names and two endpoints, one local.
func Encode(fam v1.IPFamily, namespace, name, portName string) []byte {
	var b []byte
	str := func(s string) {
		if len(s) > maxName {
			s = s[:maxName]
		}
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	addr := func(last byte) {
		if fam == v1.IPv6Protocol {
			b = append(b, 0xfd, 0, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last)
		} else {
			b = append(b, 10, 96, 0, last)
		}
	}
	str("node1")
	b = append(b, 1, 1) // known; one node address
	addr(200)
	b = append(b, 1) // one local address
	addr(200)
	b = append(b, 1)             // one port
	b = append(b, 1|2|4|8|64, 0) // NodePort, externalIP, LB, affinity, health check; TCP
	str(namespace)
	str(name)
	str(portName)
	addr(1)                      // ClusterIP
	b = append(b, 1, 0, 80)      // port 80
	b = append(b, 1, 0x75, 0x30) // nodePort 30000
	b = append(b, 1)             // one externalIP
	addr(2)
	b = append(b, 1) // one LB IP
	addr(3)
	b = append(b, 1) // one source range
	addr(0)
	b = append(b, 8)             // its prefix length (IPv4 /8; IPv6 /8)
	b = append(b, 0, 0, 0, 60)   // affinity 60 s
	b = append(b, 1, 0x7d, 0x00) // health check port 32000
	str("")                      // trafficDistribution
	b = append(b, 2)             // two endpoints
	for i, local := range []byte{0, 8} {
		b = append(b, 1|2|local)
		addr(byte(10 + i))
		b = append(b, 1, 0x1f, 0x90) // 8080
		str(fmt.Sprintf("node%d", 1+i))
		str("zone-a")
	}
	return b
}
