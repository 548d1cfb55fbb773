package proxytest

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func randomManifest(t *testing.T, top *Topology, seed uint64, first int) []byte {
	t.Helper()
	sc, err := top.RandomScenario(seed, first)
	if err != nil {
		t.Fatal(err)
	}
	data, err := Manifest(sc.Objects()...)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestRandomScenarioDeterministic: a seed always gives the same objects,
// and another first index only moves the addresses and ports.
func TestRandomScenarioDeterministic(t *testing.T) {
	top := Default()
	for seed := uint64(1); seed <= 50; seed++ {
		a, b := randomManifest(t, top, seed, SlotIndex(0)), randomManifest(t, top, seed, SlotIndex(0))
		if !bytes.Equal(a, b) {
			t.Fatalf("seed %d: two draws differ", seed)
		}
		x, err := top.RandomScenario(seed, SlotIndex(0))
		if err != nil {
			t.Fatal(err)
		}
		y, err := top.RandomScenario(seed, SlotIndex(7))
		if err != nil {
			t.Fatal(err)
		}
		if len(x.Services) != len(y.Services) || len(x.Slices) != len(y.Slices) || strings.Join(x.Summary, "\n") != strings.Join(y.Summary, "\n") {
			t.Errorf("seed %d: another first index drew another scenario:\n%s\n---\n%s", seed, strings.Join(x.Summary, "\n"), strings.Join(y.Summary, "\n"))
		}
	}
	if bytes.Equal(randomManifest(t, top, 1, SlotIndex(0)), randomManifest(t, top, 2, SlotIndex(0))) {
		t.Errorf("seeds 1 and 2 drew the same scenario")
	}
	if _, err := top.RandomScenario(1, RandomLastIndex); err == nil {
		t.Errorf("a first index leaving no room for %d Services was accepted", RandomIndexes)
	}
}

// TestRandomScenarioInvariants checks, over many seeds, what runners and
// the API server rely on, and that every feature the generator promises
// is drawn at least once.
func TestRandomScenarioInvariants(t *testing.T) {
	top := Default()
	seen := map[string]int{}
	const seeds = 400
	for seed := uint64(0); seed < seeds; seed++ {
		slot := int(seed % RandomSlots)
		sc, err := top.RandomScenario(seed, SlotIndex(slot))
		if err != nil {
			t.Fatal(err)
		}
		if len(sc.Services) == 0 || len(sc.Services) > RandomIndexes {
			t.Fatalf("seed %d: %d Services", seed, len(sc.Services))
		}
		for _, svc := range sc.Services {
			checkRandomService(t, top, seed, svc, sc.SlicesOf(svc.Name), seen)
		}
	}
	for _, f := range []string{
		"ClusterIP", "NodePort", "LoadBalancer", "IPv4", "IPv6", "dual-stack", "externalIPs",
		"etp-local", "itp-local", "affinity", "publishNotReady", "preferClose", "ipModeProxy",
		"noNodePorts", "sourceRanges", "udp", "tcp", "multiport", "unnamed", "sharedNodePort",
		"noEndpoints", "split", "duplicate", "terminatingDuplicate", "altPort", "nameMismatch",
		"protocolMismatch", "missingPort", "extraPort", "otherFamilySlice", "ready", "notReady",
		"terminatingServing", "terminatingNotServing", "unsetConditions", "servingNotReady", "noNodeName",
		"hint", "wrongHint", "pod-a1", "pod-b3",
	} {
		if seen[f] == 0 {
			t.Errorf("no Service or slice with %s in %d seeds", f, seeds)
		}
	}
	t.Logf("features over %d seeds: %v", seeds, seen)
}

func checkRandomService(t *testing.T, top *Topology, seed uint64, svc *v1.Service, slices []*discovery.EndpointSlice, seen map[string]int) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("seed %d, Service %s: %s", seed, svc.Name, fmt.Sprintf(format, args...))
	}
	seen[string(svc.Spec.Type)]++
	if len(svc.Spec.IPFamilies) == 2 {
		seen["dual-stack"]++
	} else {
		seen[string(svc.Spec.IPFamilies[0])]++
	}
	if len(svc.Spec.ClusterIPs) != len(svc.Spec.IPFamilies) {
		fail("%d ClusterIPs for %d families", len(svc.Spec.ClusterIPs), len(svc.Spec.IPFamilies))
	}
	for i, ip := range svc.Spec.ClusterIPs {
		a := netip.MustParseAddr(ip)
		if familyOf(a) != svc.Spec.IPFamilies[i] || !top.ServiceCIDR(familyOf(a)).Contains(a) {
			fail("ClusterIP %s does not fit family %s", ip, svc.Spec.IPFamilies[i])
		}
	}
	count := func(cond bool, f string) {
		if cond {
			seen[f]++
		}
	}
	count(len(svc.Spec.ExternalIPs) > 0, "externalIPs")
	count(svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal, "etp-local")
	count(svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal, "itp-local")
	count(svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP, "affinity")
	count(svc.Spec.PublishNotReadyAddresses, "publishNotReady")
	count(svc.Spec.TrafficDistribution != nil, "preferClose")
	count(svc.Spec.AllocateLoadBalancerNodePorts != nil, "noNodePorts")
	count(len(svc.Spec.LoadBalancerSourceRanges) > 0, "sourceRanges")
	count(len(svc.Spec.Ports) > 1, "multiport")
	for _, in := range svc.Status.LoadBalancer.Ingress {
		count(in.IPMode != nil && *in.IPMode == v1.LoadBalancerIPModeProxy, "ipModeProxy")
	}
	external := svc.Spec.Type != v1.ServiceTypeClusterIP || len(svc.Spec.ExternalIPs) > 0
	if !external && svc.Spec.ExternalTrafficPolicy != "" {
		fail("externalTrafficPolicy on a Service with no external address")
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal && svc.Spec.HealthCheckNodePort == 0 {
		fail("LoadBalancer with externalTrafficPolicy Local and no healthCheckNodePort")
	}
	names := map[string]bool{}
	portKeys := map[string]bool{}
	nodePorts := map[string]bool{}
	for j, p := range svc.Spec.Ports {
		if names[p.Name] {
			fail("port name %q twice", p.Name)
		}
		names[p.Name] = true
		key := fmt.Sprint(p.Protocol, p.Port)
		if portKeys[key] {
			fail("port %s twice", key)
		}
		portKeys[key] = true
		seen[strings.ToLower(string(p.Protocol))]++
		count(p.Name == "", "unnamed")
		if p.Name == "" && len(svc.Spec.Ports) > 1 {
			fail("an unnamed port among several")
		}
		wantNodePort := svc.Spec.Type == v1.ServiceTypeNodePort ||
			svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.AllocateLoadBalancerNodePorts == nil
		if wantNodePort != (p.NodePort != 0) {
			fail("port %d: NodePort %d", j, p.NodePort)
		}
		if p.NodePort != 0 {
			if p.NodePort < 30000 || p.NodePort > 32767 || p.NodePort == svc.Spec.HealthCheckNodePort {
				fail("NodePort %d out of range or the health check's", p.NodePort)
			}
			k := fmt.Sprint(p.Protocol, p.NodePort)
			if nodePorts[k] {
				fail("NodePort %s twice", k)
			}
			nodePorts[k] = true
			for _, q := range svc.Spec.Ports[:j] {
				if q.NodePort == p.NodePort {
					seen["sharedNodePort"]++
					if q.Port != p.Port {
						fail("ports %d and %d share NodePort %d (the API server refuses that)", q.Port, p.Port, p.NodePort)
					}
				}
			}
		}
	}
	if len(slices) == 0 {
		fail("no slices")
	}
	famsOfSlices := map[discovery.AddressType]int{}
	endpoints := 0
	type copyKey struct {
		fam discovery.AddressType
		pod string
	}
	copies := map[copyKey][]discovery.Endpoint{}
	for _, s := range slices {
		famsOfSlices[s.AddressType]++
		if s.Labels[discovery.LabelServiceName] != svc.Name || s.Namespace != svc.Namespace {
			fail("slice %s not labelled for its Service", s.Name)
		}
		snames := map[string]bool{}
		for _, p := range s.Ports {
			if p.Name == nil || p.Protocol == nil || p.Port == nil {
				fail("slice %s: a port field is unset", s.Name)
				continue
			}
			if snames[*p.Name] {
				fail("slice %s: port name %q twice", s.Name, *p.Name)
			}
			snames[*p.Name] = true
			count(*p.Port == AltEchoPort, "altPort")
			count(*p.Name == "extra", "extraPort")
			var sp *v1.ServicePort
			for i := range svc.Spec.Ports {
				if svc.Spec.Ports[i].Name == *p.Name {
					sp = &svc.Spec.Ports[i]
				}
			}
			count(sp == nil && *p.Name != "extra", "nameMismatch")
			count(sp != nil && sp.Protocol != *p.Protocol, "protocolMismatch")
		}
		for _, sp := range svc.Spec.Ports {
			found := false
			for _, p := range s.Ports {
				found = found || (p.Name != nil && (*p.Name == sp.Name || *p.Name == "x"+sp.Name))
			}
			count(!found, "missingPort")
		}
		for _, e := range s.Endpoints {
			endpoints++
			if len(e.Addresses) != 1 || e.TargetRef == nil {
				fail("slice %s: endpoint without one address and a target", s.Name)
				continue
			}
			host, ok := top.Host(e.TargetRef.Name)
			want := discovery.AddressTypeIPv4
			if netip.MustParseAddr(e.Addresses[0]).Is6() {
				want = discovery.AddressTypeIPv6
			}
			if !ok || host.Role != RolePod || want != s.AddressType || host.Addr(addrFamily(s.AddressType)).String() != e.Addresses[0] {
				fail("slice %s: endpoint %s is not its pod's address of the slice's family", s.Name, e.Addresses[0])
			}
			seen[e.TargetRef.Name]++
			c := e.Conditions
			switch {
			case c.Ready == nil && c.Serving == nil && c.Terminating == nil:
				seen["unsetConditions"]++
			case *c.Ready:
				seen["ready"]++
			case *c.Terminating && *c.Serving:
				seen["terminatingServing"]++
			case *c.Terminating:
				seen["terminatingNotServing"]++
			case *c.Serving:
				seen["servingNotReady"]++
			default:
				seen["notReady"]++
			}
			count(e.NodeName == nil, "noNodeName")
			if e.Hints != nil {
				seen["hint"]++
				count(e.Hints.ForZones[0].Name != *e.Zone, "wrongHint")
			}
			k := copyKey{s.AddressType, e.TargetRef.Name}
			copies[k] = append(copies[k], e)
		}
	}
	count(endpoints == 0, "noEndpoints")
	for _, n := range famsOfSlices {
		count(n > 1, "split")
	}
	count(len(famsOfSlices) > len(svc.Spec.IPFamilies), "otherFamilySlice")
	for k, cs := range copies {
		if len(cs) == 1 {
			continue
		}
		seen["duplicate"]++
		if len(cs) > 2 {
			fail("%s %s in %d slices", k.fam, k.pod, len(cs))
			continue
		}
		// Upstream merges duplicates in map order: only pairs where the
		// result does not depend on it are drawn.
		a, b := cs[0].Conditions, cs[1].Conditions
		term := func(c discovery.EndpointConditions) bool { return c.Terminating != nil && *c.Terminating }
		if term(a) != term(b) {
			seen["terminatingDuplicate"]++
		} else if fmt.Sprint(a.Ready, a.Serving) != fmt.Sprint(b.Ready, b.Serving) &&
			!(eqBool(a.Ready, b.Ready) && eqBool(a.Serving, b.Serving)) {
			fail("%s %s twice with conditions whose merge depends on order: %v / %v", k.fam, k.pod, a, b)
		}
	}
}

func eqBool(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func addrFamily(t discovery.AddressType) v1.IPFamily {
	if t == discovery.AddressTypeIPv6 {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}
