package differential

import (
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

// Case is what a difference's predicate reads besides the probe: the
// proxy mode, the probe's Service and EndpointSlices, and upstream's
// outcomes of the same probe in the other modes of the run.
type Case struct {
	Mode    string
	Service *v1.Service
	Slices  []*discovery.EndpointSlice
	// UpstreamIn holds upstream's result of the probe by mode, for the
	// modes that ran (this one included).
	UpstreamIn map[string]Result
	// Contenders are the other Services that claim the probe's frontend
	// (the behaviour table's shared-frontend cases; random cases share
	// none).
	Contenders []*v1.Service
	// AllSlices are every EndpointSlice the proxies had with the probe's
	// (the probe's Service's and the others': every scenario loaded in the
	// same batch, or every case of the table's configuration): a node's
	// endpoints are the same pods across them.
	AllSlices []*discovery.EndpointSlice
}

// Difference is one documented way kproxy answers a probe differently
// from upstream kube-proxy v1.37.2, on purpose. Cases are random, so a
// difference is a predicate over the case, the probe and both outcomes,
// never a name.
type Difference struct {
	Name string
	// Reason says why kproxy differs; docs/compatibility.md ("kube-proxy
	// compatibility") has the same entry.
	Reason string
	// Match reports whether the difference explains the outcomes.
	Match func(c Case, p Probe, upstream, kproxy Result) bool
}

// intentionalDifferences are kproxy's documented differences from
// upstream kube-proxy v1.37.2 in traffic behaviour. Every entry is
// mirrored in docs/compatibility.md ("Traffic differences from upstream");
// a difference of outcomes that no entry matches fails the differential.
var intentionalDifferences = []Difference{
	{
		Name: "node-udp-external-eperm",
		Reason: "a UDP send from the node itself to an externalIP or LoadBalancer IP (not one of the node's " +
			"addresses) of a Service port without endpoints fails at sendto with EPERM under kproxy: the reject " +
			"is in the output path, where upstream's nftables mode has it too (its service-endpoints-check is " +
			"jumped from filter-output); upstream's iptables mode lets the packet leave unanswered. The node's " +
			"own NodePorts are refused on input in both of kproxy's modes, as upstream's (issue 27)",
		Match: func(c Case, p Probe, up, kx Result) bool {
			return p.From == proxytest.Node1 && p.Protocol == v1.ProtocolUDP &&
				(p.Frontend == ExternalIP || p.Frontend == LoadBalancerIP) &&
				(up.Only("refused: ICMP port-unreachable") || up.Only("timeout")) &&
				kx.Only("EPERM at send (ICMP port-unreachable queued)")
		},
	},
	{
		Name: "shared-frontend-owner",
		Reason: "when two Services claim one externalIP or LoadBalancer IP and port, kproxy gives it to the " +
			"first by name and reports the other (Warning FrontendConflict); upstream's winner is the order of its " +
			"rules, which follows its map iteration and varies by protocol, family and restart",
		Match: func(c Case, p Probe, up, kx Result) bool {
			if len(c.Contenders) == 0 || (p.Frontend != ExternalIP && p.Frontend != LoadBalancerIP) {
				return false
			}
			answered := false
			for _, f := range up.Facets {
				answered = answered || strings.HasPrefix(f, "answer ")
			}
			return answered
		},
	},
	{
		Name: "tcp-reject-with-reset",
		Reason: "kproxy rejects TCP with a reset where upstream sends an ICMP port unreachable " +
			"(a Service port without endpoints): the client gets \"connection refused\" either way, and at once " +
			"on IPv6 too (docs/linux.md, \"No endpoints\")",
		Match: func(_ Case, p Probe, up, kx Result) bool {
			return p.Protocol == v1.ProtocolTCP && up.Only("refused: ICMP port-unreachable") && kx.Only("refused: RST")
		},
	},
	{
		Name: "source-ranges-before-reject",
		Reason: "a LoadBalancer IP with loadBalancerSourceRanges and no endpoints drops clients outside the " +
			"ranges (and refuses those inside), as upstream's nftables mode does; upstream's iptables mode " +
			"refuses every client, checking the ranges only when there are endpoints. From the node itself " +
			"(outside the ranges) the drop is in the output path, so a UDP send fails with EPERM, as in " +
			"upstream's nftables mode (checked against it when both modes ran); upstream's iptables mode lets " +
			"the packet leave unanswered",
		Match: func(c Case, p Probe, up, kx Result) bool {
			if c.Mode != "iptables" || p.Frontend != LoadBalancerIP || c.Service == nil ||
				len(c.Service.Spec.LoadBalancerSourceRanges) == 0 {
				return false
			}
			if p.From == proxytest.Node1 && p.Protocol == v1.ProtocolUDP {
				ref, ok := c.UpstreamIn["nftables"]
				return up.Only("timeout") && kx.Only(string(EPERM)) && (!ok || Same(ref, kx))
			}
			return up.Only("refused: ICMP port-unreachable") && kx.Only("timeout")
		},
	},
	{
		Name: "node-to-external-address-without-endpoints",
		Reason: "from the node itself, a connection to the externalIP or LoadBalancer IP of a Service port " +
			"without endpoints is refused at once by kproxy; upstream's iptables mode does not catch it " +
			"(the packet leaves for the address, and the client waits) (issue 27)",
		Match: func(c Case, p Probe, up, kx Result) bool {
			return c.Mode == "iptables" && p.From == proxytest.Node1 && p.Protocol == v1.ProtocolTCP &&
				(p.Frontend == ExternalIP || p.Frontend == LoadBalancerIP) && up.Only("timeout") && kx.Only("refused: RST")
		},
	},
}

// hairpinByAddress is a pod reaching itself through a Service (the DNAT
// picked its own address): whether it is masqueraded (and so answered,
// through the node) differs between upstream's two modes, and kproxy's
// rule is neither's.
var hairpinByAddress = Difference{
	Name: "hairpin-by-address",
	Reason: "kproxy masquerades a pod reaching itself through a Service when its address is a usable endpoint " +
		"with nodeName this node of any Service (a set of this node's endpoint addresses: one set lookup in " +
		"nftables, one rule per local endpoint address in iptables, never one per endpoint of the cluster). " +
		"Upstream's iptables mode masquerades for every endpoint of the Service, on this node or not, or without " +
		"nodeName (a rule in each endpoint's chain); its nftables mode only when the address, protocol and port " +
		"are those of an endpoint with nodeName this node (of any Service). So, in iptables mode, a pod whose endpoint of this Service does not " +
		"name this node (no nodeName, or a pod behind another node's proxy) gets no answer from itself under " +
		"kproxy where upstream's gets one; in nftables mode, a pod of this node whose endpoint of this Service " +
		"lacks nodeName while another Service lists it on this node is answered by kproxy, not by upstream. The " +
		"EndpointSlice controller always sets nodeName, and a pod's own node proxies its traffic, so only " +
		"hand-written slices without nodeName see it (issue 27)",
	Match: func(c Case, p Probe, up, kx Result) bool {
		if !selfReach(p, up, kx) || listedOn(c.Slices, p.From, p.Family, proxytest.Node1) {
			return false
		}
		switch c.Mode {
		case "iptables":
			return answersSelf(p, up)
		case "nftables":
			return answersSelf(p, kx) && listedOn(c.AllSlices, p.From, p.Family, proxytest.Node1)
		}
		return false
	},
}

// listedOn reports whether one of slices (of the family) lists pod (by
// its targetRef) with nodeName node.
func listedOn(slices []*discovery.EndpointSlice, pod string, family v1.IPFamily, node string) bool {
	for _, s := range slices {
		if string(s.AddressType) != string(family) {
			continue
		}
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && e.TargetRef.Name == pod && e.NodeName != nil && *e.NodeName == node {
				return true
			}
		}
	}
	return false
}

// localhostNodePorts is added to intentionalDifferences by init: its
// predicate consults the list itself.
var localhostNodePorts = Difference{
	Name: "nftables-localhost-nodeports",
	Reason: "kproxy's nftables mode serves NodePorts on 127.0.0.1 as the iptables modes do (route_localnet, " +
		"with the CVE-2020-8558 guard); upstream's nftables mode has none, so nothing listens there " +
		"(docs/nftables.md). Checked against upstream's iptables mode when both modes ran",
	Match: func(c Case, p Probe, up, kx Result) bool {
		if c.Mode != "nftables" || p.Frontend != NodePortLocalhost || !refusedUnbound(p, up) {
			return false
		}
		ref, ok := c.UpstreamIn["iptables"]
		if !ok {
			return true
		}
		if Same(ref, kx) {
			return true
		}
		// kproxy's outcome may differ from upstream's iptables mode
		// by another documented difference.
		other := c
		other.Mode = "iptables"
		d := intended(other, p, ref, kx, "nftables-localhost-nodeports")
		return d != nil
	},
}

func init() {
	intentionalDifferences = append(intentionalDifferences, hairpinByAddress, localhostNodePorts)
}

// pendingDifferences are differences known and not decided yet (each
// says where it is decided): they are reported, not failed, until they
// are fixed (the entry is then deleted, and the differential proves the
// fix) or kept (the entry moves to intentionalDifferences, with its reason
// in docs/compatibility.md).
var pendingDifferences []Difference // none at present

// selfReach: a probe from a backend pod of its own Service differs only
// in what happens when the pod reaches itself, one proxy masquerading it
// (an answer by the pod, seen from a node address) where the other does
// not (its own reply never matches its connection: a timeout).
func selfReach(p Probe, up, kx Result) bool {
	self := func(f string) bool { return selfAnswer(p, f) }
	split := func(r Result) (rest []string, selfAnswer, timeout bool) {
		for _, f := range r.Facets {
			switch {
			case self(f):
				selfAnswer = true
			case f == string(Timeout):
				timeout = true
			default:
				rest = append(rest, f)
			}
		}
		return rest, selfAnswer, timeout
	}
	upRest, upSelf, upTimeout := split(up)
	kxRest, kxSelf, kxTimeout := split(kx)
	return strings.Join(upRest, "\n") == strings.Join(kxRest, "\n") &&
		((upSelf && !upTimeout && kxTimeout && !kxSelf) || (kxSelf && !kxTimeout && upTimeout && !upSelf))
}

// selfAnswer: facet f is an answer by the probe's client itself.
func selfAnswer(p Probe, f string) bool {
	return strings.HasPrefix(f, "answer "+p.From+",") || strings.HasPrefix(f, "answer "+p.From+":")
}

// answersSelf: the client answered itself in r.
func answersSelf(p Probe, r Result) bool {
	for _, f := range r.Facets {
		if selfAnswer(p, f) {
			return true
		}
	}
	return false
}

// refusedUnbound: the outcome of a probe to an address where nothing
// listens (a reset for TCP, an ICMP port unreachable for UDP).
func refusedUnbound(p Probe, r Result) bool {
	if p.Protocol == v1.ProtocolTCP {
		return r.Only("refused: RST")
	}
	return r.Only("refused: ICMP port-unreachable")
}

// Intended returns the documented (or pending) difference that explains
// a differing probe, nil when none does.
func Intended(c Case, p Probe, upstream, kproxy Result) *Difference {
	return intended(c, p, upstream, kproxy, "")
}

func intended(c Case, p Probe, upstream, kproxy Result, except string) *Difference {
	for _, list := range [][]Difference{intentionalDifferences, pendingDifferences} {
		for i := range list {
			if list[i].Name != except && list[i].Match(c, p, upstream, kproxy) {
				return &list[i]
			}
		}
	}
	return nil
}

// Pending reports whether d is a pending difference (not decided yet).
func (d *Difference) Pending() bool {
	for i := range pendingDifferences {
		if pendingDifferences[i].Name == d.Name {
			return true
		}
	}
	return false
}

// IntentionalDifferences returns the documented differences, then the
// pending ones, for docs and reports.
func IntentionalDifferences() []Difference {
	return append(append([]Difference(nil), intentionalDifferences...), pendingDifferences...)
}

// Diff is a probe whose outcome under kproxy differs from upstream's.
type Diff struct {
	Mode     string
	Case     Case
	Probe    Probe
	Upstream Result
	Kproxy   Result
	// Intended is the documented difference that explains it, or nil.
	Intended *Difference
}

// Compare returns the probes of a scenario whose outcomes differ in one
// mode, in probe order. loaded are the EndpointSlices of every scenario
// the proxies had at once with sc (nil: sc's). upstream holds upstream's
// results by mode (this one and any other that ran), kproxy kproxy's in
// this mode. A probe missing from a run's results counts as "(no
// attempt)".
func Compare(mode string, sc *proxytest.Scenario, loaded []*discovery.EndpointSlice, probes []Probe, upstream map[string]map[string]Result, kproxy map[string]Result) []Diff {
	if loaded == nil {
		loaded = sc.Slices
	}
	var out []Diff
	for _, p := range probes {
		if p.Seed != sc.Seed {
			continue
		}
		up, kx := upstream[mode][p.Key()], kproxy[p.Key()]
		up.Probe, kx.Probe = p, p
		if Same(up, kx) {
			continue
		}
		c := Case{Mode: mode, Slices: sc.SlicesOf(p.Service), AllSlices: loaded, UpstreamIn: map[string]Result{}}
		for m, res := range upstream {
			if r, ok := res[p.Key()]; ok {
				c.UpstreamIn[m] = r
			}
		}
		for _, s := range sc.Services {
			if s.Name == p.Service {
				c.Service = s
			}
		}
		out = append(out, Diff{Mode: mode, Case: c, Probe: p, Upstream: up, Kproxy: kx, Intended: Intended(c, p, up, kx)})
	}
	return out
}

// String renders a difference in two lines plus up to three attempts of
// each proxy.
func (d Diff) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s [%s]\n    kube-proxy: %s\n    kproxy:     %s", d.Probe, d.Mode, d.Upstream.Outcome(), d.Kproxy.Outcome())
	for _, r := range []struct {
		who string
		res Result
	}{{"kube-proxy", d.Upstream}, {"kproxy", d.Kproxy}} {
		for i, a := range r.res.Attempts {
			if i == 3 {
				fmt.Fprintf(&b, "\n      %s: ... %d more attempts", r.who, len(r.res.Attempts)-3)
				break
			}
			fmt.Fprintf(&b, "\n      %s attempt %d: %s in %v", r.who, i+1, a, a.Elapsed.Round(1e6))
		}
	}
	if d.Intended != nil {
		what := "documented difference"
		if d.Intended.Pending() {
			what = "pending difference"
		}
		fmt.Fprintf(&b, "\n    %s %q: %s", what, d.Intended.Name, d.Intended.Reason)
	}
	return b.String()
}

// Class abstracts a difference for grouping: the frontend, the client,
// the protocol, the Service's traffic policies and whether it has usable
// endpoints, and both outcomes with endpoints named by where they run
// ("endpoint on node1") and clients by role.
func (d Diff) Class(top *proxytest.Topology) string {
	svc := d.Case.Service
	var policy []string
	if svc != nil {
		if svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
			policy = append(policy, "etp=Local")
		}
		if svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal {
			policy = append(policy, "itp=Local")
		}
		if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
			policy = append(policy, "affinity")
		}
	}
	if len(d.Probe.Candidates) == 0 {
		policy = append(policy, "no endpoints")
	}
	return fmt.Sprintf("[%s] %s %s from %s (%s): kube-proxy %s | kproxy %s", d.Mode, d.Probe.Frontend, d.Probe.Protocol,
		d.Probe.From, strings.Join(policy, ","), abstract(top, d.Upstream), abstract(top, d.Kproxy))
}

// abstract renders a result's facets with backends replaced by the node
// they run on.
func abstract(top *proxytest.Topology, r Result) string {
	set := map[string]bool{}
	for _, a := range r.Attempts {
		f := a.Facet(true)
		if a.Kind == Answer {
			pod := strings.SplitN(a.Backend, ":", 2)[0]
			where := "?"
			if h, ok := top.Host(pod); ok {
				where = h.Node
			}
			f = "answer by an endpoint on " + where + ", saw " + a.Seen
		}
		set[f] = true
	}
	var out []string
	for f := range set {
		out = append(out, f)
	}
	sort.Strings(out)
	return "{" + strings.Join(out, "; ") + "}"
}
