// Package nft renders kproxy's nftables programming: one table of kproxy's
// own per IP family, where a new connection is dispatched by one verdict-map
// lookup whatever the number of Services, and where the endpoints are data.
//
// Layout (family ip; ip6 is the same with ip6 names):
//
//	table ip kproxy
//	  map frontends  addr . proto . port : verdict   ClusterIPs, externalIPs, load balancer IPs
//	  map nodeports  proto . port : verdict          NodePorts
//	  map cluster-ip addr . proto . port . slot : endpoint addr . port    (and local-ip)
//	  map cluster-np proto . port . slot : endpoint addr . port           (and local-np)
//	  set hairpin    addr . addr                     this node's endpoints
//	  set pod-cidrs  prefixes                        detect-local ClusterCIDR / NodeCIDR
//	  chain nat-prerouting, nat-output  → services   (type nat, priority dstnat)
//	  chain services: the two vmap lookups
//	  chain dnat-<set>-<ip|np>-r<N>: DNAT to slot "numgen random mod N" of the set's map
//	  chain dnat-<set>-<ip|np>-hash: DNAT to slot "jhash saddr mod 32" (source hash)
//	  chain masq-<who>-<target>: mark for masquerade, then goto target
//	  chain split-<hash>: pods, the node and other clients go different ways
//	  chain port-<hash>-<ns>/<name>/<proto>/<port>-<role>-<gen>: a port's own
//	        chains, for what cannot be shared (round robin counters, least
//	        connection weights, affinity sets, source ranges)
//	  chain nat-postrouting → masquerading (hairpin, then the masquerade mark)
//	  chain filter-forward, filter-input: INVALID drop, localhost guard
//
// An endpoint change of a Service rewrites only that frontend's elements of
// the endpoint maps: no rule, no chain, no verdict. A change of the number of
// endpoints also swaps the frontend's verdict element to another shared DNAT
// chain. Only the rare ports with chains of their own rewrite rules, under
// fresh chain names (the old ones are deleted once nothing points at them).
package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// TableName is the name of kproxy's table in each family.
const TableName = "kproxy"

// Fixed chains, sets and maps.
const (
	ChainNATPrerouting  = "nat-prerouting"
	ChainNATOutput      = "nat-output"
	ChainNATPostrouting = "nat-postrouting"
	ChainServices       = "services"
	ChainMasquerading   = "masquerading"
	ChainMarkMasq       = "mark-masq"
	ChainReject         = "reject-chain"
	ChainFilterForward  = "filter-forward"
	ChainFilterInput    = "filter-input"
	ChainFilterOutput   = "filter-output"

	MapFrontends = "frontends"
	MapNodePorts = "nodeports"
	SetHairpin   = "hairpin"
	SetPodCIDRs  = "pod-cidrs"
	SetNodePorts = "nodeport-ips"
	// SetNodePortRejects holds the NodePorts (proto . port) whose node
	// clients are refused: checked on input, where the packets of the
	// node's own processes arrive through loopback (see ChainReject).
	SetNodePortRejects = "nodeport-rejects"
)

// Family returns the nftables family of an IP family.
func Family(f v1.IPFamily) knftables.Family {
	if f == v1.IPv6Protocol {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// fam holds the family-specific words of rules.
type fam struct {
	nft      knftables.Family
	ip       string    // "ip" or "ip6"
	addr     string    // "ipv4_addr" or "ipv6_addr"
	loopback nft.Value // 127.0.0.0/8 or ::1
}

func famOf(f v1.IPFamily) fam {
	if f == v1.IPv6Protocol {
		return fam{nft: knftables.IPv6Family, ip: "ip6", addr: "ipv6_addr", loopback: nft.Addr(netip.IPv6Loopback())}
	}
	return fam{nft: knftables.IPv4Family, ip: "ip", addr: "ipv4_addr", loopback: nft.Prefix(netip.MustParsePrefix("127.0.0.0/8"))}
}

// hash8 returns 8 base32 characters of the SHA-256 of s (lower case).
func hash8(s string) string {
	sum := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:8])
}

// portKey names a service port in its chains: a hash (unique whatever the
// name's length) and the readable name, "<hash>-<ns>/<name>/<proto>/<port>".
// The cache validates every part (DNS-1123), so the name holds no character
// nft would need quoted.
func portKey(n proxy.ServicePortName) string {
	proto := strings.ToLower(string(n.Protocol))
	port := n.Port
	if port == "" {
		port = "-"
	}
	return hash8(n.String()+"/"+proto) + "-" + n.Namespace + "/" + n.Name + "/" + proto + "/" + port
}

// protoName is the nft name of a protocol ("tcp").
// ProtoName is the protocol as nft spells it ("tcp").
func ProtoName(p v1.Protocol) string { return strings.ToLower(string(p)) }
