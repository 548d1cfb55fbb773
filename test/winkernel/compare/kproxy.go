package compare

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/cache"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// Kproxy runs kproxy's Windows backend for one family on its fake HNS,
// step by step, one full sync per step (as after the step's changes).
type Kproxy struct {
	s     *Scenario
	f     *fakehns.Fake
	b     *windows.Backend
	netID string
	// local are the CNI's endpoint addresses (left out of the comparison).
	local map[string]bool
	// Mutate, when set, changes what the fake HNS holds before it is read
	// (the oracle's self-test: a planner decision changed must be seen).
	Mutate func(*Objects)
}

// NewKproxy sets up the fake HNS and the backend for s.
func NewKproxy(s *Scenario) (*Kproxy, error) {
	facts := s.Facts(0)
	v := hns.Version{Major: 15, Minor: 5}
	if s.OldHNS {
		v = hns.Version{Major: 11, Minor: 10} // IPv6 and DSR, no session affinity
	}
	f := fakehns.New(v)
	n := hns.Network{Name: NetworkName, Type: hns.NetworkTypeL2Bridge}
	if s.Overlay {
		n.Type = hns.NetworkTypeOverlay
		n.RemoteSubnets = remoteSubnets(facts)
	}
	k := &Kproxy{s: s, f: f, local: map[string]bool{}}
	k.netID = f.AddNetwork(n)
	for name, ip := range facts.Local {
		f.AddEndpoint(hns.Endpoint{HostComputeNetwork: k.netID, Name: name, IPConfigurations: []hns.IPConfig{{IPAddress: ip.String()}},
			MacAddress: "00-15-5d-00-00-99"})
		k.local[ip.String()] = true
	}
	quiet := logr.New(discard{})
	b, err := windows.New(windows.Options{
		HNS: f, Family: s.Family, NetworkName: NetworkName, SourceVIP: facts.SourceVIP, EnableDSR: s.DSR,
		RootHNSEndpointName: RootEndpoint, ForwardHealthCheckVIP: s.HealthCheck, HealthzPort: HealthzPort,
		NodeIP: facts.NodeIP, HostMAC: HostMAC, Logger: quiet, CheckPeriod: -1,
		Interfaces: func() ([]windows.HostInterface, error) { return nil, nil },
	})
	if err != nil {
		return nil, err
	}
	k.b = b
	return k, nil
}

func remoteSubnets(f Facts) []hns.RemoteSubnet {
	var out []hns.RemoteSubnet
	for _, r := range f.RemoteSubnets {
		out = append(out, hns.RemoteSubnet{DestinationPrefix: r.Prefix.String(), ProviderAddress: r.ProviderAddress.String(), IsolationID: 4096})
	}
	return out
}

// Step programs step i.
func (k *Kproxy) Step(ctx context.Context, i int) error {
	st := k.s.Steps[i]
	if k.s.Overlay {
		k.f.SetRemoteSubnets(k.netID, remoteSubnets(k.s.Facts(i)))
	}
	var node *v1.Node
	for _, n := range st.Nodes {
		if n.Name == k.s.Topology.ProxyNode {
			node = n
		}
	}
	snap := cache.Build(k.s.Topology.ProxyNode, node, st.Services, st.Slices)
	if err := k.b.Sync(ctx, windows.FullView(k.s.Family, snap)); err != nil {
		return fmt.Errorf("kproxy sync of step %q: %w", st.Name, err)
	}
	if q := k.b.Quarantined(); len(q) > 0 {
		return fmt.Errorf("kproxy quarantined %v in step %q", q, st.Name)
	}
	return nil
}

// Objects returns what the fake HNS holds, in the normal form.
func (k *Kproxy) Objects() Objects {
	eps := k.f.Endpoints()
	byID := map[string]string{}
	var o Objects
	for _, e := range eps {
		ip := ""
		if ips := e.IPs(); len(ips) > 0 {
			ip = ips[0].String()
		}
		byID[strings.ToUpper(e.ID)] = ip
		if k.local[ip] {
			continue
		}
		o.EPs = append(o.EPs, EP{IP: ip, Remote: e.IsRemote(), ProviderAddress: e.ProviderAddress(), MAC: e.MacAddress})
	}
	for _, lb := range k.f.LoadBalancers() {
		l := LB{IPv6: lb.Flags&hns.LBFlagIPv6 != 0, Flags: uint32(lb.Flags), SourceVIP: lb.SourceVIP}
		for _, v := range lb.FrontendVIPs {
			l.FrontendVIPs = append(l.FrontendVIPs, canon(v))
		}
		if len(lb.PortMappings) > 0 {
			pm := lb.PortMappings[0]
			l.Protocol, l.ExternalPort, l.InternalPort = pm.Protocol, pm.ExternalPort, pm.InternalPort
			l.PortFlags, l.Distribution = uint32(pm.Flags), uint32(pm.DistributionType)
		}
		for _, id := range lb.HostComputeEndpoints {
			l.Endpoints = append(l.Endpoints, byID[strings.ToUpper(id)])
		}
		o.LBs = append(o.LBs, l)
	}
	if k.Mutate != nil {
		k.Mutate(&o)
	}
	return o
}

// canon writes an address in its canonical form (HNS does not promise one).
func canon(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().String()
	}
	return s
}

// discard is a log sink that drops everything (logr.Discard's nil sink
// would make the backend fall back to klog).
type discard struct{}

func (discard) Init(logr.RuntimeInfo)            {}
func (discard) Enabled(int) bool                 { return false }
func (discard) Info(int, string, ...any)         {}
func (discard) Error(error, string, ...any)      {}
func (d discard) WithValues(...any) logr.LogSink { return d }
func (d discard) WithName(string) logr.LogSink   { return d }
