package windows

import (
	"errors"
	"testing"
)

func TestFakeHNSEnforces(t *testing.T) {
	type env struct {
		f             *FakeHNS
		net, ep1, ep2 string
		lb            string
	}
	setup := func(v Version) *env {
		f := NewFakeHNS(v)
		e := &env{f: f}
		e.net = f.AddNetwork(Network{Name: "cbr0", Type: NetworkTypeL2Bridge})
		e.ep1 = f.AddLocalEndpoint(e.net, mustAddr("10.244.1.5"), "pod-a")
		e.ep2 = f.AddLocalEndpoint(e.net, mustAddr("10.244.1.6"), "pod-b")
		lb, err := f.CreateLoadBalancer(&LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep1},
			PortMappings: []PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 8080}}})
		if err != nil {
			panic(err)
		}
		e.lb = lb.ID
		return e
	}
	pm := func(proto uint32, port uint16) []PortMapping {
		return []PortMapping{{Protocol: proto, ExternalPort: port, InternalPort: 8080}}
	}
	cases := []struct {
		name    string
		version Version
		call    func(e *env) error
		code    uint32 // 0: success
		class   Class
	}{
		{"same frontend, protocol and port", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, CodePortAlreadyExists, ClassAlreadyExists},
		{"same frontend and port, other protocol", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(17, 80)})
			return err
		}, 0, ClassOther},
		{"same port, the other family (node ports of a dual-stack node)", hnsModern, func(e *env) error {
			if _, err := e.f.CreateLoadBalancer(&LoadBalancer{HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 30080)}); err != nil {
				return err
			}
			_, err := e.f.CreateLoadBalancer(&LoadBalancer{Flags: LBFlagIPv6, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 30080)})
			return err
		}, 0, ClassOther},
		{"no endpoints", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, PortMappings: pm(6, 80)})
			return err
		}, CodeInvalidArg, ClassOther},
		{"unknown endpoint", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, HostComputeEndpoints: []string{"nope"}, PortMappings: pm(6, 80)})
			return err
		}, CodeEndpointNotFound, ClassNotFound},
		{"no port mapping", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, HostComputeEndpoints: []string{e.ep1}})
			return err
		}, CodeInvalidArg, ClassOther},
		{"delete a missing load balancer", hnsModern, func(e *env) error { return e.f.DeleteLoadBalancer("nope") }, CodeNotFound, ClassNotFound},
		{"delete a missing endpoint", hnsModern, func(e *env) error { return e.f.DeleteEndpoint("nope") }, CodeEndpointNotFound, ClassNotFound},
		{"delete an endpoint in use", hnsModern, func(e *env) error { return e.f.DeleteEndpoint(e.ep1) }, CodeEntityHasReferences, ClassInUse},
		{"delete an unused endpoint", hnsModern, func(e *env) error { return e.f.DeleteEndpoint(e.ep2) }, 0, ClassOther},
		{"duplicate endpoint address", hnsModern, func(e *env) error {
			_, err := e.f.CreateEndpoint(e.net, &Endpoint{IPConfigurations: []IPConfig{{IPAddress: "10.244.1.5"}}, Flags: EndpointFlagRemote})
			return err
		}, CodeAlreadyExists, ClassAlreadyExists},
		{"endpoint on a missing network", hnsModern, func(e *env) error {
			_, err := e.f.CreateEndpoint("nope", &Endpoint{IPConfigurations: []IPConfig{{IPAddress: "10.244.2.5"}}})
			return err
		}, CodeNetworkNotFound, ClassNotFound},
		{"missing network", hnsModern, func(e *env) error { _, err := e.f.GetNetwork("nope"); return err }, CodeNetworkNotFound, ClassNotFound},
		{"update before HNS 15.4", Version{Major: 13, Minor: 0}, func(e *env) error {
			_, err := e.f.UpdateLoadBalancer(e.lb, &LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, CodeNotImplemented, ClassNotImplemented},
		{"update a missing load balancer", hnsModern, func(e *env) error {
			_, err := e.f.UpdateLoadBalancer("nope", &LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, CodeNotFound, ClassNotFound},
		{"update in place keeps the slot", hnsModern, func(e *env) error {
			_, err := e.f.UpdateLoadBalancer(e.lb, &LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, 0, ClassOther},
		{"restarting", hnsModern, func(e *env) error { e.f.Down(1); _, err := e.f.ListLoadBalancers(); return err }, CodeManagerStopped, ClassTransient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(tc.version)
			err := tc.call(e)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				return
			}
			var he *Error
			if !errors.As(err, &he) || he.Code != tc.code || he.Class != tc.class {
				t.Fatalf("got %v, want code 0x%x (%s)", err, tc.code, tc.class)
			}
		})
	}
}

func TestFakeHNSUpdateBugOf15_4(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		want string // endpoint after the update
	}{{Version{15, 4}, "10.244.1.5"}, {Version{15, 5}, "10.244.1.6"}} {
		f := NewFakeHNS(tc.v)
		net := f.AddNetwork(Network{Name: "cbr0"})
		a := f.AddLocalEndpoint(net, mustAddr("10.244.1.5"), "")
		b := f.AddLocalEndpoint(net, mustAddr("10.244.1.6"), "")
		lb, err := f.CreateLoadBalancer(&LoadBalancer{HostComputeEndpoints: []string{a}, PortMappings: []PortMapping{{Protocol: 6, ExternalPort: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.UpdateLoadBalancer(lb.ID, &LoadBalancer{HostComputeEndpoints: []string{b}, PortMappings: []PortMapping{{Protocol: 6, ExternalPort: 1}}}); err != nil {
			t.Fatalf("%s: update: %v", tc.v, err)
		}
		want := "lb TCP *:1 -> 0 flags=0 pflags=0 dist=0 eps=" + tc.want + "\n"
		if got := f.Dump(); got[:len(want)] != want {
			t.Errorf("%s: after update:\n%s", tc.v, got)
		}
	}
}

func TestFakeHNSFailureInjection(t *testing.T) {
	f := NewFakeHNS(hnsModern)
	boom := NewError(OpVersion, 0x5, errors.New("access denied"))
	f.FailCall(2, boom)
	if _, err := f.Version(); err != nil {
		t.Fatalf("call 1: %v", err)
	}
	if _, err := f.Version(); !errors.Is(err, boom) {
		t.Fatalf("call 2: got %v, want the injected error", err)
	}
	f.FailOp(OpListLoadBalancers, boom)
	if _, err := f.Version(); err != nil {
		t.Fatalf("other operations are unaffected: %v", err)
	}
	if _, err := f.ListLoadBalancers(); !errors.Is(err, boom) {
		t.Fatalf("FailOp: got %v", err)
	}
	if _, err := f.ListLoadBalancers(); err != nil {
		t.Fatalf("FailOp fails once: %v", err)
	}
	f.Down(-1)
	for i := 0; i < 3; i++ {
		if _, err := f.Version(); !IsTransient(err) {
			t.Fatalf("while down: %v", err)
		}
	}
	f.Up()
	if _, err := f.Version(); err != nil {
		t.Fatalf("after Up: %v", err)
	}
	if got := f.Calls()[OpVersion]; got != 7 {
		t.Errorf("Version calls = %d, want 7 (failed calls count)", got)
	}
	f.ResetCalls()
	if f.TotalCalls() != 0 {
		t.Errorf("calls after reset: %d", f.TotalCalls())
	}
}
