package rules

import (
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/ruleset"
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
	cfg      Config
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
	// conns are the least-connection counts of the plan being made
	// (Input.Connections).
	conns map[proxy.ServicePortName]map[netip.AddrPort]int
}

func newRenderer(cfg Config) *renderer {
	m := uint32(1) << cfg.MasqueradeBit
	f := uint32(1) << cfg.FilterBit
	both := m | f
	hx := func(v uint32) string { return "0x" + strconv.FormatUint(uint64(v), 16) }
	r := &renderer{
		cfg:         cfg,
		local:       cfg.staticLocal(),
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
	if cfg.is6() {
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

// leastConnWeights gives each endpoint the weight 1/(1+c), c its
// established connections (conns: from conntrack; nil or missing: 0), so a
// new connection goes to an endpoint with probability inversely
// proportional to its load plus one: with 2 endpoints, one holding 50
// connections and one none, 51/52 (98%) go to the idle one.
func leastConnWeights(eps []proxy.Endpoint, conns map[netip.AddrPort]int) []float64 {
	out := make([]float64, len(eps))
	for i, ep := range eps {
		out[i] = 1 / float64(1+max(conns[ep.AddrPort()], 0))
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
func commentOf(n proxy.ServicePortName) string { return ruleset.SaveString(commentText(n.String())) }

// maxComment is the longest comment the kernel's comment match accepts
// (XT_MAX_COMMENT_LEN, 256, counts the terminating NUL).
const maxComment = 255

// commentText keeps printable ASCII only (anything else, control characters
// and NUL included, becomes '?') and cuts the text at maxComment bytes.
// Quotes and backslashes stay: ruleset.SaveString escapes them.
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

// problem describes input that was skipped.
func problem(sp *proxy.ServicePort, field, format string, args ...any) string {
	return fmt.Sprintf("service port %s: %s: %s", sp.Name, field, fmt.Sprintf(format, args...))
}

func (r *renderer) addrOK(a netip.Addr) bool {
	return a.IsValid() && a.Is6() == r.cfg.is6() && !a.Is4In6() && !a.IsUnspecified()
}

// validEndpoints drops endpoints that cannot be rendered.
func (r *renderer) validEndpoints(sp *proxy.ServicePort, field string, eps []proxy.Endpoint, problems *[]string) []proxy.Endpoint {
	for i, ep := range eps {
		if r.addrOK(ep.IP) && ep.Port > 0 && ep.Port <= 65535 {
			continue
		}
		// Slow path: copy the good ones.
		out := make([]proxy.Endpoint, 0, len(eps))
		out = append(out, eps[:i]...)
		for j, ep := range eps[i:] {
			if r.addrOK(ep.IP) && ep.Port > 0 && ep.Port <= 65535 {
				out = append(out, ep)
				continue
			}
			*problems = append(*problems, problem(sp, fmt.Sprintf("%s[%d]", field, i+j), "endpoint %s is not a valid %s address and port", ep, r.cfg.Family))
		}
		return out
	}
	return eps
}

// renderPort renders one service port. nodeIPs are the node's addresses
// (used when loadBalancerSourceRanges contain one of them). It returns nil
// and the problems when the port cannot be rendered at all.
func (r *renderer) renderPort(sp *proxy.ServicePort, nodeIPs []netip.Addr) (*portOut, []string) {
	var problems []string
	switch {
	case sp.Family != r.cfg.Family:
		return nil, []string{problem(sp, "family", "%s port in the %s view", sp.Family, r.cfg.Family)}
	case !r.addrOK(sp.ClusterIP):
		return nil, []string{problem(sp, "clusterIP", "%q is not a valid %s address", sp.ClusterIP, r.cfg.Family)}
	case sp.Port <= 0 || sp.Port > 65535:
		return nil, []string{problem(sp, "port", "%d is out of range", sp.Port)}
	case sp.Protocol != v1.ProtocolTCP && sp.Protocol != v1.ProtocolUDP && sp.Protocol != v1.ProtocolSCTP:
		return nil, []string{problem(sp, "protocol", "%q is not TCP, UDP or SCTP", sp.Protocol)}
	}
	proto := protoName(sp.Protocol)
	id := portID(sp.Name)
	svcName, svlName, extName, fwName := kindSVC+id, kindSVL+id, kindEXT+id, kindFW+id
	clusterEPs := r.validEndpoints(sp, "clusterEndpoints", sp.ClusterEndpoints, &problems)
	localEPs := r.validEndpoints(sp, "localEndpoints", sp.LocalEndpoints, &problems)
	switch sp.EffectiveAlgorithm() {
	case proxy.AlgorithmSourceHash:
		if n := max(len(clusterEPs), len(localEPs)); n > proxy.MaxSourceHashEndpoints {
			problems = append(problems, problem(sp, "algorithm", "source-hash spreads over at most %d endpoints, %d here: using random", proxy.MaxSourceHashEndpoints, n))
		}
	}
	nodePort := sp.NodePort
	if nodePort < 0 || nodePort > 65535 {
		problems = append(problems, problem(sp, "nodePort", "%d is out of range", nodePort))
		nodePort = 0
	}
	var extIPs, lbIPs []netip.Addr
	for i, a := range sp.ExternalIPs {
		if r.addrOK(a) {
			extIPs = append(extIPs, a)
		} else {
			problems = append(problems, problem(sp, fmt.Sprintf("externalIPs[%d]", i), "%q is not a valid %s address", a, r.cfg.Family))
		}
	}
	for i, a := range sp.LoadBalancerIPs {
		if r.addrOK(a) {
			lbIPs = append(lbIPs, a)
		} else {
			problems = append(problems, problem(sp, fmt.Sprintf("loadBalancerIPs[%d]", i), "%q is not a valid %s address", a, r.cfg.Family))
		}
	}
	external := nodePort != 0 || len(extIPs) > 0 || len(lbIPs) > 0

	out := &portOut{}
	empty := ChainReject
	if sp.HasAnyEndpoints {
		empty = ChainDrop
	}
	needSVC, needSVL := false, false

	// Traffic to the ClusterIP.
	var intTarget string
	switch {
	case !sp.InternalPolicyLocal && len(clusterEPs) > 0:
		intTarget, needSVC = svcName, true
	case sp.InternalPolicyLocal && len(localEPs) > 0:
		intTarget, needSVL = svlName, true
	default:
		intTarget = empty
	}

	// Traffic to the external frontends.
	var extTarget string
	var ext *builder
	if external {
		switch {
		case !sp.HasAnyEndpoints:
			extTarget = ChainReject
		case !sp.ExternalPolicyLocal && len(clusterEPs) == 0:
			extTarget = empty
		case !sp.ExternalPolicyLocal:
			// Everything from outside is masqueraded, then goes to any endpoint.
			ext = &builder{chain: extName}
			ext.add(r.setMasq)
			ext.add("-j", svcName)
			needSVC = true
		default:
			// externalTrafficPolicy Local: pods and the node itself
			// short-circuit to the cluster endpoints (as if they had gone out
			// to the load balancer and back); others go to local endpoints.
			ext = &builder{chain: extName}
			if len(clusterEPs) > 0 {
				for _, m := range r.local {
					ext.add(m.is, "-j", svcName)
				}
			}
			ext.add("-m addrtype --src-type LOCAL", r.setMasq)
			if len(clusterEPs) > 0 {
				ext.add("-m addrtype --src-type LOCAL", "-j", svcName)
				needSVC = true
			}
			switch {
			case len(localEPs) == 0:
				ext.add("-j", ChainDrop)
			case sp.InternalPolicyLocal:
				ext.add("-j", svlName)
				needSVL = true
			default:
				r.dnatRules(ext, sp, proto, localEPs)
			}
		}
		if ext != nil {
			extTarget = extName
		}
	}

	masqRule := func(w *builder) {
		dst := "-d " + r.host(sp.ClusterIP)
		pm := portMatch(proto, sp.Port)
		switch {
		case r.cfg.MasqueradeAll:
			w.add(dst, pm, r.setMasq)
		case len(r.local) == 1 && r.local[0].iface:
			// iptables-save prints -i after -d: render it in that order.
			w.add(dst, r.local[0].not, pm, r.setMasq)
		case len(r.local) == 1:
			w.add(r.local[0].not, dst, pm, r.setMasq)
		case len(r.local) > 1:
			w.add(dst, pm, "-j", ChainOffCluster)
		}
	}
	if needSVC {
		w := &builder{chain: svcName}
		if !sp.InternalPolicyLocal {
			masqRule(w)
		}
		r.dnatRules(w, sp, proto, clusterEPs)
		out.chains = append(out.chains, w.out())
		out.rules += w.n
	}
	if needSVL {
		w := &builder{chain: svlName}
		masqRule(w)
		r.dnatRules(w, sp, proto, localEPs)
		out.chains = append(out.chains, w.out())
		out.rules += w.n
	}
	if ext != nil {
		out.chains = append(out.chains, ext.out())
		out.rules += ext.n
	}
	lbTarget := extTarget
	if external && len(lbIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0 {
		w := &builder{chain: fwName}
		ranges := r.cfg.ofFamily(sp.LoadBalancerSourceRanges)
		allowLB := false
		for _, p := range ranges {
			w.add("-s", p.String(), "-j", extTarget)
			for _, ip := range nodeIPs {
				allowLB = allowLB || p.Contains(ip)
			}
		}
		// A load balancer IP assigned on the node sends the node's own
		// traffic to it with that IP as source: allow it when the node
		// itself is allowed.
		if allowLB {
			for _, ip := range lbIPs {
				w.add("-s", r.host(ip), "-j", extTarget)
			}
		}
		w.add("-j", ChainDrop)
		out.chains = append(out.chains, w.out())
		out.rules += w.n
		out.nodeDeps = true
		lbTarget = fwName
	}

	// Dispatch entries.
	comment := "-m comment --comment " + commentOf(sp.Name)
	pm := " -m " + proto + " --dport " + strconv.Itoa(int(sp.Port))
	dispatch := func(a netip.Addr, target string, external bool) {
		out.entries = append(out.entries, entry{
			disp:     dispServices,
			key:      ipShardKey(a),
			spec:     "-d " + r.host(a) + " -p " + proto + " " + comment + pm + " -j " + target,
			external: external,
		})
	}
	dispatch(sp.ClusterIP, intTarget, false)
	for _, a := range extIPs {
		dispatch(a, extTarget, true)
	}
	for _, a := range lbIPs {
		dispatch(a, lbTarget, true)
	}
	if nodePort != 0 {
		out.entries = append(out.entries, entry{
			disp: dispNodePorts,
			key:  nodePortShardKey(sp.Protocol, nodePort),
			spec: "-p " + proto + " " + comment + " -m " + proto + " --dport " + strconv.Itoa(int(nodePort)) + " -j " + extTarget,
		})
	}
	out.rules += len(out.entries)

	// Local endpoints a pod could reach itself through (hairpin).
	for _, list := range [][]proxy.Endpoint{clusterEPs, localEPs} {
		for _, ep := range list {
			if ep.Local {
				out.hairpin = append(out.hairpin, ep.IP)
			}
		}
	}
	if sp.HealthCheckNodePort > 0 && sp.HealthCheckNodePort <= 65535 {
		out.hcPort = sp.HealthCheckNodePort
	}
	return out, problems
}

// dnatRules renders the load-balancing rules over eps: with session
// affinity, first one "recently seen" rule per endpoint, then one rule per
// endpoint, the last one unconditional, the others taken (by the port's
// algorithm) with probability 1/(remaining endpoints) or every (remaining
// endpoints)-th time (round robin); source-hash ports get one rule per slot
// of proxy.SourceHashTable instead (sourceHashRules). It is the hot loop of a full plan: it appends bytes
// directly.
func (r *renderer) dnatRules(w *builder, sp *proxy.ServicePort, proto string, eps []proxy.Endpoint) {
	affinity := sp.AffinityTimeoutSeconds > 0
	per := 96 + len(w.chain)
	if affinity {
		per += 220
	}
	w.b = slices.Grow(w.b, per*len(eps))
	var lists []string
	if affinity {
		seconds := strconv.Itoa(int(sp.AffinityTimeoutSeconds))
		lists = make([]string, 0, len(eps))
		for _, ep := range eps {
			list := affinityList(sp.Name, ep)
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
	alg := sp.EffectiveAlgorithm()
	var weights []float64 // least connection: each endpoint's weight
	if alg == proxy.AlgorithmLeastConnection {
		weights = leastConnWeights(eps, r.conns[sp.Name])
	}
	if alg == proxy.AlgorithmSourceHash {
		if table := proxy.SourceHashTable(eps); table != nil {
			r.sourceHashRules(w, proto, eps, table)
			return
		}
		alg = proxy.AlgorithmRandom
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
