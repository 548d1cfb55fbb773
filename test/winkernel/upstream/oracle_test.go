//go:build windows

// This file is kproxy's, not upstream's: refresh.sh copies upstream's
// winkernel package (k8s.io/kubernetes/pkg/proxy/winkernel, with its tests)
// beside it, so that it drives upstream's proxier the way upstream's own
// tests do, through newProxierInternal and pkg/proxy/winkernel/testing's
// HCN mock, unchanged.

package winkernel

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/Microsoft/hnslib/hcn"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	kubeproxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/healthcheck"
	fakehcn "k8s.io/kubernetes/pkg/proxy/winkernel/testing"

	"github.com/kproxy/kproxy/test/winkernel/compare"
)

// oracle is upstream's proxier for one scenario, with the HCN mock it
// programs and the objects of the last step fed to it.
type oracle struct {
	t       *testing.T
	s       *compare.Scenario
	proxier *Proxier
	mock    *fakehcn.HcnMock
	network *hcn.HostComputeNetwork
	local   map[string]bool
	svcs    map[string]*v1.Service
	slices  map[string]*discovery.EndpointSlice
}

// newOracle builds upstream's proxier as its NewFakeProxier does (the HCN
// mock over one network, newProxierInternal with a winkernel configuration,
// testHostMacProvider), with the scenario's network, node, source VIP,
// DSR and health check settings instead of NewFakeProxier's fixed ones.
func newOracle(t *testing.T, s *compare.Scenario) *oracle {
	t.Helper()
	facts := s.Facts(0)
	networkType := NETWORK_TYPE_L2BRIDGE
	if s.Overlay {
		networkType = NETWORK_TYPE_OVERLAY
	}
	network := newHnsNetwork(&hnsNetworkInfo{id: strings.ToUpper(guid), name: compare.NetworkName, networkType: networkType,
		remoteSubnets: remoteSubnets(facts)})
	mock := fakehcn.NewHcnMock(network)
	o := &oracle{t: t, s: s, mock: mock, network: network, local: map[string]bool{},
		svcs: map[string]*v1.Service{}, slices: map[string]*discovery.EndpointSlice{}}
	for name, ip := range facts.Local {
		prefix := uint8(24)
		if ip.Is6() {
			prefix = 64
		}
		mock.PopulateQueriedEndpoints(name, network.Id, ip.String(), macAddressLocal1, prefix)
		o.local[ip.String()] = true
	}
	config := kubeproxyconfig.KubeProxyWinkernelConfiguration{
		EnableDSR:             s.DSR,
		NetworkName:           compare.NetworkName,
		ForwardHealthCheckVip: s.HealthCheck,
		RootHnsEndpointName:   compare.RootEndpoint,
	}
	if facts.SourceVIP.IsValid() {
		config.SourceVip = facts.SourceVIP.String()
	}
	p, err := newProxierInternal(s.Family, facts.NodeName, net.IP(facts.NodeIP.AsSlice()), healthcheck.NewFakeServiceHealthServer(),
		nil, compare.HealthzPort, mock, &testHostMacProvider{macAddress: compare.HostMAC}, config, false)
	if err != nil || p == nil {
		t.Fatalf("upstream's proxier: %v", err)
	}
	// The mock's features are an HNS before 12.0 (no session affinity) and
	// without in-place updates; a modern HNS has affinity.
	p.supportedFeatures.SessionAffinity = !s.OldHNS
	o.proxier = p
	return o
}

func remoteSubnets(f compare.Facts) []*remoteSubnetInfo {
	var out []*remoteSubnetInfo
	for _, r := range f.RemoteSubnets {
		out = append(out, &remoteSubnetInfo{destinationPrefix: r.Prefix.String(), isolationID: 4096,
			providerAddress: r.ProviderAddress.String(), drMacAddress: macAddress})
	}
	return out
}

// step feeds step i (what changed since the last one) and syncs once.
func (o *oracle) step(i int) {
	st := o.s.Steps[i]
	p := o.proxier
	// Event handlers sync at once when initialized (through a runner the
	// fake proxier does not have): feed the step, then sync once.
	p.setInitialized(false)
	if o.s.Overlay {
		o.network.Policies = newHnsNetwork(&hnsNetworkInfo{remoteSubnets: remoteSubnets(o.s.Facts(i))}).Policies
	}
	seen := map[string]bool{}
	for _, svc := range st.Services {
		k := svc.Namespace + "/" + svc.Name
		seen[k] = true
		if old := o.svcs[k]; old != nil {
			p.OnServiceUpdate(old, svc)
		} else {
			p.OnServiceAdd(svc)
		}
		o.svcs[k] = svc
	}
	for k, old := range o.svcs {
		if !seen[k] {
			p.OnServiceDelete(old)
			delete(o.svcs, k)
		}
	}
	clear(seen)
	for _, sl := range st.Slices {
		k := sl.Namespace + "/" + sl.Name
		seen[k] = true
		if old := o.slices[k]; old != nil {
			p.OnEndpointSliceUpdate(old, sl)
		} else {
			p.OnEndpointSliceAdd(sl)
		}
		o.slices[k] = sl
	}
	for k, old := range o.slices {
		if !seen[k] {
			p.OnEndpointSliceDelete(old)
			delete(o.slices, k)
		}
	}
	p.mu.Lock()
	p.servicesSynced, p.endpointSlicesSynced = true, true
	p.mu.Unlock()
	p.setInitialized(true)
	p.syncProxyRules()
}

// objects returns what the HCN mock holds, in the normal form.
func (o *oracle) objects() compare.Objects {
	eps, _ := o.mock.ListEndpoints()
	byID := map[string]string{}
	var out compare.Objects
	seen := map[string]bool{}
	for _, e := range eps {
		if seen[e.Id] {
			continue // the mock files each endpoint under its ID and its name
		}
		seen[e.Id] = true
		ip := ""
		if len(e.IpConfigurations) > 0 {
			ip = canon(e.IpConfigurations[0].IpAddress)
		}
		byID[strings.ToUpper(e.Id)] = ip
		if o.local[ip] {
			continue
		}
		ep := compare.EP{IP: ip, Remote: e.Flags&hcn.EndpointFlagsRemoteEndpoint != 0, MAC: e.MacAddress}
		for _, pol := range e.Policies {
			if pol.Type != hcn.NetworkProviderAddress {
				continue
			}
			var s hcn.ProviderAddressEndpointPolicySetting
			if json.Unmarshal(pol.Settings, &s) == nil {
				ep.ProviderAddress = s.ProviderAddress
			}
		}
		out.EPs = append(out.EPs, ep)
	}
	lbs, _ := o.mock.ListLoadBalancers()
	for _, lb := range lbs {
		l := compare.LB{IPv6: lb.Flags&LoadBalancerFlagsIPv6 != 0, Flags: uint32(lb.Flags), SourceVIP: lb.SourceVIP}
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
		out.LBs = append(out.LBs, l)
	}
	return out
}

func canon(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().String()
	}
	return s
}

var showExplained = flag.Bool("oracle.explained", false, "log every intended difference found")

// TestKproxyOracle feeds every scenario (test/winkernel/compare) to
// upstream's winkernel proxier and to kproxy's Windows backend, step by
// step, and compares the HNS load balancers and endpoints each programs.
// Every difference must be one of compare.Differences (each with its
// reason, in docs/compatibility.md); anything else fails.
func TestKproxyOracle(t *testing.T) {
	scenarios, err := compare.Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	total, explained := 0, map[string]int{}
	minSame, maxSame := -1, 0
	for i := range scenarios {
		s := &scenarios[i]
		t.Run(s.Name, func(t *testing.T) {
			up := newOracle(t, s)
			kp, err := compare.NewKproxy(s)
			if err != nil {
				t.Fatal(err)
			}
			for step := range s.Steps {
				up.step(step)
				if err := kp.Step(context.Background(), step); err != nil {
					t.Fatal(err)
				}
				r := compare.Compare(s, step, up.objects(), kp.Objects())
				for _, d := range r.Unexplained {
					t.Errorf("step %d (%s): not an intended difference: %s", step, s.Steps[step].Name, d)
				}
				for id, ds := range r.Explained {
					explained[id] += len(ds)
					if *showExplained {
						for _, d := range ds {
							t.Logf("step %d: %s: %s", step, id, d)
						}
					}
				}
				total += r.Same
				if minSame < 0 || r.Same < minSame {
					minSame = r.Same
				}
				maxSame = max(maxSame, r.Same)
			}
		})
	}
	var ids []string
	for id := range explained {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%s=%d", id, explained[id]))
	}
	t.Logf("%d scenarios: %d objects identical (%d-%d per step); intended differences: %s",
		len(scenarios), total, minSame, maxSame, strings.Join(parts, " "))
}

// TestKproxyOracleSeesPlannerChange: a planner decision changed (the DSR
// flag of kproxy's ClusterIP load balancers flipped) fails the comparison.
func TestKproxyOracleSeesPlannerChange(t *testing.T) {
	scenarios, err := compare.Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	s := &scenarios[0]
	up := newOracle(t, s)
	kp, err := compare.NewKproxy(s)
	if err != nil {
		t.Fatal(err)
	}
	kp.Mutate = compare.FlipDSR
	up.step(0)
	if err := kp.Step(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	r := compare.Compare(s, 0, up.objects(), kp.Objects())
	if len(r.Unexplained) == 0 {
		t.Fatal("the DSR flag flipped in kproxy's plan went unseen")
	}
	t.Logf("DSR flipped: %d unexplained differences, e.g. %s", len(r.Unexplained), r.Unexplained[0])
}
