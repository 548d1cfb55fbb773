package hns

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
)

// The types in this file mirror the HNS (Host Networking Service) v2 schema
// that github.com/Microsoft/hcsshim/hcn speaks, field for field and with the
// same JSON names, so that a dry run prints what HNS would receive and the
// Windows adapter converts with plain assignments. They are ours, not hcn's:
// package hcn only builds on Windows, and everything that decides must build
// and be tested everywhere.

// Protocol numbers HNS uses in a port mapping.
const (
	ProtocolTCP  uint32 = 6
	ProtocolUDP  uint32 = 17
	ProtocolSCTP uint32 = 132
)

// LoadBalancerFlags are HNS's load balancer flags (HostComputeLoadBalancer.Flags).
type LoadBalancerFlags uint32

// Load balancer flags.
const (
	// LBFlagDSR enables direct server return.
	LBFlagDSR LoadBalancerFlags = 1
	// LBFlagIPv6 marks an IPv6 load balancer.
	LBFlagIPv6 LoadBalancerFlags = 2
)

// PortMappingFlags are HNS's port mapping flags.
type PortMappingFlags uint32

// Port mapping flags.
const (
	PortFlagILB            PortMappingFlags = 1
	PortFlagLocalRoutedVIP PortMappingFlags = 2
	PortFlagUseMux         PortMappingFlags = 4
	PortFlagPreserveDIP    PortMappingFlags = 8
	// PortFlagVIPExternalIP marks a frontend reachable from outside the node
	// (NodePort, externalIP, LoadBalancer ingress IP).
	PortFlagVIPExternalIP PortMappingFlags = 16
)

// Distribution is HNS's load balancer distribution type.
type Distribution uint32

// Distribution types.
const (
	DistributionNone             Distribution = 0
	DistributionSourceIPProtocol Distribution = 1
	// DistributionSourceIP keeps a client on one backend (session affinity ClientIP).
	DistributionSourceIP Distribution = 2
)

// EndpointFlags are HNS's endpoint flags.
type EndpointFlags uint32

// EndpointFlagRemote marks an endpoint that lives on another host.
const EndpointFlagRemote EndpointFlags = 1

// PortMapping mirrors hcn.LoadBalancerPortMapping.
type PortMapping struct {
	Protocol         uint32           `json:",omitempty"`
	InternalPort     uint16           `json:",omitempty"`
	ExternalPort     uint16           `json:",omitempty"`
	DistributionType Distribution     `json:",omitempty"`
	Flags            PortMappingFlags `json:",omitempty"`
}

// LoadBalancer mirrors hcn.HostComputeLoadBalancer. HostComputeEndpoints
// holds HNS endpoint IDs.
type LoadBalancer struct {
	ID                   string            `json:"ID,omitempty"`
	HostComputeEndpoints []string          `json:",omitempty"`
	SourceVIP            string            `json:",omitempty"`
	FrontendVIPs         []string          `json:",omitempty"`
	PortMappings         []PortMapping     `json:",omitempty"`
	Flags                LoadBalancerFlags `json:",omitempty"`
}

// IPConfig mirrors hcn.IpConfig.
type IPConfig struct {
	IPAddress    string `json:"IpAddress,omitempty"`
	PrefixLength uint8  `json:",omitempty"`
}

// EndpointPolicy mirrors hcn.EndpointPolicy.
type EndpointPolicy struct {
	Type     string          `json:""`
	Settings json.RawMessage `json:",omitempty"`
}

// Endpoint mirrors the fields of hcn.HostComputeEndpoint that kproxy uses.
type Endpoint struct {
	ID                 string           `json:"ID,omitempty"`
	Name               string           `json:",omitempty"`
	HostComputeNetwork string           `json:",omitempty"`
	Policies           []EndpointPolicy `json:",omitempty"`
	IPConfigurations   []IPConfig       `json:"IpConfigurations,omitempty"`
	MacAddress         string           `json:",omitempty"`
	Flags              EndpointFlags    `json:",omitempty"`
}

// PolicyProviderAddress is the endpoint policy type that carries the provider
// address (the underlay IP of the host) of a remote endpoint on an overlay network.
const PolicyProviderAddress = "ProviderAddress"

type providerAddressSettings struct {
	ProviderAddress string `json:",omitempty"`
}

// IsRemote reports whether the endpoint lives on another host.
func (e *Endpoint) IsRemote() bool { return e.Flags&EndpointFlagRemote != 0 }

// IPs returns the endpoint's parseable addresses.
func (e *Endpoint) IPs() []netip.Addr {
	var out []netip.Addr
	for _, c := range e.IPConfigurations {
		if a, err := netip.ParseAddr(c.IPAddress); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// ProviderAddress returns the endpoint's provider address policy ("" when none).
func (e *Endpoint) ProviderAddress() string {
	for _, p := range e.Policies {
		if p.Type != PolicyProviderAddress {
			continue
		}
		var s providerAddressSettings
		if err := json.Unmarshal(p.Settings, &s); err == nil {
			return s.ProviderAddress
		}
	}
	return ""
}

// ProviderAddressPolicy builds a ProviderAddress endpoint policy.
func ProviderAddressPolicy(pa netip.Addr) EndpointPolicy {
	b, _ := json.Marshal(providerAddressSettings{ProviderAddress: pa.String()}) // cannot fail
	return EndpointPolicy{Type: PolicyProviderAddress, Settings: b}
}

// Network types as HNS names them.
const (
	NetworkTypeOverlay  = "Overlay"
	NetworkTypeL2Bridge = "L2Bridge"
)

// Network holds the facts of an HNS network that the plan depends on.
type Network struct {
	ID   string `json:"ID,omitempty"`
	Name string `json:",omitempty"`
	// Type is HNS's network type ("Overlay", "L2Bridge", ...).
	Type string `json:",omitempty"`
	// RemoteSubnets are the network's RemoteSubnetRoute policies (overlay).
	RemoteSubnets []RemoteSubnet `json:",omitempty"`
}

// IsOverlay reports whether the network is an overlay (VXLAN) network.
func (n *Network) IsOverlay() bool { return strings.EqualFold(n.Type, NetworkTypeOverlay) }

// RemoteSubnet mirrors hcn.RemoteSubnetRoutePolicySetting: the pod subnet of
// another node and that node's provider address.
type RemoteSubnet struct {
	DestinationPrefix           string `json:",omitempty"`
	IsolationID                 uint16 `json:"IsolationId,omitempty"`
	ProviderAddress             string `json:",omitempty"`
	DistributedRouterMacAddress string `json:",omitempty"`
}

// Version is HNS's version (hcn.Version).
type Version struct {
	Major int `json:"Major"`
	Minor int `json:"Minor"`
}

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// AtLeast reports whether v >= major.minor.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// Capabilities are the HNS features the plan and the reconciler depend on.
type Capabilities struct {
	// DSR: direct server return (HNS 9.3-9.x and 10.2+).
	DSR bool
	// SessionAffinity: the SourceIP distribution (HNS 12.0+).
	SessionAffinity bool
	// IPv6: dual-stack load balancers (HNS 11.10+).
	IPv6 bool
	// ModifyLoadBalancer: in-place load balancer updates that really replace
	// the endpoint set. hcsshim accepts 15.4, where the update succeeds but
	// keeps the old endpoints; kproxy requires 15.5+ (or 16+).
	ModifyLoadBalancer bool
}

// CapabilitiesFor derives the capabilities from the HNS version.
func CapabilitiesFor(v Version) Capabilities {
	return Capabilities{
		DSR:                (v.Major == 9 && v.Minor >= 3) || v.AtLeast(10, 2),
		SessionAffinity:    v.AtLeast(12, 0),
		IPv6:               v.AtLeast(11, 10),
		ModifyLoadBalancer: v.AtLeast(15, 5),
	}
}
