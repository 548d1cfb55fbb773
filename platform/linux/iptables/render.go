package iptables

import (
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
)

// dispatch tables.
const (
	dispServices  = 0
	dispNodePorts = 1
)

// entry is one dispatch rule of a service port: where it belongs (a
// dispatch table and a shard key) and its rule spec (without "-A CHAIN ").
type entry struct {
	disp int
	key  uint16
	spec string
	// external marks an externalIP or load balancer IP entry: in a
	// dispatch chain, every ClusterIP entry comes before every external
	// one, so no external frontend can shadow a ClusterIP.
	external bool
}

// chainOut is one rendered chain: its rules as restore lines.
type chainOut struct {
	name string
	body []byte
	hash uint64
}

// portOut is everything one service port contributes.
type portOut struct {
	chains   []chainOut
	entries  []entry
	hairpin  []netip.Addr
	hcPort   int32
	nodeDeps bool // the rendering depends on the node's addresses
	rules    int
}

// renderer holds the strings derived from the Config once.
type renderer struct {
	cfg      facts.Config
	hostBits string // "/32" or "/128"
	// local matches traffic from local pods (the detect-local mode).
	local        []localMatch
	setMasq      string // -j MARK ... that sets the masquerade mark
	setReject    string
	setDrop      string
	matchMasq    string // -m mark --mark (masquerade)
	matchReject  string
	matchDrop    string
	clearMasq    string
	masquerade   string // -j MASQUERADE [--random-fully]
	recentMask   string
	rejectWith   string
	loopback     netip.Prefix
	probabilites []string // probabilites[n] = 1/n in iptables' canonical form
}

func newRenderer(cfg facts.Config) *renderer {
	m := uint32(1) << cfg.MasqueradeBit
	f := uint32(1) << cfg.FilterBit
	both := m | f
	hx := func(v uint32) string { return "0x" + strconv.FormatUint(uint64(v), 16) }
	r := &renderer{
		cfg:         cfg,
		local:       staticLocal(&cfg),
		setMasq:     "-j MARK --set-xmark " + hx(m) + "/" + hx(m),
		setReject:   "-j MARK --set-xmark " + hx(f) + "/" + hx(both),
		setDrop:     "-j MARK --set-xmark " + hx(both) + "/" + hx(both),
		matchMasq:   "-m mark --mark " + hx(m) + "/" + hx(both),
		matchReject: "-m mark --mark " + hx(f) + "/" + hx(both),
		matchDrop:   "-m mark --mark " + hx(both) + "/" + hx(both),
		clearMasq:   "-j MARK --set-xmark 0x0/" + hx(m),
		masquerade:  "-j MASQUERADE",
	}
	if cfg.RandomFully {
		r.masquerade += " --random-fully"
	}
	if cfg.Is6() {
		r.hostBits = "/128"
		r.recentMask = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
		r.rejectWith = "icmp6-port-unreachable"
		r.loopback = netip.MustParsePrefix("::1/128")
	} else {
		r.hostBits = "/32"
		r.recentMask = "255.255.255.255"
		r.rejectWith = "icmp-port-unreachable"
		r.loopback = netip.MustParsePrefix("127.0.0.0/8")
	}
	r.probabilites = make([]string, 2, 64)
	return r
}

// probability returns 1/n as iptables-save prints it: the kernel keeps
// round(p·2³¹) and iptables prints that back with 11 decimals.
func (r *renderer) probability(n int) string {
	for len(r.probabilites) <= n {
		k := len(r.probabilites)
		v := math.Round(float64(uint64(1)<<31) / float64(k))
		r.probabilites = append(r.probabilites, strconv.FormatFloat(v/float64(uint64(1)<<31), 'f', 11, 64))
	}
	return r.probabilites[n]
}

// savedProbability renders p as iptables-save prints it (see probability).
func savedProbability(p float64) string {
	v := math.Round(p * float64(uint64(1)<<31))
	return strconv.FormatFloat(v/float64(uint64(1)<<31), 'f', 11, 64)
}

// equalWeights are n weights of 1 (least connection without counts).
func equalWeights(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func protoName(p v1.Protocol) string { return strings.ToLower(string(p)) }

// builder appends restore lines for one chain.
type builder struct {
	chain string
	b     []byte
	n     int
}

func (w *builder) add(parts ...string) {
	w.b = append(w.b, "-A "...)
	w.b = append(w.b, w.chain...)
	for _, p := range parts {
		if p == "" {
			continue
		}
		w.b = append(w.b, ' ')
		w.b = append(w.b, p...)
	}
	w.b = append(w.b, '\n')
	w.n++
}

// begin starts a rule: "-A CHAIN".
func (w *builder) begin() {
	w.b = append(w.b, "-A "...)
	w.b = append(w.b, w.chain...)
}

// str appends to the rule being written.
func (w *builder) str(s string) { w.b = append(w.b, s...) }

// end finishes a rule.
func (w *builder) end() {
	w.b = append(w.b, '\n')
	w.n++
}

func (w *builder) out() chainOut {
	h := fnv.New64a()
	_, _ = h.Write(w.b)
	return chainOut{name: w.chain, body: w.b, hash: h.Sum64()}
}

func (r *renderer) host(a netip.Addr) string { return a.String() + r.hostBits }

// portMatch renders "-p tcp -m tcp --dport 80".
func portMatch(proto string, port int32) string {
	return "-p " + proto + " -m " + proto + " --dport " + strconv.Itoa(int(port))
}

// commentOf spells a service port's name as a rule comment. The name is
// object data: the cache validates it, but the renderer does not rely on
// that, so the comment can never end the line or the quoted string early.
func commentOf(n proxy.ServicePortName) string { return syntax.SaveString(commentText(n.String())) }

// maxComment is the longest comment the kernel's comment match accepts
// (XT_MAX_COMMENT_LEN, 256, counts the terminating NUL).
const maxComment = 255

// commentText keeps printable ASCII only (anything else, control characters
// and NUL included, becomes '?') and cuts the text at maxComment bytes.
// Quotes and backslashes stay: syntax.SaveString escapes them.
func commentText(s string) string {
	b := make([]byte, 0, min(len(s), maxComment))
	for i := 0; i < len(s) && len(b) < maxComment; i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		b = append(b, c)
	}
	return string(b)
}

func (r *renderer) addrOK(a netip.Addr) bool {
	c := intent.Config{Family: r.cfg.Family}
	return c.AddrOK(a)
}

// render renders a port's intent. Every decision is the intent's: this
// only chooses how iptables expresses it. A ClusterIP DNATs through the
// chain of its set (SVC: cluster endpoints, SVL: local ones), which also
// holds the masquerade rule for the ClusterIP's sources; the external
// frontends share one EXT chain expressing their per-source routes (pods
// by the detect-local match, the node by its source address type, every
// other client last); source ranges add an FW chain per port in front of
// its load balancer IPs.
func (r *renderer) render(p *intent.Port) *portOut {
	proto := protoName(p.Protocol)
	id := portID(p.Name)
	svcName, svlName, extName, fwName := kindSVC+id, kindSVL+id, kindEXT+id, kindFW+id
	out := &portOut{}
	need := [2]bool{} // SVC, SVL: some rule jumps to it
	nameOf := func(s intent.Set) string {
		if s == intent.Local {
			return svlName
		}
		return svcName
	}
	chainOf := func(s intent.Set) string { // a jump is written to it
		need[s] = true
		return nameOf(s)
	}
	// target names where a route goes (pure); jump marks it written.
	target := func(rt intent.Route) string {
		switch rt.Verdict {
		case intent.Reject:
			return ChainReject
		case intent.Drop:
			return ChainDrop
		}
		return nameOf(rt.Set)
	}
	jump := func(rt intent.Route) string {
		if rt.Verdict == intent.DNAT {
			return chainOf(rt.Set)
		}
		return target(rt)
	}

	// Traffic to the ClusterIP: its sources differ at most by masquerade.
	cip := p.ClusterIP()
	intTarget := jump(cip.Route(intent.FromOutside))
	masqSet := -1 // the set whose chain gets the ClusterIP's masquerade rule
	if rt := cip.Route(intent.FromOutside); rt.Verdict == intent.DNAT {
		masqSet = int(rt.Set)
	}

	// Traffic to the external frontends.
	var extTarget string
	var ext *builder
	routes, external := p.ExternalRoutes()
	if external {
		pod, node, outside := routes[intent.FromPod], routes[intent.FromNode], routes[intent.FromOutside]
		switch {
		case pod == node && node == outside && outside.Verdict != intent.DNAT:
			extTarget = jump(outside)
		case pod == node && node == outside && outside.Masquerade:
			// Everything is masqueraded, then goes to the set's chain.
			ext = &builder{chain: extName}
			ext.add(r.setMasq)
			ext.add("-j", chainOf(outside.Set))
		default:
			// Per source class: pods first (as if they had gone out to
			// the load balancer and back), then the node itself, then
			// every other client.
			ext = &builder{chain: extName}
			if pod != outside {
				for _, m := range r.local {
					ext.add(m.is, "-j", jump(pod))
				}
			}
			if node.Verdict == intent.DNAT && node.Masquerade {
				ext.add("-m addrtype --src-type LOCAL", r.setMasq)
			}
			if target(node) != target(outside) {
				ext.add("-m addrtype --src-type LOCAL", "-j", jump(node))
			}
			switch {
			case outside.Verdict != intent.DNAT:
				ext.add("-j", jump(outside))
			case outside.Set == intent.Local && masqSet != int(intent.Local):
				// The ClusterIP does not use the local set: its DNAT
				// rules go here rather than into a chain of their own.
				r.dnatRules(ext, p, proto, intent.Local)
			default:
				if outside.Masquerade {
					ext.add(r.setMasq)
				}
				ext.add("-j", chainOf(outside.Set))
			}
		}
		if ext != nil {
			extTarget = extName
		}
	}

	masqRule := func(w *builder) {
		// The ClusterIP's sources that are masqueraded: all, or those
		// that are not pods (by the detect-local match).
		if cip.Route(intent.FromPod).Masquerade {
			w.add("-d "+r.host(cip.Addr), portMatch(proto, cip.Port), r.setMasq)
			return
		}
		if !cip.Route(intent.FromOutside).Masquerade {
			return
		}
		dst := "-d " + r.host(cip.Addr)
		pm := portMatch(proto, cip.Port)
		switch {
		case len(r.local) == 1 && r.local[0].iface:
			// iptables-save prints -i after -d: render it in that order.
			w.add(dst, r.local[0].not, pm, r.setMasq)
		case len(r.local) == 1:
			w.add(r.local[0].not, dst, pm, r.setMasq)
		case len(r.local) > 1:
			w.add(dst, pm, "-j", ChainOffCluster)
		}
	}
	for _, s := range []intent.Set{intent.Cluster, intent.Local} {
		if !need[s] {
			continue
		}
		w := &builder{chain: chainOf(s)}
		if masqSet == int(s) {
			masqRule(w)
		}
		r.dnatRules(w, p, proto, s)
		out.chains = append(out.chains, w.out())
		out.rules += w.n
	}
	if ext != nil {
		out.chains = append(out.chains, ext.out())
		out.rules += ext.n
	}
	// Source ranges: one FW chain in front of the port's load balancer
	// IPs (they share their ranges).
	lbTarget := extTarget
	var lbs []*intent.Frontend
	for i := range p.Frontends {
		if p.Frontends[i].Kind == intent.LoadBalancerIP {
			lbs = append(lbs, &p.Frontends[i])
		}
	}
	if len(lbs) > 0 && len(lbs[0].SourceRanges) > 0 {
		w := &builder{chain: fwName}
		for _, pr := range lbs[0].SourceRanges {
			w.add("-s", pr.String(), "-j", extTarget)
		}
		for _, ip := range lbs[0].AllowedSources {
			w.add("-s", r.host(ip), "-j", extTarget)
		}
		w.add("-j", ChainDrop)
		out.chains = append(out.chains, w.out())
		out.rules += w.n
		out.nodeDeps = true
		lbTarget = fwName
	}

	// Dispatch entries.
	comment := "-m comment --comment " + commentOf(p.Name)
	for i := range p.Frontends {
		fe := &p.Frontends[i]
		switch fe.Kind {
		case intent.NodePort:
			out.entries = append(out.entries, entry{
				disp: dispNodePorts,
				key:  nodePortShardKey(p.Protocol, fe.Port),
				spec: "-p " + proto + " " + comment + " -m " + proto + " --dport " + strconv.Itoa(int(fe.Port)) + " -j " + extTarget,
			})
		default:
			t := intTarget
			switch fe.Kind {
			case intent.ExternalIP:
				t = extTarget
			case intent.LoadBalancerIP:
				t = lbTarget
			}
			out.entries = append(out.entries, entry{
				disp:     dispServices,
				key:      ipShardKey(fe.Addr),
				spec:     "-d " + r.host(fe.Addr) + " -p " + proto + " " + comment + " -m " + proto + " --dport " + strconv.Itoa(int(fe.Port)) + " -j " + t,
				external: fe.Kind != intent.ClusterIP,
			})
		}
	}
	out.rules += len(out.entries)
	out.hairpin = p.Hairpin()
	out.hcPort = p.HealthCheckNodePort
	return out
}

// dnatRules renders the load-balancing rules over eps: with session
// affinity, first one "recently seen" rule per endpoint, then one rule per
// endpoint, the last one unconditional, the others taken (by the port's
// algorithm) with probability 1/(remaining endpoints) or every (remaining
// endpoints)-th time (round robin); source-hash ports get one rule per slot
// of proxy.SourceHashTable instead (sourceHashRules). It is the hot loop of a full plan: it appends bytes
// directly.
func (r *renderer) dnatRules(w *builder, p *intent.Port, proto string, set intent.Set) {
	eps := p.Endpoints(set)
	affinity := p.AffinitySeconds > 0
	per := 96 + len(w.chain)
	if affinity {
		per += 220
	}
	w.b = slices.Grow(w.b, per*len(eps))
	var lists []string
	if affinity {
		seconds := strconv.Itoa(int(p.AffinitySeconds))
		lists = make([]string, 0, len(eps))
		for _, ep := range eps {
			list := affinityList(p.Name, ep)
			lists = append(lists, list)
			w.begin()
			w.str(" -p ")
			w.str(proto)
			w.str(" -m recent --update --seconds ")
			w.str(seconds)
			w.str(" --reap --name ")
			w.str(list)
			w.str(" --mask ")
			w.str(r.recentMask)
			w.str(" --rsource -j DNAT --to-destination ")
			w.b = ep.AddrPort().AppendTo(w.b)
			w.end()
		}
	}
	n := len(eps)
	alg := p.AlgorithmOf(set)
	var weights []float64 // least connection: each endpoint's weight
	if alg == proxy.AlgorithmLeastConnection {
		if weights = p.Weights(set); weights == nil {
			weights = equalWeights(len(eps))
		}
	}
	if alg == proxy.AlgorithmSourceHash {
		if table := proxy.SourceHashTable(eps); table != nil {
			r.sourceHashRules(w, proto, eps, table)
			return
		}
		alg = proxy.AlgorithmRandom // no endpoint
	}
	for i, ep := range eps {
		w.begin()
		w.str(" -p ")
		w.str(proto)
		if i < n-1 {
			switch alg {
			case proxy.AlgorithmRoundRobin:
				// nth counts the packets (first packets of connections, in
				// nat) that reach this rule: the i-th rule sees n-i of every
				// n and takes the first of them.
				w.str(" -m statistic --mode nth --every ")
				w.b = strconv.AppendInt(w.b, int64(n-i), 10)
				w.str(" --packet 0")
			case proxy.AlgorithmLeastConnection:
				// Weighted random: this endpoint's weight over the weights
				// of the endpoints left.
				rest := 0.0
				for _, x := range weights[i:] {
					rest += x
				}
				w.str(" -m statistic --mode random --probability ")
				w.str(savedProbability(weights[i] / rest))
			default:
				w.str(" -m statistic --mode random --probability ")
				w.str(r.probability(n - i))
			}
		}
		if affinity {
			w.str(" -m recent --set --name ")
			w.str(lists[i])
			w.str(" --mask ")
			w.str(r.recentMask)
			w.str(" --rsource")
		}
		w.str(" -j DNAT --to-destination ")
		w.b = ep.AddrPort().AppendTo(w.b)
		w.end()
	}
}

// sourceHashRules renders the source-hash table: one rule per slot, "the
// connections whose original source address hashes (jhash with a constant
// seed, over SourceHashSlots) to this slot go to its endpoint", the kernel's
// cluster match. The endpoint with the most slots takes the rest in a last,
// unconditional rule. (One rule per slot because iptables accepts only
// values up to 32 for --cluster-local-nodemask, so a mask of several slots
// cannot be written.)
func (r *renderer) sourceHashRules(w *builder, proto string, eps []proxy.Endpoint, table []int) {
	load := make([]int, len(eps))
	for _, e := range table {
		load[e]++
	}
	rest := 0
	for e, l := range load {
		if l > load[rest] {
			rest = e
		}
	}
	for s, e := range table {
		if e == rest {
			continue
		}
		w.begin()
		w.str(" -p ")
		w.str(proto)
		w.str(" -m cluster --cluster-local-node ")
		w.b = strconv.AppendInt(w.b, int64(s+1), 10)
		w.str(clusterSuffix)
		w.str(" -j DNAT --to-destination ")
		w.b = eps[e].AddrPort().AppendTo(w.b)
		w.end()
	}
	w.begin()
	w.str(" -p ")
	w.str(proto)
	w.str(" -j DNAT --to-destination ")
	w.b = eps[rest].AddrPort().AppendTo(w.b)
	w.end()
}

// clusterSeed is the seed of the source-hash cluster match
// (proxy.SourceHashSeed).
const clusterSeed = proxy.SourceHashSeed

// clusterSuffix follows the slot in a source-hash rule. iptables-save
// prints the slot as --cluster-local-nodemask (1 << (slot-1)), then these,
// in this order.
var clusterSuffix = fmt.Sprintf(" --cluster-total-nodes %d --cluster-hash-seed 0x%08x", proxy.SourceHashSlots, clusterSeed)

// ipShardKey is the last byte of an address: ClusterIPs are allocated at
// random in the service range, so it spreads them evenly.
func ipShardKey(a netip.Addr) uint16 {
	s := a.AsSlice()
	return uint16(s[len(s)-1])
}

// nodePortShardKey groups NodePorts of one protocol by blocks of 64 ports.
func nodePortShardKey(p v1.Protocol, port int32) uint16 {
	var pi uint16
	switch p {
	case v1.ProtocolUDP:
		pi = 1
	case v1.ProtocolSCTP:
		pi = 2
	}
	return pi<<10 | uint16(port>>6)
}
