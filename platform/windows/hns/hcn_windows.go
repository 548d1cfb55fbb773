//go:build windows

package hns

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"syscall"

	"github.com/Microsoft/hcsshim/hcn"
	sysw "golang.org/x/sys/windows"
)

// NewHNS returns the host's HNS, through hcsshim's hcn package (HNS v2 API).
// It makes no call; the first call fails with a transient error when
// computenetwork.dll is missing (Wine, Windows without containers).
func NewHNS() (HNS, error) { return hcnHNS{}, nil }

// hcnHNS converts between our types and hcn's, and classifies hcn's errors.
type hcnHNS struct{}

var _ HNS = hcnHNS{}

var schemaV2 = hcn.SchemaVersion{Major: 2, Minor: 0}

func (hcnHNS) Version() (Version, error) {
	g, err := hcn.GetGlobals()
	if err != nil {
		return Version{}, wrapHCN(OpVersion, err)
	}
	return Version{Major: g.Version.Major, Minor: g.Version.Minor}, nil
}

func (hcnHNS) ListNetworks() ([]Network, error) {
	ns, err := hcn.ListNetworks()
	if err != nil {
		return nil, wrapHCN(OpListNetworks, err)
	}
	out := make([]Network, 0, len(ns))
	for i := range ns {
		n, err := fromHCNNetwork(&ns[i])
		if err != nil {
			return nil, NewError(OpListNetworks, CodeInvalidArg, err)
		}
		out = append(out, *n)
	}
	return out, nil
}

func (hcnHNS) GetNetwork(name string) (*Network, error) {
	n, err := hcn.GetNetworkByName(name)
	if err != nil {
		return nil, wrapHCN(OpGetNetwork, err)
	}
	out, err := fromHCNNetwork(n)
	if err != nil {
		return nil, NewError(OpGetNetwork, CodeInvalidArg, err)
	}
	return out, nil
}

func fromHCNNetwork(n *hcn.HostComputeNetwork) (*Network, error) {
	out := &Network{ID: n.Id, Name: n.Name, Type: string(n.Type)}
	for _, p := range n.Policies {
		if p.Type != hcn.RemoteSubnetRoute {
			continue
		}
		var s hcn.RemoteSubnetRoutePolicySetting
		if err := json.Unmarshal(p.Settings, &s); err != nil {
			return nil, fmt.Errorf("network %q: RemoteSubnetRoute policy: %w", n.Name, err)
		}
		out.RemoteSubnets = append(out.RemoteSubnets, RemoteSubnet{
			DestinationPrefix:           s.DestinationPrefix,
			IsolationID:                 s.IsolationId,
			ProviderAddress:             s.ProviderAddress,
			DistributedRouterMacAddress: s.DistributedRouterMacAddress,
		})
	}
	return out, nil
}

func (hcnHNS) ListEndpoints(networkID string) ([]Endpoint, error) {
	eps, err := hcn.ListEndpointsOfNetwork(networkID)
	if err != nil {
		return nil, wrapHCN(OpListEndpoints, err)
	}
	out := make([]Endpoint, 0, len(eps))
	for i := range eps {
		out = append(out, fromHCNEndpoint(&eps[i]))
	}
	return out, nil
}

func (hcnHNS) CreateEndpoint(networkID string, ep *Endpoint) (*Endpoint, error) {
	in := &hcn.HostComputeEndpoint{
		Name:          ep.Name,
		MacAddress:    ep.MacAddress,
		Flags:         hcn.EndpointFlags(ep.Flags),
		SchemaVersion: schemaV2,
	}
	for _, c := range ep.IPConfigurations {
		in.IpConfigurations = append(in.IpConfigurations, hcn.IpConfig{IpAddress: c.IPAddress, PrefixLength: c.PrefixLength})
	}
	for _, p := range ep.Policies {
		in.Policies = append(in.Policies, hcn.EndpointPolicy{Type: hcn.EndpointPolicyType(p.Type), Settings: p.Settings})
	}
	created, err := (&hcn.HostComputeNetwork{Id: networkID}).CreateEndpoint(in)
	if err != nil {
		return nil, wrapHCN(OpCreateEndpoint, err)
	}
	out := fromHCNEndpoint(created)
	return &out, nil
}

func (hcnHNS) DeleteEndpoint(id string) error {
	return wrapHCN(OpDeleteEndpoint, (&hcn.HostComputeEndpoint{Id: id}).Delete())
}

func (hcnHNS) ListLoadBalancers() ([]LoadBalancer, error) {
	lbs, err := hcn.ListLoadBalancers()
	if err != nil {
		return nil, wrapHCN(OpListLoadBalancers, err)
	}
	out := make([]LoadBalancer, 0, len(lbs))
	for i := range lbs {
		out = append(out, fromHCNLoadBalancer(&lbs[i]))
	}
	return out, nil
}

func (hcnHNS) CreateLoadBalancer(lb *LoadBalancer) (*LoadBalancer, error) {
	created, err := toHCNLoadBalancer(lb).Create()
	if err != nil {
		return nil, wrapHCN(OpCreateLoadBalancer, err)
	}
	out := fromHCNLoadBalancer(created)
	return &out, nil
}

func (hcnHNS) UpdateLoadBalancer(id string, lb *LoadBalancer) (*LoadBalancer, error) {
	updated, err := toHCNLoadBalancer(lb).Update(id)
	if err != nil {
		return nil, wrapHCN(OpUpdateLoadBalancer, err)
	}
	out := fromHCNLoadBalancer(updated)
	return &out, nil
}

func (hcnHNS) DeleteLoadBalancer(id string) error {
	return wrapHCN(OpDeleteLoadBalancer, (&hcn.HostComputeLoadBalancer{Id: id}).Delete())
}

func fromHCNEndpoint(ep *hcn.HostComputeEndpoint) Endpoint {
	out := Endpoint{
		ID: ep.Id, Name: ep.Name, HostComputeNetwork: ep.HostComputeNetwork,
		MacAddress: ep.MacAddress, Flags: EndpointFlags(ep.Flags),
	}
	for _, c := range ep.IpConfigurations {
		out.IPConfigurations = append(out.IPConfigurations, IPConfig{IPAddress: c.IpAddress, PrefixLength: c.PrefixLength})
	}
	for _, p := range ep.Policies {
		out.Policies = append(out.Policies, EndpointPolicy{Type: string(p.Type), Settings: p.Settings})
	}
	return out
}

func toHCNLoadBalancer(lb *LoadBalancer) *hcn.HostComputeLoadBalancer {
	out := &hcn.HostComputeLoadBalancer{
		HostComputeEndpoints: lb.HostComputeEndpoints,
		SourceVIP:            lb.SourceVIP,
		FrontendVIPs:         lb.FrontendVIPs,
		Flags:                hcn.LoadBalancerFlags(lb.Flags),
		SchemaVersion:        schemaV2,
	}
	for _, pm := range lb.PortMappings {
		out.PortMappings = append(out.PortMappings, hcn.LoadBalancerPortMapping{
			Protocol:         pm.Protocol,
			InternalPort:     pm.InternalPort,
			ExternalPort:     pm.ExternalPort,
			DistributionType: hcn.LoadBalancerDistribution(pm.DistributionType),
			Flags:            hcn.LoadBalancerPortMappingFlags(pm.Flags),
		})
	}
	return out
}

func fromHCNLoadBalancer(lb *hcn.HostComputeLoadBalancer) LoadBalancer {
	out := LoadBalancer{
		ID:                   lb.Id,
		HostComputeEndpoints: lb.HostComputeEndpoints,
		SourceVIP:            lb.SourceVIP,
		FrontendVIPs:         lb.FrontendVIPs,
		Flags:                LoadBalancerFlags(lb.Flags),
	}
	for _, pm := range lb.PortMappings {
		out.PortMappings = append(out.PortMappings, PortMapping{
			Protocol:         pm.Protocol,
			InternalPort:     pm.InternalPort,
			ExternalPort:     pm.ExternalPort,
			DistributionType: Distribution(pm.DistributionType),
			Flags:            PortMappingFlags(pm.Flags),
		})
	}
	return out
}

// wrapHCN classifies an hcn error by its Win32/HRESULT code.
func wrapHCN(op string, err error) error {
	if err == nil {
		return nil
	}
	code := hcnCode(err)
	if code == 0 {
		code = codeInMessage(err.Error())
	}
	if code == 0 && hcn.IsNotFoundError(err) {
		code = CodeNotFound // hcsshim's own "not found" errors carry no code
	}
	return NewError(op, code, err)
}

// hcnCode digs the Win32/HRESULT code out of an hcn error. hcn wraps codes in
// hcsshim's internal HcsError, which has an exported Err field but no Unwrap.
func hcnCode(err error) uint32 {
	for depth := 0; err != nil && depth < 8; depth++ {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return uint32(errno)
		}
		var dll *sysw.DLLError
		if errors.As(err, &dll) {
			err = dll.Err
			continue
		}
		var he *hcn.HcnError
		if errors.As(err, &he) && he.HcsError != nil {
			err = he.Err
			continue
		}
		err = errField(err)
	}
	return 0
}

// errField returns the Err field of a struct error (or nil).
func errField(err error) error {
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	f := v.FieldByName("Err")
	if !f.IsValid() || !f.CanInterface() {
		return nil
	}
	inner, _ := f.Interface().(error)
	return inner
}
