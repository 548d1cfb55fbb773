//go:build windows

package hns

import (
	"errors"
	"testing"
)

// TestHCNAdapterWithoutHNS runs where computenetwork.dll and vmcompute.dll
// are missing (Wine in CI, Windows without the container feature): every hcn
// call must come back as a classified, transient "module not found" error,
// never a crash.
func TestHCNAdapterWithoutHNS(t *testing.T) {
	h, err := NewHNS()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := h.Version(); err == nil {
		t.Skipf("HNS %s is present; this test covers hosts without it", v)
	}
	const guid = "5a3b8f10-6d2e-4c1a-9f0b-1c2d3e4f5a6b"
	lb := &LoadBalancer{HostComputeEndpoints: []string{guid}, FrontendVIPs: []string{"10.96.0.10"},
		PortMappings: []PortMapping{{Protocol: ProtocolTCP, InternalPort: 8080, ExternalPort: 80}}}
	ep := &Endpoint{Name: "kproxy-remote-10.244.2.5", HostComputeNetwork: guid, IPConfigurations: []IPConfig{{IPAddress: "10.244.2.5"}},
		MacAddress: "02-11-0a-f4-02-05", Flags: EndpointFlagRemote}
	calls := []struct {
		op   string
		call func() error
	}{
		{OpVersion, func() error { _, err := h.Version(); return err }},
		{OpGetNetwork, func() error { _, err := h.GetNetwork("cbr0"); return err }},
		{OpListEndpoints, func() error { _, err := h.ListEndpoints(guid); return err }},
		{OpCreateEndpoint, func() error { _, err := h.CreateEndpoint(guid, ep); return err }},
		{OpDeleteEndpoint, func() error { return h.DeleteEndpoint(guid) }},
		{OpListLoadBalancers, func() error { _, err := h.ListLoadBalancers(); return err }},
		{OpCreateLoadBalancer, func() error { _, err := h.CreateLoadBalancer(lb); return err }},
		{OpUpdateLoadBalancer, func() error { _, err := h.UpdateLoadBalancer(guid, lb); return err }},
		{OpDeleteLoadBalancer, func() error { return h.DeleteLoadBalancer(guid) }},
	}
	for _, c := range calls {
		err := c.call()
		var he *Error
		if !errors.As(err, &he) {
			t.Errorf("%s: got %v (%T), want an *Error", c.op, err, err)
			continue
		}
		if c.op == OpVersion {
			t.Logf("%s without HNS: %v", c.op, err)
		}
		if he.Op != c.op || he.Code != CodeModNotFound || !IsTransient(err) {
			t.Errorf("%s: got op %s code 0x%x class %s (%v), want module not found (0x7e), transient", c.op, he.Op, he.Code, he.Class, err)
		}
	}
}
