package fakehns

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/platform/windows/hns"
)

var hnsModern = hns.Version{Major: 15, Minor: 5}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestFakeEnforces(t *testing.T) {
	type env struct {
		f             *Fake
		net, ep1, ep2 string
		lb            string
	}
	setup := func(v hns.Version) *env {
		f := New(v)
		e := &env{f: f}
		e.net = f.AddNetwork(hns.Network{Name: "cbr0", Type: hns.NetworkTypeL2Bridge})
		e.ep1 = f.AddLocalEndpoint(e.net, mustAddr("10.244.1.5"), "pod-a")
		e.ep2 = f.AddLocalEndpoint(e.net, mustAddr("10.244.1.6"), "pod-b")
		lb, err := f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep1},
			PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 8080}}})
		if err != nil {
			panic(err)
		}
		e.lb = lb.ID
		return e
	}
	pm := func(proto uint32, port uint16) []hns.PortMapping {
		return []hns.PortMapping{{Protocol: proto, ExternalPort: port, InternalPort: 8080}}
	}
	cases := []struct {
		name    string
		version hns.Version
		call    func(e *env) error
		code    uint32 // 0: success
		class   hns.Class
	}{
		{"same frontend, protocol and port", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, hns.CodePortAlreadyExists, hns.ClassAlreadyExists},
		{"same frontend and port, other protocol", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(17, 80)})
			return err
		}, 0, hns.ClassOther},
		{"same port, the other family (node ports of a dual-stack node)", hnsModern, func(e *env) error {
			if _, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 30080)}); err != nil {
				return err
			}
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{Flags: hns.LBFlagIPv6, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 30080)})
			return err
		}, 0, hns.ClassOther},
		{"no endpoints", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, PortMappings: pm(6, 80)})
			return err
		}, hns.CodeInvalidArg, hns.ClassOther},
		{"unknown endpoint", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, HostComputeEndpoints: []string{"nope"}, PortMappings: pm(6, 80)})
			return err
		}, hns.CodeEndpointNotFound, hns.ClassNotFound},
		{"no port mapping", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, HostComputeEndpoints: []string{e.ep1}})
			return err
		}, hns.CodeInvalidArg, hns.ClassOther},
		{"delete a missing load balancer", hnsModern, func(e *env) error { return e.f.DeleteLoadBalancer("nope") }, hns.CodeNotFound, hns.ClassNotFound},
		{"delete a missing endpoint", hnsModern, func(e *env) error { return e.f.DeleteEndpoint("nope") }, hns.CodeEndpointNotFound, hns.ClassNotFound},
		{"delete an endpoint in use", hnsModern, func(e *env) error { return e.f.DeleteEndpoint(e.ep1) }, hns.CodeEntityHasReferences, hns.ClassInUse},
		{"delete an unused endpoint", hnsModern, func(e *env) error { return e.f.DeleteEndpoint(e.ep2) }, 0, hns.ClassOther},
		{"duplicate endpoint address", hnsModern, func(e *env) error {
			_, err := e.f.CreateEndpoint(e.net, &hns.Endpoint{IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.1.5"}}, Flags: hns.EndpointFlagRemote})
			return err
		}, hns.CodeAlreadyExists, hns.ClassAlreadyExists},
		{"endpoint on a missing network", hnsModern, func(e *env) error {
			_, err := e.f.CreateEndpoint("nope", &hns.Endpoint{IPConfigurations: []hns.IPConfig{{IPAddress: "10.244.2.5"}}})
			return err
		}, hns.CodeNetworkNotFound, hns.ClassNotFound},
		{"missing network", hnsModern, func(e *env) error { _, err := e.f.GetNetwork("nope"); return err }, hns.CodeNetworkNotFound, hns.ClassNotFound},
		{"update before HNS 15.4", hns.Version{Major: 13, Minor: 0}, func(e *env) error {
			_, err := e.f.UpdateLoadBalancer(e.lb, &hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, hns.CodeNotImplemented, hns.ClassNotImplemented},
		{"update a missing load balancer", hnsModern, func(e *env) error {
			_, err := e.f.UpdateLoadBalancer("nope", &hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, hns.CodeNotFound, hns.ClassNotFound},
		{"update in place keeps the slot", hnsModern, func(e *env) error {
			_, err := e.f.UpdateLoadBalancer(e.lb, &hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 80)})
			return err
		}, 0, hns.ClassOther},
		{"restarting", hnsModern, func(e *env) error { e.f.Down(1); _, err := e.f.ListLoadBalancers(); return err }, hns.CodeManagerStopped, hns.ClassTransient},
		{"not running (0x6b5)", hnsModern, func(e *env) error { e.f.StopService(1); _, err := e.f.ListLoadBalancers(); return err }, hns.CodeRPCUnknownInterface, hns.ClassTransient},
		{"a host socket holds the port", hnsModern, func(e *env) error {
			e.f.HoldHostPort(hns.ProtocolTCP, 10256)
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"203.0.113.7"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 10256)})
			return err
		}, hns.CodePortAlreadyExists, hns.ClassAlreadyExists},
		{"a host socket holds another protocol", hnsModern, func(e *env) error {
			e.f.HoldHostPort(hns.ProtocolUDP, 10256)
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"203.0.113.7"}, HostComputeEndpoints: []string{e.ep2}, PortMappings: pm(6, 10256)})
			return err
		}, 0, hns.ClassOther},
		{"endpoint IDs in any case", hnsModern, func(e *env) error {
			_, err := e.f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.12"}, HostComputeEndpoints: []string{strings.ToLower(e.ep2)}, PortMappings: pm(6, 80)})
			return err
		}, 0, hns.ClassOther},
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
			var he *hns.Error
			if !errors.As(err, &he) || he.Code != tc.code || he.Class != tc.class {
				t.Fatalf("got %v, want code 0x%x (%s)", err, tc.code, tc.class)
			}
		})
	}
}

func TestFakeUpdateBugOf15_4(t *testing.T) {
	for _, tc := range []struct {
		v    hns.Version
		want string // endpoint after the update
	}{{hns.Version{Major: 15, Minor: 4}, "10.244.1.5"}, {hns.Version{Major: 15, Minor: 5}, "10.244.1.6"}} {
		f := New(tc.v)
		net := f.AddNetwork(hns.Network{Name: "cbr0"})
		a := f.AddLocalEndpoint(net, mustAddr("10.244.1.5"), "")
		b := f.AddLocalEndpoint(net, mustAddr("10.244.1.6"), "")
		lb, err := f.CreateLoadBalancer(&hns.LoadBalancer{HostComputeEndpoints: []string{a}, PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.UpdateLoadBalancer(lb.ID, &hns.LoadBalancer{HostComputeEndpoints: []string{b}, PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 1}}}); err != nil {
			t.Fatalf("%s: update: %v", tc.v, err)
		}
		want := "lb TCP *:1 -> 0 flags=0 pflags=0 dist=0 eps=" + tc.want + "\n"
		if got := f.Dump(); got[:len(want)] != want {
			t.Errorf("%s: after update:\n%s", tc.v, got)
		}
	}
}

func TestFakeFailureInjection(t *testing.T) {
	f := New(hnsModern)
	boom := hns.NewError(hns.OpVersion, 0x5, errors.New("access denied"))
	f.FailCall(2, boom)
	if _, err := f.Version(); err != nil {
		t.Fatalf("call 1: %v", err)
	}
	if _, err := f.Version(); !errors.Is(err, boom) {
		t.Fatalf("call 2: got %v, want the injected error", err)
	}
	f.FailOp(hns.OpListLoadBalancers, boom)
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
		if _, err := f.Version(); !hns.IsTransient(err) {
			t.Fatalf("while down: %v", err)
		}
	}
	f.Up()
	if _, err := f.Version(); err != nil {
		t.Fatalf("after Up: %v", err)
	}
	if got := f.Calls()[hns.OpVersion]; got != 7 {
		t.Errorf("Version calls = %d, want 7 (failed calls count)", got)
	}
	f.ResetCalls()
	if f.TotalCalls() != 0 {
		t.Errorf("calls after reset: %d", f.TotalCalls())
	}
}

// TestFakeAnswersAsHNSDoes: the ways a real HNS answers that differ from
// what was sent, each enforced.
func TestFakeAnswersAsHNSDoes(t *testing.T) {
	f := New(hnsModern)
	net := f.AddNetwork(hns.Network{Name: "cbr0", Type: hns.NetworkTypeL2Bridge})
	ep := f.AddLocalEndpoint(net, mustAddr("10.244.1.5"), "pod-a")
	if ep != strings.ToUpper(ep) || net != strings.ToUpper(net) {
		t.Errorf("IDs %s, %s: want upper case", net, ep)
	}
	lb, err := f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.10"}, HostComputeEndpoints: []string{strings.ToLower(ep)},
		PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 8080, Flags: hns.PortFlagVIPExternalIP}}})
	if err != nil {
		t.Fatal(err)
	}
	if lb.ID != strings.ToUpper(lb.ID) || lb.HostComputeEndpoints[0] != ep {
		t.Errorf("created %s with endpoints %v: want upper-case IDs", lb.ID, lb.HostComputeEndpoints)
	}
	eps, err := f.ListEndpoints(strings.ToLower(net))
	if err != nil || len(eps) != 1 || eps[0].HostComputeNetwork != strings.ToLower(net) {
		t.Errorf("endpoints of %s: %+v, %v: want one, naming its network in lower case", net, eps, err)
	}
	if eps, err := f.ListEndpoints("5A3B8F10-0000-0000-0000-000000000000"); err != nil || eps == nil || len(eps) != 0 {
		t.Errorf("endpoints of a missing network: %v, %v; want an empty list and no error", eps, err)
	}

	// A changed echo: the fake applies what it was given and returns another value.
	f.RewriteOnRead(Rewrite{Field: hns.FieldPortFlags, From: uint32(hns.PortFlagVIPExternalIP), To: uint32(hns.PortFlagVIPExternalIP | hns.PortFlagILB)})
	lbs, _ := f.ListLoadBalancers()
	if got := lbs[0].PortMappings[0].Flags; got != hns.PortFlagVIPExternalIP|hns.PortFlagILB {
		t.Errorf("rewritten port flags read back %d, want 17", got)
	}
	if !strings.Contains(f.Dump(), "pflags=16") {
		t.Errorf("the fake must store what it was given:\n%s", f.Dump())
	}
	f.RewriteOnRead()

	// A creation that fails half-way leaves an object holding the port.
	boom := hns.NewError(hns.OpCreateLoadBalancer, hns.CodeInvalidArg, errors.New("failed half-way"))
	f.CreatePartially(1, boom)
	mk := func() error {
		_, err := f.CreateLoadBalancer(&hns.LoadBalancer{FrontendVIPs: []string{"10.96.0.11"}, HostComputeEndpoints: []string{ep},
			PortMappings: []hns.PortMapping{{Protocol: 6, ExternalPort: 80, InternalPort: 8080}}})
		return err
	}
	if err := mk(); !errors.Is(err, boom) {
		t.Fatalf("partial creation: got %v, want the injected error", err)
	}
	if err := mk(); !hns.IsAlreadyExists(err) {
		t.Errorf("creation in the slot of a partial load balancer: got %v, want already exists", err)
	}
	lbs, _ = f.ListLoadBalancers()
	var partial *hns.LoadBalancer
	for i := range lbs {
		if len(lbs[i].FrontendVIPs) == 1 && lbs[i].FrontendVIPs[0] == "10.96.0.11" {
			partial = &lbs[i]
		}
	}
	if partial == nil || len(partial.PortMappings) != 0 || len(partial.HostComputeEndpoints) != 0 {
		t.Fatalf("the partial load balancer lists as %+v, want no port mapping nor endpoint", partial)
	}
	if err := f.DeleteLoadBalancer(partial.ID); err != nil {
		t.Fatal(err)
	}
	if err := mk(); err != nil {
		t.Errorf("after deleting the partial load balancer: %v", err)
	}

	// A restart loses the load balancers; HNS brings them back later.
	before := f.Dump()
	f.RestartRestoring(2)
	if lbs, _ := f.ListLoadBalancers(); len(lbs) != 0 { // call 1
		t.Errorf("after the restart: %d load balancers, want none yet", len(lbs))
	}
	if lbs, _ := f.ListLoadBalancers(); len(lbs) != 2 { // call 2: restored
		t.Errorf("once restored: %d load balancers, want 2", len(lbs))
	}
	if got := f.Dump(); got != before {
		t.Errorf("restored:\n%s\nwant:\n%s", got, before)
	}
}
