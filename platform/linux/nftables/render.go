package nftables

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// chainDef is a chain and its rules.
type chainDef struct {
	name  string
	rules []nft.Rule
	// role names a port's own chain within the port ("eps-cluster",
	// "route-ip", "fw-192.168.1.1"), so a rendering whose content did not
	// change keeps the chain's name; empty for shared chains.
	role string
}

func (c chainDef) sameRules(o chainDef) bool {
	return slices.EqualFunc(c.rules, o.rules, func(a, b nft.Rule) bool { return a.String() == b.String() })
}

// setDef is a named set a port owns (an affinity set).
type setDef struct {
	name    string
	typ     string
	flags   []string
	timeout int32
}

// portOut is everything one service port contributes.
type portOut struct {
	// elems are its elements: dispatch verdicts, endpoint slots.
	elems []Elem
	// own are the port's own chains (in dependency order: a chain only
	// points at chains before it or shared ones); sets its own sets.
	own  []chainDef
	sets []setDef
	// shared lists the shared chains it points at.
	shared []chainDef
	// hairpin lists this node's endpoint addresses it may DNAT to.
	hairpin []netip.Addr
}

// renderer renders ports under one configuration and node.
type renderer struct {
	cfg facts.Config
	f   fam
	// podMatch and notPodMatch match traffic from pods (nil when pods
	// cannot be told apart).
	podMatch, notPodMatch *nft.Match
	// jumpMasq marks a connection for masquerading.
	jumpMasq nft.Verdict
	// verdicts holds one copy of each dispatch verdict the ports'
	// elements share (a full render's 10,000 ports go to a few chains).
	verdicts map[nft.Verdict]*nft.Verdict
	// shared holds one definition of each shared chain whose name says
	// all of its rules, by name: the ports going the same way share it
	// (the record holds one, not one per port).
	shared map[string]chainDef
}

// sharedChain returns the definition of the shared chain name, c when it
// is the first (c's rules must be what name says).
func (r *renderer) sharedChain(c chainDef) chainDef {
	if d, ok := r.shared[c.name]; ok {
		return d
	}
	if r.shared == nil {
		r.shared = map[string]chainDef{}
	}
	r.shared[c.name] = c
	return c
}

// sharedVerdict returns the one copy of v (not to be modified).
func (r *renderer) sharedVerdict(v nft.Verdict) *nft.Verdict {
	if p, ok := r.verdicts[v]; ok {
		return p
	}
	if r.verdicts == nil {
		r.verdicts = map[nft.Verdict]*nft.Verdict{}
	}
	p := &v
	r.verdicts[v] = p
	return p
}

func newRenderer(cfg facts.Config, podSources bool) *renderer {
	r := &renderer{cfg: cfg, f: famOf(cfg.Family), jumpMasq: *nft.Jump(ChainMarkMasq)}
	if podSources {
		iifname := &nft.Meta{Key: "iifname"}
		switch cfg.LocalDetect {
		case facts.LocalBridgeInterface:
			r.podMatch = eq(iifname, nft.Quoted(cfg.LocalInterface))
			r.notPodMatch = ne(iifname, nft.Quoted(cfg.LocalInterface))
		case facts.LocalInterfaceNamePrefix:
			r.podMatch = eq(iifname, nft.Quoted(cfg.LocalInterface+"*"))
			r.notPodMatch = ne(iifname, nft.Quoted(cfg.LocalInterface+"*"))
		default:
			r.podMatch = inSet(SetPodCIDRs, r.f.field("saddr"))
			r.notPodMatch = &nft.Match{Left: []nft.Expr{r.f.field("saddr")}, Op: nft.OpNe, Set: SetPodCIDRs}
		}
	}
	return r
}

// selection is how one endpoint set of a port is picked from.
type selection struct {
	// target is the verdict that picks: "goto <chain>".
	target nft.Verdict
	// shared is the shared DNAT chain it goes to (nil when own).
	shared *chainDef
	// own: a chain of the port's own picks (no endpoint slots).
	own bool
}

// port renders one service port.
func (r *renderer) port(p *intent.Port) *portOut {
	out := &portOut{elems: make([]Elem, 0, portElems(p))}
	proto := ProtoName(p.Protocol)
	protoNum := uint8(nft.Protocols[proto])

	// How each set is picked from, per frontend kind (ip: an address
	// frontend, whose key the shared chains read from the packet's
	// destination; np: a NodePort).
	sels := map[[2]int]selection{}
	var epsChains [2]*chainDef // a port's own endpoint chains, per set
	selectFor := func(s intent.Set, np bool) selection {
		k := [2]int{int(s), b2i(np)}
		if sel, ok := sels[k]; ok {
			return sel
		}
		eps := p.Endpoints(s)
		var sel selection
		switch {
		case p.AffinitySeconds > 0 || p.Algorithm == proxy.AlgorithmRoundRobin ||
			(p.Algorithm == proxy.AlgorithmLeastConnection && p.Weights(s) != nil):
			if epsChains[s] == nil {
				c := r.epsChain(p, s, out)
				epsChains[s] = &c
				out.addOwn(c)
			}
			sel = selection{target: *nft.Goto(epsChains[s].chainRef()), own: true}
		default:
			c := r.dnatChain(s, np, p, len(eps))
			sel = selection{target: *nft.Goto(c.name), shared: &c}
		}
		sels[k] = sel
		return sel
	}

	for i := range p.Frontends {
		fe := &p.Frontends[i]
		np := fe.Kind == intent.NodePort
		// addr is the frontend's address in its keys (none for a
		// NodePort: its keys are the protocol and port in the dispatch
		// map, the port in the endpoint maps, which are per protocol).
		addr := fe.Addr
		if np {
			addr = netip.Addr{}
		}
		// The endpoint slots each DNAT route of the frontend reads (once
		// per set: several source classes may share one).
		targets := [3]nft.Verdict{}
		var slotted [2]bool
		for si, rt := range fe.Routes {
			switch rt.Verdict {
			case intent.DNAT:
				sel := selectFor(rt.Set, np)
				targets[si] = sel.target
				if !sel.own && !slotted[rt.Set] {
					slotted[rt.Set] = true
					out.elems = r.slots(out.elems, p, rt.Set, np, addr, fe.Port)
				}
			case intent.Reject:
				targets[si] = *nft.Goto(ChainReject)
			case intent.Drop:
				targets[si] = nft.Verdict{Kind: "drop"}
			}
		}
		verdict, chains := r.route(fe, targets, np)
		for _, c := range chains {
			if c.role != "" {
				out.addOwn(c)
			} else {
				out.shared = append(out.shared, c)
			}
		}
		if len(fe.SourceRanges) > 0 {
			fw := r.firewall(fe, verdict)
			out.addOwn(fw)
			verdict = *nft.Goto(fw.chainRef())
		}
		out.elems = append(out.elems, dispatchElem(addr, protoNum, fe.Port, r.sharedVerdict(verdict)))
		if np && fe.Routes[intent.FromNode].Verdict == intent.Reject {
			out.elems = append(out.elems, rejectElem(protoNum, fe.Port))
		}
	}
	for _, sel := range sels {
		if sel.shared != nil {
			out.shared = append(out.shared, *sel.shared)
		}
	}
	out.hairpin = p.Hairpin()
	slices.SortFunc(out.shared, func(a, b chainDef) int { return strings.Compare(a.name, b.name) })
	out.shared = slices.CompactFunc(out.shared, func(a, b chainDef) bool { return a.name == b.name })
	return out
}

// addOwn adds one of the port's own chains, once per role (the external
// frontends of a kind share their routes, so their chains are the same).
func (o *portOut) addOwn(c chainDef) {
	for _, x := range o.own {
		if x.role == c.role {
			return
		}
	}
	o.own = append(o.own, c)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// slotMap names the endpoint map of a set, frontend kind and protocol
// ("cluster-ip-tcp", "local-np-udp"). The maps are per protocol because
// their keys read the protocol's header ("tcp dport"): nft 1.0.6 cannot
// read back a DNAT whose key has the protocol-neutral "th dport".
func slotMap(s intent.Set, np bool, proto string) string {
	kind := "ip"
	if np {
		kind = "np"
	}
	return s.String() + "-" + kind + "-" + proto
}

// hashed reports whether set s of p is picked by source hash.
func hashed(p *intent.Port, s intent.Set) bool {
	return p.AlgorithmOf(s) == proxy.AlgorithmSourceHash && len(p.Endpoints(s)) > 0
}

// slots appends the endpoint map elements of one frontend (address addr,
// invalid for a NodePort, and port) for set s: slot i → endpoint, N slots
// for random (numgen mod N), the proxy.SourceHashSlots of the consistent
// table for source hash.
func (r *renderer) slots(out []Elem, p *intent.Port, s intent.Set, np bool, addr netip.Addr, port int32) []Elem {
	eps := p.Endpoints(s)
	m, ok := slotSet(s, np, ProtoName(p.Protocol))
	if !ok {
		return out // no maps for the protocol: pkg/intent has no other
	}
	mk := func(slot int, e int) Elem {
		return slotElem(m, addr, port, slot, netip.AddrPortFrom(eps[e].IP, uint16(eps[e].Port)))
	}
	if hashed(p, s) {
		for slot, e := range proxy.SourceHashTable(eps) {
			out = append(out, mk(slot, e))
		}
		return out
	}
	for i := range eps {
		out = append(out, mk(i, i))
	}
	return out
}

// dnatChain is the shared chain that DNATs a frontend of kind np to one of
// n endpoints of set s, read from the set's map at the frontend's key and
// slot "numgen random mod n" (or the source hash).
func (r *renderer) dnatChain(s intent.Set, np bool, p *intent.Port, n int) chainDef {
	proto := ProtoName(p.Protocol)
	kind := "ip"
	if np {
		kind = "np"
	}
	name := fmt.Sprintf("dnat-%s-%s-%s-r%d", s, kind, proto, n)
	if hashed(p, s) {
		name = fmt.Sprintf("dnat-%s-%s-%s-hash", s, kind, proto)
	}
	// The name says the chain's rules: the ports going to it share one
	// definition.
	if c, ok := r.shared[name]; ok {
		return c
	}
	key := []nft.Expr{r.f.field("daddr"), dport(proto)}
	if np {
		key = []nft.Expr{dport(proto)}
	}
	if hashed(p, s) {
		key = append(key, &nft.Jhash{Of: r.f.field("saddr"), Mod: proxy.SourceHashSlots, Seed: proxy.SourceHashSeed})
	} else {
		key = append(key, &nft.Numgen{Mode: "random", Mod: uint64(n)})
	}
	return r.sharedChain(chainDef{name: name, rules: []nft.Rule{
		{&nft.DNAT{Family: r.f.ip, Key: key, Map: slotMap(s, np, proto)}},
	}})
}

// epsChain is a port's own chain picking from set s with constant DNAT
// rules, one per endpoint: for session affinity (a timed set of client
// addresses per endpoint), round robin (numgen inc, one counter per rule:
// the i-th rule sees n-i of every n connections and takes the first) and
// least connection (each rule takes its weight over the weights left).
func (r *renderer) epsChain(p *intent.Port, s intent.Set, out *portOut) chainDef {
	eps := p.Endpoints(s)
	weights := p.Weights(s)
	proto := ProtoName(p.Protocol)
	c := chainDef{role: "eps-" + s.String()}
	dnat := func(ep proxy.Endpoint) []nft.Stmt {
		return []nft.Stmt{eq(l4proto(), nftProto(proto)), &nft.DNAT{Family: r.f.ip, Addr: ep.IP, Port: uint16(ep.Port)}}
	}
	var affSets []string
	if p.AffinitySeconds > 0 {
		for _, ep := range eps {
			name := "aff-" + hash8(fmt.Sprintf("%s/%s/%d/%s", portKey(p.Name), s, p.AffinitySeconds, ep.AddrPort()))
			affSets = append(affSets, name)
			out.sets = append(out.sets, setDef{name: name, typ: r.f.addr, flags: []string{"dynamic", "timeout"}, timeout: p.AffinitySeconds})
			c.rules = append(c.rules, append(nft.Rule{inSet(name, r.f.field("saddr")), &nft.Update{Set: name, Key: r.f.field("saddr")}}, dnat(ep)...))
		}
	}
	n := len(eps)
	rest := 0.0
	for _, w := range weights {
		rest += w
	}
	for i, ep := range eps {
		var rl nft.Rule
		if i < n-1 {
			switch {
			case p.Algorithm == proxy.AlgorithmRoundRobin:
				rl = append(rl, eq(&nft.Numgen{Mode: "inc", Mod: uint64(n - i)}, nft.Num(0)))
			case weights != nil:
				// numgen random mod 2^31 < p·2^31: this endpoint's weight
				// over the weights of the endpoints left.
				lt := eq(&nft.Numgen{Mode: "random", Mod: 1 << 31}, nft.Num(uint64(math.Round(weights[i]/rest*(1<<31)))))
				lt.Op = nft.OpLt
				rl = append(rl, lt)
			default:
				rl = append(rl, eq(&nft.Numgen{Mode: "random", Mod: uint64(n - i)}, nft.Num(0)))
			}
		}
		if weights != nil {
			rest -= weights[i]
		}
		if affSets != nil {
			rl = append(rl, &nft.Update{Set: affSets[i], Key: r.f.field("saddr")})
		}
		c.rules = append(c.rules, append(rl, dnat(ep)...))
	}
	return c
}

// route returns the verdict of frontend fe's dispatch element, given the
// verdict each source class's route ends with, and the chains it needs.
func (r *renderer) route(fe *intent.Frontend, targets [3]nft.Verdict, np bool) (nft.Verdict, []chainDef) {
	const pod, node, out = intent.FromPod, intent.FromNode, intent.FromOutside
	rt := fe.Routes
	var masq []intent.Source
	for _, s := range intent.Sources {
		if rt[s].Verdict == intent.DNAT && rt[s].Masquerade {
			masq = append(masq, s)
		}
	}
	jumpMasq := func() *nft.Verdict { return verdict(r.jumpMasq) }
	var rulesOut []nft.Rule
	pattern := ""
	switch {
	case len(masq) == 0:
	case len(masq) == 3:
		pattern = "all"
		rulesOut = append(rulesOut, nft.Rule{jumpMasq()})
	case slices.Equal(masq, []intent.Source{node, out}) && r.notPodMatch != nil:
		pattern = "nonpod"
		rulesOut = append(rulesOut, nft.Rule{r.notPodMatch, jumpMasq()})
	default:
		pattern = "mixed"
		for _, s := range masq {
			switch s {
			case pod:
				if r.podMatch != nil {
					rulesOut = append(rulesOut, nft.Rule{r.podMatch, jumpMasq()})
				} else {
					rulesOut = append(rulesOut, nft.Rule{jumpMasq()})
				}
			case node:
				rulesOut = append(rulesOut, nft.Rule{fibType("saddr", "local"), jumpMasq()})
			case out:
				notLocal := fibType("saddr", "local")
				notLocal.Op = nft.OpNe
				if r.notPodMatch != nil {
					rulesOut = append(rulesOut, nft.Rule{r.notPodMatch, notLocal, jumpMasq()})
				} else {
					rulesOut = append(rulesOut, nft.Rule{notLocal, jumpMasq()})
				}
			}
		}
	}
	split := false
	if r.podMatch != nil && targets[pod] != targets[out] {
		rulesOut = append(rulesOut, nft.Rule{r.podMatch, verdict(targets[pod])})
		split = true
	}
	if targets[node] != targets[out] {
		rulesOut = append(rulesOut, nft.Rule{fibType("saddr", "local"), verdict(targets[node])})
		split = true
	}
	if len(rulesOut) == 0 {
		return targets[out], nil // straight to the DNAT chain, reject, or drop
	}
	rulesOut = append(rulesOut, nft.Rule{verdict(targets[out])})
	// A chain pointing at a port's own chain is the port's own; others
	// are shared by every frontend with the same routes.
	own := slices.ContainsFunc(targets[:], func(t nft.Verdict) bool { return t.Kind == "goto" && strings.HasPrefix(t.Chain, rolePrefix) })
	var c chainDef
	switch {
	case own:
		role := "route-ext"
		switch {
		case np:
			role = "route-np"
		case fe.Kind == intent.ClusterIP:
			role = "route-cip"
		}
		c = chainDef{role: role, rules: rulesOut}
	case !split:
		c = chainDef{name: "masq-" + pattern + "-" + strings.TrimPrefix(targets[out].String(), "goto "), rules: rulesOut}
		// "all" and "nonpod" say which sources are masqueraded; "mixed"
		// does not (in practice only the node's are: see
		// pkg/intent.externalRoutes), so its chains are not shared here.
		if pattern != "mixed" {
			c = r.sharedChain(c)
		}
	default:
		// Named by the hash of its rules.
		c = r.sharedChain(chainDef{name: "split-" + hash8(rulesText(rulesOut)), rules: rulesOut})
	}
	return *nft.Goto(c.chainRef()), []chainDef{c}
}

// chainRef is the name a verdict uses: a port's own chains get their name
// when the port is assembled (see ownName), so the reference is the role
// until then.
func (c chainDef) chainRef() string {
	if c.role != "" {
		return rolePrefix + c.role
	}
	return c.name
}

// rolePrefix marks a reference to a port's own chain by role, before the
// chain is named.
const rolePrefix = "@role:"

// firewall is a load balancer IP frontend's own chain: sources outside
// the ranges (and not allowed) are dropped, the rest go on to verdict.
func (r *renderer) firewall(fe *intent.Frontend, v nft.Verdict) chainDef {
	var allow []nft.Key
	for _, p := range fe.SourceRanges {
		allow = append(allow, nft.Key{nft.Prefix(p)})
	}
	for _, a := range fe.AllowedSources {
		allow = append(allow, nft.Key{nft.Addr(a)})
	}
	return chainDef{role: "fw-" + hash8(fe.Addr.String()), rules: []nft.Rule{
		{&nft.Match{Left: []nft.Expr{r.f.field("saddr")}, Op: nft.OpNe, Right: allow, Anon: true}, &nft.Verdict{Kind: "drop"}},
		{verdict(v)},
	}}
}
