package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Prefix starts the name of every chain kproxy owns, in every table.
const Prefix = "KPROXY-"

// The fixed chains.
const (
	// nat
	ChainServices    = "KPROXY-SERVICES"
	ChainNodePorts   = "KPROXY-NODEPORTS"
	ChainPostrouting = "KPROXY-POSTROUTING"
	ChainHairpin     = "KPROXY-HAIRPIN"
	ChainReject      = "KPROXY-REJECT"
	ChainDrop        = "KPROXY-DROP"
	ChainOffCluster  = "KPROXY-OFFCLUSTER"
	// filter
	ChainFirewall = "KPROXY-FIREWALL"
	ChainInput    = "KPROXY-INPUT"
	ChainForward  = "KPROXY-FORWARD"
	// both
	ChainCanary = "KPROXY-CANARY"
)

// Per service port chain kinds.
const (
	kindSVC = "KPROXY-SVC-" // cluster endpoints
	kindSVL = "KPROXY-SVL-" // local endpoints
	kindEXT = "KPROXY-EXT-" // external traffic policy
	kindFW  = "KPROXY-FW-"  // loadBalancerSourceRanges
)

// Shard chain prefixes.
const (
	shardServices  = "KPROXY-SH-"
	shardNodePorts = "KPROXY-NP-"
)

// Table names.
const (
	TableNAT    = "nat"
	TableFilter = "filter"
)

// hash16 returns 16 base32 characters of the SHA-256 of s: stable across
// runs and versions, so chains and affinity lists keep their names.
func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// portID is the stable identity of a service port used in its chain names.
func portID(n proxy.ServicePortName) string {
	return hash16(n.String() + "/" + strings.ToLower(string(n.Protocol)))
}

// ServiceChains returns the names of the chains a service port may own, for
// tools and tests: cluster endpoints, local endpoints, external, firewall.
func ServiceChains(n proxy.ServicePortName) (svc, svl, ext, fw string) {
	id := portID(n)
	return kindSVC + id, kindSVL + id, kindEXT + id, kindFW + id
}

// affinityList names the "-m recent" list of one endpoint of a service port.
func affinityList(n proxy.ServicePortName, ep proxy.Endpoint) string {
	return Prefix + hash16(n.String()+"/"+strings.ToLower(string(n.Protocol))+"/"+ep.String())
}

// Owned reports whether a chain name belongs to kproxy.
func Owned(chain string) bool { return strings.HasPrefix(chain, Prefix) }

// Rules whose packet counters kproxy reports as upstream kube-proxy's
// packet metrics (see ParseCounters).
const (
	// InvalidDropRule drops forwarded packets conntrack marks INVALID
	// (ChainForward): kubeproxy_iptables_ct_state_invalid_dropped_packets_total.
	InvalidDropRule = "-m conntrack --ctstate INVALID -j DROP"
	// LocalhostNodePortsCounted matches, with no target, the first packet of
	// a connection from 127.0.0.0/8 that was DNATed to an endpoint off the
	// node's own addresses, that is of a localhost NodePort connection
	// (ChainFirewall, IPv4 with localhost NodePorts):
	// kubeproxy_iptables_localhost_nodeports_accepted_packets_total. Only
	// OUTPUT sees such packets (INPUT does not, the endpoint is not local;
	// FORWARD does not, the source is loopback).
	LocalhostNodePortsCounted = "-s 127.0.0.0/8 -m addrtype ! --dst-type LOCAL -m conntrack --ctstate NEW -m conntrack --ctstate DNAT -m comment --comment \"kproxy localhost nodeports\""
)
