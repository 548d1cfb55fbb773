package proxytest

import (
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// DefaultConfig returns the configuration most cases use: the proxy knows the
// cluster CIDRs, no masquerade-all.
func DefaultConfig() Config { return Config{ClusterCIDR: true} }

// Table is the behaviour table: the cases and their rows.
type Table struct {
	Topology *Topology
	Cases    []*Case
	Rows     []Row
}

// Reasons used to mark rows a platform cannot honour.
const (
	reasonWindowsSourceRanges = "HNS load balancers cannot filter by source address (loadBalancerSourceRanges)"
	reasonWindowsLocalhost    = "Windows has no localhost NodePorts (they rely on Linux route_localnet)"
	reasonWindowsNodePortAddr = "HNS NodePorts listen on every node address (no nodePortAddresses)"
	reasonWindowsSecondary    = "HNS NodePort load balancers answer on the node IP, not on the node's other local addresses"
	// The following come from the fake-HNS resolver of platform/windows.
	reasonWindowsNoReject        = "HNS cannot reject: a service port without endpoints has no load balancer, so traffic is dropped, not refused"
	reasonWindowsNoShortCircuit  = "HNS keeps one endpoint set per frontend: pods and the node reaching an externalTrafficPolicy Local frontend get the local endpoints, not the cluster-wide ones"
	reasonWindowsClusterIPRouted = "HNS applies ClusterIP load balancers to traffic from this node's pods and the node itself, not to traffic routed in from outside"
	reasonWindowsMasqueradeAll   = "--masquerade-all has no HNS equivalent: pod sources stay unmasqueraded"
)

// New builds the behaviour table over the Default topology.
func New() (*Table, error) {
	b := &tableBuilder{tb: &Table{Topology: Default()}}
	b.build()
	if b.err != nil {
		return nil, b.err
	}
	return b.tb, nil
}

// Configs returns the distinct configurations the rows need, DefaultConfig first.
func (tb *Table) Configs() []Config {
	seen := map[Config]bool{}
	var out []Config
	for _, c := range append([]*Case{{Config: DefaultConfig()}}, tb.Cases...) {
		if !seen[c.Config] {
			seen[c.Config] = true
			out = append(out, c.Config)
		}
	}
	return out
}

// RowsFor returns the rows that need configuration c, in table order.
func (tb *Table) RowsFor(c Config) []Row {
	var out []Row
	for _, r := range tb.Rows {
		if r.Config() == c {
			out = append(out, r)
		}
	}
	return out
}

// CasesFor returns the cases that need configuration c.
func (tb *Table) CasesFor(c Config) []*Case {
	var out []*Case
	for _, cs := range tb.Cases {
		if cs.Config == c {
			out = append(out, cs)
		}
	}
	return out
}

// Objects returns every object a proxy run with configuration c needs: the
// topology's Nodes and the Services and EndpointSlices of the cases for c,
// each list sorted by name.
func (tb *Table) Objects(c Config) ([]*v1.Node, []*v1.Service, []*discovery.EndpointSlice) {
	var svcs []*v1.Service
	var slices []*discovery.EndpointSlice
	for _, cs := range tb.CasesFor(c) {
		svcs = append(svcs, cs.Services...)
		slices = append(slices, cs.Slices...)
	}
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Name < svcs[j].Name })
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	return tb.Topology.NodeObjects(), svcs, slices
}

// tableBuilder accumulates cases and rows, keeping the first error.
type tableBuilder struct {
	tb  *Table
	err error
}

// probe describes rows to generate for one case; expanded over families and protocols.
type probe struct {
	from        string
	target      Target
	expect      Expect
	families    []v1.IPFamily
	attempts    int
	unsupported map[Platform]string
}

type probeOption func(*probe)

func families(f ...v1.IPFamily) probeOption { return func(p *probe) { p.families = f } }
func ipv4Only() probeOption                 { return families(v1.IPv4Protocol) }
func attempts(n int) probeOption {
	return func(p *probe) { p.attempts = n }
}
func unsupportedOn(pl Platform, reason string) probeOption {
	return func(p *probe) {
		if p.unsupported == nil {
			p.unsupported = map[Platform]string{}
		}
		p.unsupported[pl] = reason
	}
}

func answer(src Source, backends ...string) Expect {
	return Expect{Outcome: Answer, Source: src, Backends: backends}
}

func rejected() Expect { return Expect{Outcome: Rejected} }
func dropped() Expect  { return Expect{Outcome: Dropped} }

func (b *tableBuilder) addCase(index int, name string, cfg Config, semantic string, opts []ServiceOption, eps []EP, probes ...probe) {
	if b.err != nil {
		return
	}
	t := b.tb.Topology
	svc := t.Service(name, index, opts...)
	slices, err := t.Slices(svc, eps...)
	if err != nil {
		b.err = err
		return
	}
	c := &Case{Name: name, Semantic: semantic, Config: cfg, Services: []*v1.Service{svc}, Slices: slices}
	b.tb.Cases = append(b.tb.Cases, c)
	for _, p := range probes {
		fams := p.families
		if fams == nil {
			fams = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		}
		n := p.attempts
		if n == 0 {
			n = 1
			if p.expect.Outcome == Answer {
				n = 4
			}
			if p.expect.Sticky {
				n = 6
			}
		}
		for _, fam := range fams {
			for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
				b.tb.Rows = append(b.tb.Rows, Row{
					Name:        fmt.Sprintf("%s/%s->%s/%s/%s", name, p.from, p.target, proto, fam),
					Case:        c,
					From:        p.from,
					Protocol:    proto,
					Family:      fam,
					Target:      p.target,
					Service:     name,
					Attempts:    n,
					Expect:      p.expect,
					Unsupported: p.unsupported,
				})
			}
		}
	}
}

// alsoService adds a Service and its EndpointSlices to the last case, for
// cases about Services that interact. Its index must be unique too; the
// case's probes still target the case's own Service. A contender claims a
// frontend of the case's Service (see Case.Contenders).
func (b *tableBuilder) alsoService(name string, index int, contender bool, opts []ServiceOption, eps []EP) {
	if b.err != nil {
		return
	}
	t := b.tb.Topology
	svc := t.Service(name, index, opts...)
	slices, err := t.Slices(svc, eps...)
	if err != nil {
		b.err = err
		return
	}
	c := b.tb.Cases[len(b.tb.Cases)-1]
	c.Services = append(c.Services, svc)
	c.Slices = append(c.Slices, slices...)
	if contender {
		c.Contenders = append(c.Contenders, name)
	}
}

func on(from string, target Target, e Expect, opts ...probeOption) probe {
	p := probe{from: from, target: target, expect: e}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func opts(o ...ServiceOption) []ServiceOption { return o }

// build lists the cases. Each case's index fixes its addresses and NodePort,
// so indexes must be unique (TestTableConsistent checks).
func (b *tableBuilder) build() {
	def := DefaultConfig()
	local, remote := PodA1, PodB1

	b.addCase(1, "clusterip", def,
		"ClusterIP: DNAT to one of the cluster endpoints; pod sources are not masqueraded.",
		nil, Ready(local, remote),
		on(Client1, TargetClusterIP, answer(SourceClient, local, remote)),
		on(Node1, TargetClusterIP, answer(SourceAny, local, remote)),
	)
	b.addCase(2, "nodeport", def,
		"NodePort on the node's IP (and on 127.0.0.1 for IPv4): any endpoint, source masqueraded.",
		opts(WithNodePort()), Ready(local, remote),
		on(Outside, TargetNodePort, answer(SourceNode, local, remote)),
		on(Client2, TargetNodePort, answer(SourceNode, local, remote)),
		on(Client1, TargetNodePort, answer(SourceNode, local, remote)),
		on(Node1, TargetNodePort, answer(SourceAny, local, remote)),
		on(Node1, TargetLocalhostNodePort, answer(SourceNode, local, remote), ipv4Only(),
			unsupportedOn(Windows, reasonWindowsLocalhost)),
	)
	b.addCase(3, "externalip", def,
		"externalIPs: any endpoint, external and pod sources masqueraded.",
		opts(WithExternalIPs()), Ready(local, remote),
		on(Outside, TargetExternalIP, answer(SourceNode, local, remote)),
		on(Client1, TargetExternalIP, answer(SourceNode, local, remote)),
		on(Node1, TargetExternalIP, answer(SourceAny, local, remote)),
	)
	b.addCase(4, "loadbalancer", def,
		"LoadBalancer ingress IP (and its NodePort): any endpoint, source masqueraded.",
		opts(WithLoadBalancer()), Ready(local, remote),
		on(Outside, TargetLoadBalancerIP, answer(SourceNode, local, remote)),
		on(Outside, TargetNodePort, answer(SourceNode, local, remote)),
		on(Client1, TargetLoadBalancerIP, answer(SourceNode, local, remote)),
		on(Node1, TargetLoadBalancerIP, answer(SourceAny, local, remote)),
	)
	b.addCase(5, "source-ranges-allow", def,
		"loadBalancerSourceRanges containing the client: the LB IP answers.",
		opts(WithLoadBalancer(), WithSourceRanges("192.168.50.100/32", "fd00:50::100/128")), Ready(local, remote),
		on(Outside, TargetLoadBalancerIP, answer(SourceNode, local, remote)),
	)
	b.addCase(6, "source-ranges-deny", def,
		"loadBalancerSourceRanges not containing the client: the LB IP drops it; the NodePort stays open.",
		opts(WithLoadBalancer(), WithSourceRanges("192.168.99.0/24", "fd00:99::/64")), Ready(local, remote),
		on(Outside, TargetLoadBalancerIP, dropped(), unsupportedOn(Windows, reasonWindowsSourceRanges)),
		on(Outside, TargetNodePort, answer(SourceNode, local, remote)),
	)
	b.addCase(7, "source-ranges-other-family", def,
		"loadBalancerSourceRanges of IPv4 only: IPv4 clients outside them are dropped, IPv6 is not filtered.",
		opts(WithLoadBalancer(), WithSourceRanges("192.168.99.0/24")), Ready(local, remote),
		on(Outside, TargetLoadBalancerIP, dropped(), ipv4Only(), unsupportedOn(Windows, reasonWindowsSourceRanges)),
		on(Outside, TargetLoadBalancerIP, answer(SourceNode, local, remote), families(v1.IPv6Protocol)),
	)
	b.addCase(8, "affinity", def,
		"sessionAffinity ClientIP: every connection of one client reaches the same endpoint.",
		opts(WithNodePort(), WithAffinity(0)), Ready(PodA1, PodB1, PodB2),
		on(Client1, TargetClusterIP, Expect{Outcome: Answer, Source: SourceClient, Backends: []string{PodA1, PodB1, PodB2}, Sticky: true}),
		on(Node1, TargetClusterIP, Expect{Outcome: Answer, Backends: []string{PodA1, PodB1, PodB2}, Sticky: true}),
		on(Outside, TargetNodePort, Expect{Outcome: Answer, Source: SourceNode, Backends: []string{PodA1, PodB1, PodB2}, Sticky: true}),
	)
	b.addCase(9, "etp-local", def,
		"externalTrafficPolicy Local: external clients reach only local endpoints and keep their source; "+
			"pods and the node itself short-circuit to the cluster endpoints.",
		opts(WithLoadBalancer(), WithExternalIPs(), WithExternalLocal()), Ready(local, remote),
		on(Outside, TargetNodePort, answer(SourceClient, local)),
		on(Outside, TargetExternalIP, answer(SourceClient, local)),
		on(Outside, TargetLoadBalancerIP, answer(SourceClient, local)),
		on(Client1, TargetExternalIP, answer(SourceClient, local, remote), attempts(8)),
		on(Client1, TargetLoadBalancerIP, answer(SourceClient, local, remote), attempts(8)),
		on(Client1, TargetNodePort, answer(SourceClient, local, remote), attempts(8)),
		on(Client1, TargetClusterIP, answer(SourceClient, local, remote)),
		on(Node1, TargetNodePort, answer(SourceAny, local, remote), attempts(8)),
		on(Node1, TargetExternalIP, answer(SourceAny, local, remote), attempts(8)),
	)
	b.addCase(10, "etp-local-no-local-endpoints", def,
		"externalTrafficPolicy Local without a local endpoint: external traffic is dropped; pods still short-circuit.",
		opts(WithNodePort(), WithExternalIPs(), WithExternalLocal()), Ready(remote),
		on(Outside, TargetNodePort, dropped()),
		on(Outside, TargetExternalIP, dropped()),
		on(Client1, TargetExternalIP, answer(SourceClient, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Node1, TargetNodePort, answer(SourceAny, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
	)
	b.addCase(11, "itp-local", def,
		"internalTrafficPolicy Local: ClusterIP traffic reaches only endpoints on this node.",
		opts(WithInternalLocal()), Ready(PodA1, PodB1, PodB2),
		on(Client1, TargetClusterIP, answer(SourceClient, PodA1), attempts(8)),
		on(Node1, TargetClusterIP, answer(SourceAny, PodA1), attempts(8)),
	)
	b.addCase(12, "itp-local-no-local-endpoints", def,
		"internalTrafficPolicy Local without a local endpoint: ClusterIP traffic is dropped.",
		opts(WithInternalLocal()), Ready(remote),
		on(Client1, TargetClusterIP, dropped()),
	)
	b.addCase(13, "no-endpoints", def,
		"No endpoints at all: every frontend rejects at once.",
		opts(WithLoadBalancer(), WithExternalIPs()), nil,
		on(Client1, TargetClusterIP, rejected(), unsupportedOn(Windows, reasonWindowsNoReject)),
		on(Node1, TargetClusterIP, rejected(), unsupportedOn(Windows, reasonWindowsNoReject)),
		on(Outside, TargetNodePort, rejected(), unsupportedOn(Windows, reasonWindowsNoReject)),
		on(Outside, TargetExternalIP, rejected(), unsupportedOn(Windows, reasonWindowsNoReject)),
		on(Outside, TargetLoadBalancerIP, rejected(), unsupportedOn(Windows, reasonWindowsNoReject)),
	)
	b.addCase(14, "terminating-fallback", def,
		"Only serving terminating endpoints: traffic falls back to them.",
		nil, []EP{{Pod: local, Terminating: true}, {Pod: remote, Terminating: true}},
		on(Client1, TargetClusterIP, answer(SourceClient, local, remote)),
	)
	b.addCase(15, "terminating-ignored", def,
		"A ready endpoint exists: terminating and not-ready endpoints get no traffic.",
		nil, []EP{{Pod: PodA1}, {Pod: PodB1, Terminating: true}, {Pod: PodB2, NotReady: true}, {Pod: PodB3, Terminating: true, NotServing: true}},
		on(Client1, TargetClusterIP, answer(SourceClient, PodA1), attempts(8)),
	)
	b.addCase(16, "topology-hints", def,
		"Zone hints (trafficDistribution PreferClose): only endpoints hinted for node1's zone.",
		opts(WithPreferClose()), []EP{{Pod: PodA1, ZoneHint: Zone1}, {Pod: PodB1, ZoneHint: Zone2}, {Pod: PodB2, ZoneHint: Zone2}},
		on(Client1, TargetClusterIP, answer(SourceClient, PodA1), attempts(8)),
	)
	b.addCase(17, "hairpin", def,
		"Hairpin: a pod reaching itself through its Service gets an answer, seen from a node address.",
		opts(WithNodePort()), Ready(PodA1),
		on(PodA1, TargetClusterIP, answer(SourceNode, PodA1)),
		on(PodA1, TargetNodePort, answer(SourceNode, PodA1)),
	)
	b.addCase(18, "cluster-cidr-masquerade", def,
		"--cluster-cidr set: a ClusterIP reached from outside the cluster CIDR is masqueraded, pods are not.",
		nil, Ready(local),
		on(Outside, TargetClusterIP, answer(SourceNode, local), unsupportedOn(Windows, reasonWindowsClusterIPRouted)),
		on(Client1, TargetClusterIP, answer(SourceClient, local)),
	)
	b.addCase(19, "masquerade-all", Config{ClusterCIDR: true, MasqueradeAll: true},
		"--masquerade-all: even pod traffic to a ClusterIP is masqueraded.",
		nil, Ready(local, remote),
		on(Client1, TargetClusterIP, answer(SourceNode, local, remote), unsupportedOn(Windows, reasonWindowsMasqueradeAll)),
	)
	b.addCase(22, "nodeport-addresses-all", def,
		"Default --nodeport-addresses: NodePorts answer on every local address of the node.",
		opts(WithNodePort()), Ready(local, remote),
		on(Client1, TargetSecondaryNodePort, answer(SourceNode, local, remote), unsupportedOn(Windows, reasonWindowsSecondary)),
	)
	b.addCase(23, "nodeport-addresses-primary", Config{ClusterCIDR: true, NodePortAddresses: "primary"},
		"--nodeport-addresses=primary: NodePorts answer on the node's primary IPs only; "+
			"another local address refuses (nothing listens there).",
		opts(WithNodePort()), Ready(local, remote),
		on(Client1, TargetNodePort, answer(SourceNode, local, remote)),
		on(Outside, TargetNodePort, answer(SourceNode, local, remote)),
		on(Client1, TargetSecondaryNodePort, rejected(), unsupportedOn(Windows, reasonWindowsNodePortAddr)),
	)
	// internalTrafficPolicy and externalTrafficPolicy both Local: in-cluster
	// clients of an external frontend still short-circuit to the cluster
	// endpoints (a Service reachable from outside always has them), while
	// the ClusterIP keeps to this node's endpoints.
	b.addCase(25, "itp-etp-local-remote-only", def,
		"internal and external traffic policies Local, the only endpoint on another node: pods and the node "+
			"reaching an external frontend short-circuit to it; the ClusterIP and outside clients are dropped.",
		opts(WithLoadBalancer(), WithExternalIPs(), WithExternalLocal(), WithInternalLocal()), Ready(remote),
		on(Client1, TargetExternalIP, answer(SourceClient, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Client1, TargetLoadBalancerIP, answer(SourceClient, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Client1, TargetNodePort, answer(SourceClient, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Node1, TargetNodePort, answer(SourceAny, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Node1, TargetExternalIP, answer(SourceAny, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Client1, TargetClusterIP, dropped()),
		on(Outside, TargetNodePort, dropped()),
		on(Outside, TargetLoadBalancerIP, dropped()),
	)
	b.addCase(26, "itp-etp-local-terminating-local", def,
		"internal and external traffic policies Local, a serving terminating endpoint here and a ready one "+
			"elsewhere: in-cluster clients of an external frontend reach the ready one; the ClusterIP and "+
			"outside clients fall back to the local terminating one.",
		opts(WithNodePort(), WithExternalIPs(), WithExternalLocal(), WithInternalLocal()),
		[]EP{{Pod: local, Terminating: true}, {Pod: remote}},
		on(Client1, TargetExternalIP, answer(SourceClient, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Node1, TargetNodePort, answer(SourceAny, remote), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Client1, TargetClusterIP, answer(SourceClient, local)),
		on(Outside, TargetNodePort, answer(SourceClient, local)),
		on(Outside, TargetExternalIP, answer(SourceClient, local)),
	)
	b.addCase(27, "itp-etp-local-both", def,
		"internal and external traffic policies Local, ready endpoints here and elsewhere: in-cluster clients "+
			"of an external frontend reach every endpoint; the ClusterIP and outside clients only this node's.",
		opts(WithNodePort(), WithExternalIPs(), WithExternalLocal(), WithInternalLocal()), Ready(local, remote),
		on(Client1, TargetExternalIP, answer(SourceClient, local, remote), attempts(8), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Node1, TargetNodePort, answer(SourceAny, local, remote), attempts(8), unsupportedOn(Windows, reasonWindowsNoShortCircuit)),
		on(Client1, TargetClusterIP, answer(SourceClient, local), attempts(8)),
		on(Outside, TargetNodePort, answer(SourceClient, local), attempts(8)),
	)
	// Two Services list the same externalIP and port: one frontend, two
	// claims. The intent gives it to the first Service by name (ClusterIP
	// frontends are never shared: the API server allocates them), reports
	// the other (Warning FrontendConflict), and the other keeps its
	// ClusterIP. Upstream kube-proxy leaves the winner to the order of its
	// rules (see the differential's documented differences).
	b.addCase(28, "shared-externalip", def,
		"two Services claim one externalIP and port: the first by name owns it (its endpoints answer), "+
			"the other is reported and keeps its ClusterIP.",
		opts(WithExternalIPs()), Ready(local),
		on(Outside, TargetExternalIP, answer(SourceNode, local)),
		on(Client1, TargetExternalIP, answer(SourceNode, local)),
		on(Node1, TargetExternalIP, answer(SourceAny, local)),
	)
	b.alsoService("shared-externalip-z", 29, true, opts(WithExternalIPsOf(28)), Ready(remote))
	b.addCase(24, "lb-ipmode-proxy", def,
		"LoadBalancer ingress IPs with ipMode Proxy are not captured by the node (the load balancer "+
			"proxies to the node's own address); their NodePort still works.",
		opts(WithLoadBalancer(), WithIPModeProxy()), Ready(local, remote),
		on(Outside, TargetLoadBalancerIP, dropped()),
		on(Outside, TargetNodePort, answer(SourceNode, local, remote)),
	)
	noCIDR := Config{}
	b.addCase(20, "no-cluster-cidr", noCIDR,
		"Without --cluster-cidr: a ClusterIP reached from outside is not masqueraded.",
		nil, Ready(local),
		on(Outside, TargetClusterIP, answer(SourceClient, local), unsupportedOn(Windows, reasonWindowsClusterIPRouted)),
	)
	b.addCase(21, "no-cluster-cidr-etp-local", noCIDR,
		"Without --cluster-cidr pods cannot be told from external clients: pod traffic to an "+
			"externalTrafficPolicy Local externalIP reaches only local endpoints.",
		opts(WithExternalIPs(), WithExternalLocal()), Ready(local, remote),
		on(Client1, TargetExternalIP, answer(SourceClient, local), attempts(8)),
	)
}
