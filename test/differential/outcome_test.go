package differential

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

func answer(backend, seen string) Attempt { return Attempt{Kind: Answer, Backend: backend, Seen: seen} }

var timeout = Attempt{Kind: Timeout}

// drive runs a sampler with a fake prober: attempt i (0-based, over the
// whole probe) from client address idx gets outcome(i, idx). It returns
// the attempts and the number of waves.
func drive(p Probe, outcome func(i, idx int) Attempt) ([]Attempt, int) {
	s := NewSampler(p, func() time.Time { return time.Unix(0, 0) })
	waves := 0
	for {
		addrs, per := s.Next()
		if len(addrs) == 0 {
			return s.Attempts, waves
		}
		waves++
		var wave []Attempt
		for _, idx := range addrs {
			for j := 0; j < per; j++ {
				a := outcome(len(s.Attempts)+len(wave), idx)
				a.Source = fmt.Sprint(idx)
				wave = append(wave, a)
			}
		}
		s.Record(wave...)
		if waves > 1000 {
			panic("sampler never stops")
		}
	}
}

func TestSamplerVerdictStopsAtOnce(t *testing.T) {
	// No endpoint could answer: the same refusal twice is the verdict.
	as, waves := drive(Probe{Addresses: 1}, func(int, int) Attempt { return Attempt{Kind: RefusedRST} })
	if len(as) != 2 || waves != 1 {
		t.Errorf("a refusal with no candidate: %d attempts in %d waves, want 2 in 1", len(as), waves)
	}
	// With candidates, silence may be a draw (an endpoint that cannot
	// answer this client among others): sample on, boundedly.
	as, waves = drive(Probe{Addresses: 1, Candidates: []string{"pod-a1", "pod-b1"}}, func(int, int) Attempt { return timeout })
	if len(as) != MaxMixedAttempts || waves != 2 {
		t.Errorf("timeouts with candidates: %d attempts in %d waves, want %d in 2", len(as), waves, MaxMixedAttempts)
	}
	as, waves = drive(Probe{Addresses: 1, Candidates: []string{"pod-a1", "pod-b1"}, Thorough: true}, func(int, int) Attempt { return timeout })
	if len(as) != ThoroughMixedAttempts || waves > 7 {
		t.Errorf("thorough, timeouts with candidates: %d attempts in %d waves, want %d in at most 7", len(as), waves, ThoroughMixedAttempts)
	}
}

func TestSamplerStopsWhenEveryCandidateAnswered(t *testing.T) {
	cands := []string{"pod-a1", "pod-b1", "pod-b2"}
	as, _ := drive(Probe{Addresses: 1, Candidates: cands}, func(i, _ int) Attempt { return answer(cands[i%3], "client-1") })
	if len(as) != 16+2 {
		t.Errorf("%d attempts, want 18 (the first wave of 2 sees two candidates, the next one the third)", len(as))
	}
	// A proxy reaching a strict subset is sampled to the bound.
	as, _ = drive(Probe{Addresses: 1, Candidates: cands}, func(i, _ int) Attempt { return answer(cands[i%2], "client-1") })
	if len(as) != MaxAttempts {
		t.Errorf("a subset answering: %d attempts, want %d", len(as), MaxAttempts)
	}
	// Mixed answers and timeouts: bounded by MaxMixedAttempts.
	as, _ = drive(Probe{Addresses: 1, Candidates: cands}, func(i, _ int) Attempt {
		if i%2 == 0 {
			return timeout
		}
		return answer(cands[0], "client-2")
	})
	if len(as) != MaxMixedAttempts {
		t.Errorf("mixed: %d attempts, want %d", len(as), MaxMixedAttempts)
	}
}

func TestSamplerAffinity(t *testing.T) {
	// One address: StickyAttempts one after the other.
	as, waves := drive(Probe{Addresses: 1, Affinity: true, Candidates: []string{"pod-a1", "pod-b1"}},
		func(int, int) Attempt { return answer("pod-b1", "node1") })
	if len(as) != StickyAttempts || waves != StickyAttempts {
		t.Errorf("one address: %d attempts in %d waves, want %d one by one", len(as), waves, StickyAttempts)
	}
	// Many addresses: two attempts each, until every candidate answered.
	cands := []string{"pod-a1", "pod-b1", "pod-b2"}
	as, _ = drive(Probe{Addresses: ExtraAddresses, Affinity: true, Candidates: cands},
		func(_, idx int) Attempt { return answer(cands[idx%3], "outside") })
	if len(as) != AttemptsPerAddress*(1+Wave/2) {
		t.Errorf("many addresses: %d attempts, want %d", len(as), AttemptsPerAddress*(1+Wave/2))
	}
	r := Summarize(Probe{Addresses: ExtraAddresses, Affinity: true, Candidates: cands}, as)
	if !r.Has("sticky") || r.Has("not sticky") || len(r.Backends()) != 3 {
		t.Errorf("facets %v", r.Facets)
	}
	// Dropped from every address, no candidate: one address is enough.
	as, _ = drive(Probe{Addresses: ExtraAddresses, Affinity: true}, func(int, int) Attempt { return timeout })
	if len(as) != AttemptsPerAddress {
		t.Errorf("timeouts, no candidate: %d attempts, want %d", len(as), AttemptsPerAddress)
	}
	as, _ = drive(Probe{Addresses: ExtraAddresses, Affinity: true, Candidates: cands}, func(int, int) Attempt { return timeout })
	if len(as) != AttemptsPerAddress*MaxMixedAddresses {
		t.Errorf("timeouts with candidates: %d attempts, want %d", len(as), AttemptsPerAddress*MaxMixedAddresses)
	}
	as, _ = drive(Probe{Addresses: ExtraAddresses, Affinity: true, Candidates: cands, Thorough: true}, func(int, int) Attempt { return timeout })
	if len(as) != AttemptsPerAddress*ThoroughMixedAddresses {
		t.Errorf("thorough, timeouts with candidates: %d attempts, want %d", len(as), AttemptsPerAddress*ThoroughMixedAddresses)
	}
}

func TestSummarizeFacets(t *testing.T) {
	p := Probe{Addresses: 1, Candidates: []string{"pod-a1", "pod-b1"}}
	r := Summarize(p, []Attempt{answer("pod-a1", "client-1"), answer("pod-b1", "client-1"), answer("pod-a1", "client-1")})
	if got := strings.Join(r.Facets, " | "); got != "answer pod-a1, saw client-1 | answer pod-b1, saw client-1" {
		t.Errorf("facets %q", got)
	}
	q := Summarize(p, []Attempt{answer("pod-b1", "client-1"), answer("pod-a1", "client-1")})
	if !Same(r, q) {
		t.Errorf("the same set in another order differs")
	}
	if Same(r, Summarize(p, []Attempt{answer("pod-a1", "node1"), answer("pod-b1", "client-1")})) {
		t.Errorf("another source seen compares the same")
	}
	// Refusals by how they came.
	for _, c := range []struct {
		a    Attempt
		want string
	}{
		{Attempt{Kind: RefusedRST}, "refused: RST"},
		{Attempt{Kind: RefusedICMP, ICMP: "port-unreachable", ICMPFrom: "node1"}, "refused: ICMP port-unreachable"},
		{Attempt{Kind: EPERM, ICMP: "port-unreachable"}, "EPERM at send (ICMP port-unreachable queued)"},
		{Attempt{Kind: EPERM}, "EPERM at send"},
		{timeout, "timeout"},
	} {
		if got := c.a.Facet(false); got != c.want {
			t.Errorf("facet %q, want %q", got, c.want)
		}
	}
	// Affinity from one address: the endpoint is a draw, not compared.
	a := Probe{Addresses: 1, Affinity: true, Candidates: []string{"pod-a1", "pod-b1"}, From: proxytest.Node1}
	x := Summarize(a, []Attempt{answer("pod-a1", "node1"), answer("pod-a1", "node1")})
	y := Summarize(a, []Attempt{answer("pod-b1", "node1"), answer("pod-b1", "node1")})
	if !Same(x, y) || !x.Has("sticky") {
		t.Errorf("affinity from one address: %v vs %v", x.Facets, y.Facets)
	}
	if z := Summarize(a, []Attempt{answer("pod-a1", "node1"), answer("pod-b1", "node1")}); !z.Has("not sticky") {
		t.Errorf("two endpoints from one address under affinity: %v", z.Facets)
	}
	// A backend reaching its own Service under affinity: what it sees
	// depends on the endpoint drawn.
	h := Probe{Addresses: 1, Affinity: true, Candidates: []string{"pod-a1", "pod-b1"}, From: proxytest.PodA1}
	if !Same(Summarize(h, []Attempt{answer("pod-a1", "node1")}), Summarize(h, []Attempt{answer("pod-b1", "pod-a1")})) {
		t.Errorf("hairpin under affinity compares the draw")
	}
}

func TestResultHasOnly(t *testing.T) {
	r := Result{Facets: []string{"answer pod-a1, saw node1", "timeout"}}
	if !r.Has("answer") || !r.Has("timeout") || r.Has("refused") || r.Only("answer") || !r.Only("answer", "timeout") {
		t.Errorf("Has/Only wrong on %v", r.Facets)
	}
	if (Result{}).Only("timeout") {
		t.Errorf("no facet is not Only anything")
	}
	e := Result{Facets: []string{"EPERM at send (ICMP port-unreachable queued)"}}
	if !e.Only("EPERM at send") || !e.Only("EPERM at send (ICMP port-unreachable queued)") || e.Only("refused") {
		t.Errorf("Has/Only wrong on %v", e.Facets)
	}
}

func TestPlan(t *testing.T) {
	top := proxytest.Default()
	for seed := uint64(0); seed < 40; seed++ {
		sc, err := top.RandomScenario(seed, proxytest.SlotIndex(0))
		if err != nil {
			t.Fatal(err)
		}
		probes := Plan(top, sc)
		keys := map[string]bool{}
		for _, p := range probes {
			if keys[p.Key()] {
				t.Fatalf("seed %d: probe %s twice", seed, p)
			}
			keys[p.Key()] = true
			if _, ok := top.Host(p.From); !ok {
				t.Errorf("seed %d: %s from an unknown host", seed, p)
			}
			if familyOf(p.Addr.Addr()) != p.Family && p.Frontend != NodePortLocalhost {
				t.Errorf("seed %d: %s: address of the wrong family", seed, p)
			}
			if p.Addresses > 1 && (!p.Affinity || !contains(MultiAddressHosts, p.From)) {
				t.Errorf("seed %d: %s uses many addresses", seed, p)
			}
		}
		// Every frontend of every port is probed from the node.
		for _, svc := range sc.Services {
			for _, sp := range svc.Spec.Ports {
				want := len(svc.Spec.ClusterIPs) + len(svc.Spec.ExternalIPs) + len(svc.Status.LoadBalancer.Ingress)
				if sp.NodePort != 0 {
					want += 2 * len(svc.Spec.IPFamilies)
					if svc.Spec.IPFamilies[0] == v1.IPv4Protocol || len(svc.Spec.IPFamilies) == 2 {
						want++
					}
				}
				got := 0
				for _, p := range probes {
					if p.Service == svc.Name && p.Port == sp.Name && p.From == proxytest.Node1 {
						got++
					}
				}
				if got != want {
					t.Errorf("seed %d: %s/%s: %d probes from node1, want %d", seed, svc.Name, sp.Name, got, want)
				}
			}
		}
	}
}

func TestCandidates(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("c", 100)
	slices, err := top.Slices(svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	tcp := svc.Spec.Ports[0]
	if got := Candidates(slices, tcp, v1.IPv6Protocol); strings.Join(got, ",") != "pod-a1,pod-b1" {
		t.Errorf("candidates %v", got)
	}
	alt := int32(proxytest.AltEchoPort)
	slices[0].Ports[0].Port = &alt // the IPv4 slice's TCP port
	if got := Candidates(slices, tcp, v1.IPv4Protocol); strings.Join(got, ",") != "pod-a1:8081,pod-b1:8081" {
		t.Errorf("candidates on the alternate port %v", got)
	}
	other := "x" + tcp.Name
	slices[0].Ports[0].Name = &other
	if got := Candidates(slices, tcp, v1.IPv4Protocol); len(got) != 0 {
		t.Errorf("candidates of a port name nothing matches %v", got)
	}
}

func TestExtraAddresses(t *testing.T) {
	top := proxytest.Default()
	for _, c := range []struct {
		host string
		fam  v1.IPFamily
		i    int
		want string
	}{
		{proxytest.Client1, v1.IPv4Protocol, 0, "10.244.1.150"},
		{proxytest.Client1, v1.IPv6Protocol, 5, "fd00:10:244:1::155"},
		{proxytest.Client2, v1.IPv4Protocol, ExtraAddresses - 1, "10.244.2.213"},
		{proxytest.Outside, v1.IPv6Protocol, 0, "fd00:50::150"},
		{proxytest.Outside, v1.IPv4Protocol, 1, "192.168.50.151"},
	} {
		a, err := ExtraAddress(top, c.host, c.fam, c.i)
		if err != nil || a.String() != c.want {
			t.Errorf("ExtraAddress(%s, %s, %d) = %v, %v; want %s", c.host, c.fam, c.i, a, err, c.want)
		}
		if h := HostOf(top, a); h != c.host {
			t.Errorf("HostOf(%s) = %s, want %s", a, h, c.host)
		}
	}
	if _, err := ExtraAddress(top, proxytest.Node1, v1.IPv4Protocol, 0); err == nil {
		t.Errorf("a node got extra addresses")
	}
	// No extra address is any host's own.
	for _, h := range MultiAddressHosts {
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			for i := 0; i < ExtraAddresses; i++ {
				a, _ := ExtraAddress(top, h, fam, i)
				if owner := top.HostByAddr(a); owner != "" {
					t.Errorf("extra address %s of %s belongs to %s", a, h, owner)
				}
			}
		}
	}
	if h := HostOf(top, netip.MustParseAddr("10.244.1.1")); h != proxytest.Node1 {
		t.Errorf("node1's gateway address names %s", h)
	}
}

func result(p Probe, as ...Attempt) Result { return Summarize(p, as) }

// TestDifferences checks each documented difference on outcomes it must
// and must not explain.
func TestDifferences(t *testing.T) {
	tcpNode := Probe{Protocol: v1.ProtocolTCP, From: proxytest.Node1, Frontend: ExternalIP, Addresses: 1}
	top := proxytest.Default()
	ranged := top.Service("r", 100, proxytest.WithLoadBalancer(), proxytest.WithSourceRanges("192.168.50.100/32"))
	plain := top.Service("p", 101, proxytest.WithLoadBalancer())
	hairpin := Probe{Protocol: v1.ProtocolTCP, Family: v1.IPv4Protocol, From: proxytest.PodA1, Frontend: ClusterIP, Addresses: 1,
		Candidates: []string{"pod-a1:8081", "pod-b1"}}
	// pod-a1's endpoint in the probe's Service ("h"): with nodeName
	// node1, or without; another Service ("o") may list it on node1.
	podSlice := func(svc string, node *string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Labels: map[string]string{discovery.LabelServiceName: svc}},
			AddressType: discovery.AddressTypeIPv4,
			Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.1.10"}, NodeName: node,
				TargetRef: &v1.ObjectReference{Kind: "Pod", Name: proxytest.PodA1}}},
		}
	}
	node1 := proxytest.Node1
	hereNoNode, hereLocal, elsewhere := podSlice("h", nil), podSlice("h", &node1), podSlice("o", &node1)
	hairpinCase := func(mode string, here *discovery.EndpointSlice, others ...*discovery.EndpointSlice) Case {
		return Case{Mode: mode, Slices: []*discovery.EndpointSlice{here}, AllSlices: append([]*discovery.EndpointSlice{here}, others...)}
	}
	nftLocalElsewhere, nftNoNode, nftLocalHere := hairpinCase("nftables", hereNoNode, elsewhere), hairpinCase("nftables", hereNoNode),
		hairpinCase("nftables", hereLocal, elsewhere)
	iptNoNode, iptLocalHere := hairpinCase("iptables", hereNoNode), hairpinCase("iptables", hereLocal)
	nodeUDPLB := Probe{Protocol: v1.ProtocolUDP, From: proxytest.Node1, Frontend: LoadBalancerIP, Addresses: 1}
	rst := Attempt{Kind: RefusedRST}
	icmp := Attempt{Kind: RefusedICMP, ICMP: "port-unreachable"}
	eperm := Attempt{Kind: EPERM, ICMP: "port-unreachable"}
	name := func(d *Difference) string {
		if d == nil {
			return ""
		}
		return d.Name
	}
	for _, c := range []struct {
		what   string
		c      Case
		p      Probe
		up, kx []Attempt
		want   string
	}{
		{"TCP reject", Case{Mode: "iptables"}, Probe{Protocol: v1.ProtocolTCP, From: proxytest.Client1, Frontend: ClusterIP},
			[]Attempt{icmp}, []Attempt{rst}, "tcp-reject-with-reset"},
		{"UDP is not TCP", Case{Mode: "iptables"}, Probe{Protocol: v1.ProtocolUDP, From: proxytest.Client1, Frontend: ClusterIP},
			[]Attempt{icmp}, []Attempt{rst}, ""},
		{"an answer is not a reject", Case{Mode: "iptables"}, Probe{Protocol: v1.ProtocolTCP, From: proxytest.Client1, Frontend: ClusterIP},
			[]Attempt{answer("pod-a1", "client-1")}, []Attempt{rst}, ""},
		{"node to an external address", Case{Mode: "iptables"}, tcpNode, []Attempt{timeout}, []Attempt{rst}, "node-to-external-address-without-endpoints"},
		{"not in the nftables mode", Case{Mode: "nftables"}, tcpNode, []Attempt{timeout}, []Attempt{rst}, ""},
		{"node UDP EPERM on its own NodePort is a difference", Case{Mode: "nftables"}, Probe{Protocol: v1.ProtocolUDP, From: proxytest.Node1, Frontend: NodePort},
			[]Attempt{icmp}, []Attempt{eperm}, ""},
		{"node UDP EPERM to an externalIP", Case{Mode: "iptables"}, Probe{Protocol: v1.ProtocolUDP, From: proxytest.Node1, Frontend: ExternalIP},
			[]Attempt{timeout}, []Attempt{eperm}, "node-udp-external-eperm"},
		{"a drop is not a reject", Case{Mode: "nftables"}, Probe{Protocol: v1.ProtocolUDP, From: proxytest.Node1, Frontend: NodePort},
			[]Attempt{icmp}, []Attempt{{Kind: EPERM}}, ""},
		{"localhost NodePort as upstream's iptables mode", Case{Mode: "nftables", UpstreamIn: map[string]Result{
			"iptables": result(Probe{}, answer("pod-a1", "node1"))}},
			Probe{Protocol: v1.ProtocolTCP, From: proxytest.Node1, Frontend: NodePortLocalhost},
			[]Attempt{rst}, []Attempt{answer("pod-a1", "node1")}, "nftables-localhost-nodeports"},
		{"localhost NodePort unlike upstream's iptables mode", Case{Mode: "nftables", UpstreamIn: map[string]Result{
			"iptables": result(Probe{}, answer("pod-a1", "node1"))}},
			Probe{Protocol: v1.ProtocolTCP, From: proxytest.Node1, Frontend: NodePortLocalhost},
			[]Attempt{rst}, []Attempt{answer("pod-b1", "node1")}, ""},
		{"localhost NodePort: another documented difference from the iptables mode", Case{Mode: "nftables", UpstreamIn: map[string]Result{
			"iptables": result(Probe{}, icmp)}},
			Probe{Protocol: v1.ProtocolTCP, From: proxytest.Node1, Frontend: NodePortLocalhost},
			[]Attempt{rst}, []Attempt{rst}, "nftables-localhost-nodeports"},
		{"source ranges before the reject", Case{Mode: "iptables", Service: ranged},
			Probe{Protocol: v1.ProtocolTCP, From: proxytest.Client1, Frontend: LoadBalancerIP},
			[]Attempt{icmp}, []Attempt{timeout}, "source-ranges-before-reject"},
		{"source ranges: the node's UDP dropped in the output path", Case{Mode: "iptables", Service: ranged},
			nodeUDPLB, []Attempt{timeout}, []Attempt{{Kind: EPERM}}, "source-ranges-before-reject"},
		{"source ranges: the node's UDP as upstream's nftables mode", Case{Mode: "iptables", Service: ranged,
			UpstreamIn: map[string]Result{"nftables": result(nodeUDPLB, Attempt{Kind: EPERM})}},
			nodeUDPLB, []Attempt{timeout}, []Attempt{{Kind: EPERM}}, "source-ranges-before-reject"},
		{"source ranges: the node's UDP unlike upstream's nftables mode", Case{Mode: "iptables", Service: ranged,
			UpstreamIn: map[string]Result{"nftables": result(nodeUDPLB, timeout)}},
			nodeUDPLB, []Attempt{timeout}, []Attempt{{Kind: EPERM}}, ""},
		{"source ranges: the node's UDP, nftables mode", Case{Mode: "nftables", Service: ranged},
			nodeUDPLB, []Attempt{timeout}, []Attempt{{Kind: EPERM}}, ""},
		{"no source ranges: the node's UDP", Case{Mode: "iptables", Service: plain},
			nodeUDPLB, []Attempt{timeout}, []Attempt{{Kind: EPERM}}, ""},
		{"no source ranges", Case{Mode: "iptables", Service: plain},
			Probe{Protocol: v1.ProtocolTCP, From: proxytest.Client1, Frontend: LoadBalancerIP},
			[]Attempt{icmp}, []Attempt{timeout}, ""},
		{"nftables: hairpin by kproxy only, local for another Service", nftLocalElsewhere, hairpin,
			[]Attempt{answer("pod-b1", "pod-a1"), timeout}, []Attempt{answer("pod-b1", "pod-a1"), answer("pod-a1:8081", "node1")},
			"hairpin-by-address"},
		{"nftables: hairpin by kproxy only, local nowhere", nftNoNode, hairpin,
			[]Attempt{answer("pod-b1", "pod-a1"), timeout}, []Attempt{answer("pod-b1", "pod-a1"), answer("pod-a1:8081", "node1")}, ""},
		{"nftables: hairpin by kproxy only, local here", nftLocalHere, hairpin,
			[]Attempt{answer("pod-b1", "pod-a1"), timeout}, []Attempt{answer("pod-b1", "pod-a1"), answer("pod-a1:8081", "node1")}, ""},
		{"nftables: hairpin by upstream only", nftLocalElsewhere, hairpin,
			[]Attempt{answer("pod-a1", "node1")}, []Attempt{timeout}, ""},
		{"iptables: hairpin by upstream only, no nodeName", iptNoNode, hairpin,
			[]Attempt{answer("pod-a1", "node1")}, []Attempt{timeout}, "hairpin-by-address"},
		{"iptables: hairpin by upstream only, local here", iptLocalHere, hairpin,
			[]Attempt{answer("pod-a1", "node1")}, []Attempt{timeout}, ""},
		{"iptables: hairpin by kproxy only", iptNoNode, hairpin,
			[]Attempt{timeout}, []Attempt{answer("pod-a1", "node1")}, ""},
		{"hairpin, and another backend differs", iptNoNode, hairpin,
			[]Attempt{answer("pod-a1", "node1"), answer("pod-b1", "pod-a1")}, []Attempt{timeout}, ""},
		{"a timeout that is not the pod reaching itself", iptNoNode, hairpin,
			[]Attempt{answer("pod-b1", "pod-a1")}, []Attempt{timeout}, ""},
	} {
		got := name(Intended(c.c, c.p, result(c.p, c.up...), result(c.p, c.kx...)))
		if got != c.want {
			t.Errorf("%s: explained by %q, want %q", c.what, got, c.want)
		}
	}
	for _, d := range IntentionalDifferences() {
		if d.Name == "" || d.Reason == "" || d.Match == nil {
			t.Errorf("difference %+v lacks a name, a reason or a predicate", d)
		}
	}
}

// TestCompareLoaded: a pod is this node's endpoint by any scenario loaded
// at once (the proxies see them all), not only the probe's own.
func TestCompareLoaded(t *testing.T) {
	node1 := proxytest.Node1
	slice := func(svc string, node *string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Labels: map[string]string{discovery.LabelServiceName: svc}},
			AddressType: discovery.AddressTypeIPv4,
			Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.1.10"}, NodeName: node,
				TargetRef: &v1.ObjectReference{Kind: "Pod", Name: proxytest.PodA1}}},
		}
	}
	a := &proxytest.Scenario{Seed: 1, Slices: []*discovery.EndpointSlice{slice("a", nil)}}
	b := &proxytest.Scenario{Seed: 2, Slices: []*discovery.EndpointSlice{slice("b", &node1)}}
	p := Probe{Seed: 1, Service: "a", Protocol: v1.ProtocolTCP, Family: v1.IPv4Protocol, Frontend: ClusterIP,
		From: proxytest.PodA1, Addresses: 1, Candidates: []string{"pod-a1"}}
	up := map[string]map[string]Result{"nftables": {p.Key(): result(p, timeout)}}
	kx := map[string]Result{p.Key(): result(p, answer("pod-a1", "node1"))}
	for _, c := range []struct {
		loaded []*discovery.EndpointSlice
		want   string
	}{
		{nil, ""},
		{append(append([]*discovery.EndpointSlice(nil), a.Slices...), b.Slices...), "hairpin-by-address"},
	} {
		d := Compare("nftables", a, c.loaded, []Probe{p}, up, kx)
		if len(d) != 1 {
			t.Fatalf("loaded %d slices: %d differences, want 1", len(c.loaded), len(d))
		}
		got := ""
		if d[0].Intended != nil {
			got = d[0].Intended.Name
		}
		if got != c.want {
			t.Errorf("loaded %d slices: explained by %q, want %q", len(c.loaded), got, c.want)
		}
	}
}

// TestDifferencesDocumented: every documented (or pending) difference has
// its row in docs/compatibility.md, as intentionalDifferences promises.
func TestDifferencesDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "compatibility.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range IntentionalDifferences() {
		if !strings.Contains(string(doc), "\n| `"+d.Name+"` |") {
			t.Errorf("difference %q has no row in docs/compatibility.md", d.Name)
		}
	}
}

// TestRowProbe: every traffic row of the behaviour table becomes a probe
// of the row's address, client and Service port.
func TestRowProbe(t *testing.T) {
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range tb.Rows {
		p, c, err := RowProbe(tb.Topology, r, "iptables")
		if err != nil {
			t.Fatalf("%s: %v", r.Name, err)
		}
		addr, _ := r.Address(tb.Topology)
		if p.Addr != addr || p.From != r.From || p.Protocol != r.Protocol || p.Family != r.Family || string(p.Frontend) == "" {
			t.Errorf("%s: probe %s", r.Name, p)
		}
		if c.Service == nil || c.Service.Name != r.Service || c.Mode != "iptables" || p.Addresses != 1 {
			t.Errorf("%s: case %+v", r.Name, c)
		}
		if r.Expect.Outcome == proxytest.Answer && len(r.Expect.Backends) > 0 {
			for _, b := range r.Expect.Backends {
				if !contains(p.Candidates, b) {
					t.Errorf("%s: expected backend %s not among the candidates %v", r.Name, b, p.Candidates)
				}
			}
		}
	}
}
