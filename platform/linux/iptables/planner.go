package iptables

import (
	"bytes"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// Input is what one sync plans from.
type Input struct {
	// View is the snapshot's view of the planner's family.
	View *proxy.FamilyView
	// Node holds the node's facts from the snapshot (its addresses, primary
	// first per family).
	Node proxy.Node
	// LocalAddrs are the addresses currently on the node's interfaces (all
	// families; others are ignored), listed by the applier at each sync.
	LocalAddrs []netip.Addr
	// Changes says what changed since the last sync. A full plan rewrites
	// every chain; a partial one only the chains whose content changed among
	// those of the changed service ports.
	Changes proxy.Changes
	// Existing describes the chains present in the kernel per table ("nat",
	// "filter"): name → hash of their rules as iptables-save prints them
	// (see KernelChains). Read before a full sync, it lets the plan rewrite
	// only the chains whose content differs and delete stale ones (from an
	// earlier run, or left by a tool). Only kproxy's chains are considered.
	// Nil means the planner's own record is trusted and a full plan rewrites
	// every chain.
	Existing map[string]map[string]uint64
	// Extra holds restore lines per table ("nat", "filter") to run in the
	// same transaction, after kproxy's chains are written: the applier's
	// jump insertions and take-over deletions.
	Extra map[string][]string
	// Exclude lists service ports to leave out as if they did not exist
	// (quarantined: the kernel rejected them, or they exceed the rule
	// budget). A change of this set needs a full plan.
	Exclude map[proxy.ServicePortName]bool
	// Referenced lists, per table, owned chains that rules outside kproxy's
	// chains jump to (read with Existing). iptables cannot delete them: a
	// full plan that no longer needs one keeps it, empty, instead.
	Referenced map[string]map[string]bool
	// Connections holds, for least-connection service ports, the
	// established connections per endpoint read from conntrack. A port
	// whose counts changed must be in Changes to be re-rendered. A port
	// missing here spreads evenly.
	Connections map[proxy.ServicePortName]map[netip.AddrPort]int
}

// Jump is a rule in a built-in chain that sends packets into kproxy's chains.
// Restore cannot add these idempotently; the applier ensures them one by one.
type Jump struct {
	Table, Chain string
	Spec         []string
}

// Stats counts what a plan holds and writes.
type Stats struct {
	// ServicePorts is the number of service ports rendered.
	ServicePorts int
	// Chains and Rules count every chain and rule kproxy owns after the plan
	// (both tables, jumps from built-in chains excluded).
	Chains, Rules int
	// WrittenChains and WrittenRules count what this plan's restore input
	// rewrites; DeletedChains the chains it deletes.
	WrittenChains, WrittenRules, DeletedChains int
	// FilterRules and WrittenFilterRules are the filter table's share of
	// Rules and WrittenRules (the rest is in nat).
	FilterRules, WrittenFilterRules int
}

// Plan is the result of planning one sync.
type Plan struct {
	// Full is true when the plan rewrites everything kproxy owns.
	Full bool
	// Restore is the iptables-restore --noflush input (nat then filter
	// sections). It is empty when the kernel is already up to date.
	Restore []byte
	// Jumps lists every jump rule that must exist in built-in chains, in the
	// order they must appear at the top of each chain.
	Jumps []Jump
	// RouteLocalnet is true when localhost NodePorts are active: the applier
	// must set net.ipv4.conf.all.route_localnet=1.
	RouteLocalnet bool
	// Conntrack lists the UDP flows to delete once the rules are in place.
	Conntrack []conntrack.Filter
	// Problems describe what the ports rendered by this plan left out
	// (object and field named); Planner.Problems lists every port's.
	Problems []proxy.Unsupported
	Stats    Stats
	// next is the planner's record once this plan is applied (Commit).
	next *record
}

// portState is what the planner remembers of a service port.
type portState struct {
	sp       *proxy.ServicePort
	chains   []string
	entries  []entry
	hairpin  []netip.Addr
	hcPort   int32
	nodeDeps bool
	rules    int
	// conns is the least-connection counts the rules were rendered with
	// (connsKey; "" for other ports).
	conns string
}

// Planner turns snapshots into iptables-restore input. It keeps the record
// of what the kernel holds after the last plan that was applied, so that a
// partial plan rewrites only what changed. It is not safe for concurrent
// use.
//
// Protocol (raft's Ready/Advance): call Plan for each sync and apply the
// Plan; call Commit(plan) once it was applied. Plan never changes the
// record: a plan that was not applied (its restore failed) is simply not
// committed, and the next Plan starts from the record of the last applied
// one (the caller asks for a full plan then). A Planner never touches the
// kernel: the chains present there reach it as data (Input.Existing).
type Planner struct {
	cfg facts.Config
	r   *renderer
	// record is what the kernel holds after the last committed plan; Plan
	// works on a copy of it (the plan's next record).
	*record
}

// record is the planner's memory of what the kernel holds.
type record struct {
	valid    bool
	ports    map[proxy.ServicePortName]*portState
	disp     [2]*dispatch
	hairpin  map[netip.Addr]int
	hcPorts  map[int32]int
	believed [2]map[string]uint64 // nat, filter: chain → content hash
	nodeIPs  []netip.Addr
	// local are the detect-local matches the rules were rendered with.
	local []localMatch
	// problems holds, per port, what its rendering left out.
	problems map[proxy.ServicePortName][]proxy.Unsupported
	portRule int // rules in per-port chains and dispatch entries
	portChn  int
	// rules and chains of the fixed chains (dispatch parents included)
	baseRules, baseChains int
	// filterRules counts the rules of the filter table (all in fixed chains).
	filterRules int
	// the dispatch parents as last rendered, and KPROXY-SERVICES' tail
	parents [2]chainOut
	svcTail []byte
}

// clone copies the record deeply enough that a plan made on the copy leaves
// the original as it was (values reachable from both are never modified in
// place: portStates and chainOuts are replaced, not changed).
func (r *record) clone() *record {
	c := *r
	c.ports = maps.Clone(r.ports)
	c.problems = maps.Clone(r.problems)
	c.hairpin = maps.Clone(r.hairpin)
	c.hcPorts = maps.Clone(r.hcPorts)
	for i := range r.believed {
		c.believed[i] = maps.Clone(r.believed[i])
	}
	for i, d := range r.disp {
		c.disp[i] = d.clone()
	}
	c.nodeIPs = slices.Clone(r.nodeIPs)
	c.local = slices.Clone(r.local)
	c.svcTail = slices.Clone(r.svcTail)
	return &c
}

// NewPlanner returns a planner for cfg.
func NewPlanner(cfg facts.Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ShardThreshold == 0 {
		cfg.ShardThreshold = facts.DefaultShardThreshold
	}
	p := &Planner{cfg: cfg, r: newRenderer(cfg), record: &record{}}
	p.reset()
	p.local = p.r.local
	p.believed = [2]map[string]uint64{{}, {}}
	return p, nil
}

// Config returns the planner's configuration.
func (p *Planner) Config() facts.Config { return p.cfg }

func (p *Planner) reset() {
	p.ports = map[proxy.ServicePortName]*portState{}
	p.problems = map[proxy.ServicePortName][]proxy.Unsupported{}
	p.disp = [2]*dispatch{newDispatch(ChainServices), newDispatch(ChainNodePorts)}
	p.hairpin = map[netip.Addr]int{}
	p.hcPorts = map[int32]int{}
	p.portRule, p.portChn = 0, 0
}

// Problems lists what the committed plans left out, for every port, sorted.
func (p *Planner) Problems() []proxy.Unsupported {
	var out []proxy.Unsupported
	for _, ps := range p.problems {
		out = append(out, ps...)
	}
	proxy.SortUnsupported(out)
	return out
}

// Commit records that plan was applied: the next plan starts from what it
// wrote. A plan that was not applied must not be committed.
func (p *Planner) Commit(plan *Plan) {
	if plan != nil && plan.next != nil {
		p.record = plan.next
	}
}

// planWriter collects what a plan writes, per table.
type planWriter struct {
	written [2][]chainOut
	deleted [2][]string
	desired [2]map[string]bool
	// force writes every chain, whatever the kernel holds.
	force bool
	rules int
}

// emit records chain c of table ti as desired and writes it unless the
// kernel already holds the same rules.
func (p *Planner) emit(w *planWriter, ti int, c chainOut) {
	w.desired[ti][c.name] = true
	if h, ok := p.believed[ti][c.name]; ok && h == c.hash && !w.force {
		return
	}
	p.believed[ti][c.name] = c.hash
	w.written[ti] = append(w.written[ti], c)
}

// drop deletes chain name of table ti if the kernel has it.
func (p *Planner) drop(w *planWriter, ti int, name string) {
	if _, ok := p.believed[ti][name]; ok && !w.desired[ti][name] {
		w.deleted[ti] = append(w.deleted[ti], name)
		delete(p.believed[ti], name)
	}
}

// Plan renders the restore input that makes the kernel match in.View. It
// does not change the planner's record: Commit the plan once applied.
func (p *Planner) Plan(in Input) *Plan {
	committed := p.record
	p.record = committed.clone()
	p.r.local = p.local
	plan := p.plan(in)
	plan.next = p.record
	p.record = committed
	p.r.local = committed.local
	return plan
}

func (p *Planner) plan(in Input) *Plan {
	full := in.Changes.Full || !p.valid
	plan := &Plan{Full: full}
	w := &planWriter{desired: [2]map[string]bool{{}, {}}, force: full && in.Existing == nil}
	oldPorts := p.ports
	if full {
		p.reset()
		if in.Existing != nil {
			for ti, t := range []string{TableNAT, TableFilter} {
				seen := map[string]uint64{}
				for c, h := range in.Existing[t] {
					if Owned(c) {
						seen[c] = h
					}
				}
				p.believed[ti] = seen
			}
		}
	}
	view := in.View
	if view == nil {
		view = proxy.NewFamilyView(p.cfg.Family, nil)
	}

	p.r.conns = in.Connections
	nodeIPs := p.cfg.NodeIPs(in.Node, in.LocalAddrs)
	nodeChanged := !slices.Equal(nodeIPs, p.nodeIPs)
	p.nodeIPs = nodeIPs
	if p.cfg.LocalDetect == facts.LocalNodeCIDR {
		// The node's pod CIDRs decide what is local: when they change
		// (the Node object arrived or was edited), everything is rewritten.
		if local := nodeLocal(&p.cfg, in.Node); !slices.Equal(local, p.r.local) {
			p.r.local = local
			p.local = local
			if !full {
				return p.plan(Input{View: in.View, Node: in.Node, LocalAddrs: in.LocalAddrs, Existing: in.Existing, Extra: in.Extra,
					Changes: proxy.Changes{Full: true, Ports: in.Changes.Ports}})
			}
		}
	}

	// Which ports to (re)render.
	var names []proxy.ServicePortName
	if full {
		for _, sp := range view.Sorted() {
			names = append(names, sp.Name)
		}
		for n := range oldPorts {
			if view.Ports[n] == nil {
				names = append(names, n) // removed: only for conntrack
			}
		}
	} else {
		set := map[proxy.ServicePortName]bool{}
		for n := range in.Changes.Ports {
			set[n] = true
		}
		if nodeChanged {
			for n, ps := range p.ports {
				if ps.nodeDeps {
					set[n] = true
				}
			}
		}
		for n := range set {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return names[i].Less(names[j]) })
	}

	for _, n := range names {
		sp := view.Ports[n]
		if in.Exclude[n] {
			sp = nil
		}
		old := oldPorts[n]
		conns := connsKey(sp, in.Connections[n])
		if old != nil && sp == old.sp && !full && (!nodeChanged || !old.nodeDeps) && old.conns == conns {
			continue // the same immutable value: nothing to do
		}
		var oldSP *proxy.ServicePort
		if old != nil {
			oldSP = old.sp
		}
		// Stale flows: for ports that changed, and for every port the first
		// time (flows may predate kproxy). A periodic full sync of unchanged
		// ports does not scan the conntrack table.
		if oldSP != sp || oldSP == nil {
			if f := conntrack.StaleFlows(p.cfg.Family, oldSP, sp, in.LocalAddrs); f != nil {
				plan.Conntrack = append(plan.Conntrack, f...)
			}
		}
		p.updatePort(n, sp, old, full, w, &plan.Problems)
		if st := p.ports[n]; st != nil {
			st.conns = conns
		}
	}

	modeChanged := p.writeDispatch(w, full)
	p.writeBase(w, in, full, modeChanged, plan)

	if full {
		// Delete every owned chain the plan does not need.
		for ti := range p.believed {
			var stale []string
			for c := range p.believed[ti] {
				if !w.desired[ti][c] {
					stale = append(stale, c)
				}
			}
			sort.Strings(stale)
			for _, c := range stale {
				if in.Referenced[[]string{TableNAT, TableFilter}[ti]][c] {
					// Emptied, not deleted: a foreign rule jumps to it.
					p.emit(w, ti, (&builder{chain: c}).out())
					continue
				}
				p.drop(w, ti, c)
			}
		}
	}
	plan.Restore = p.render(w, !full, in.Extra)
	plan.Jumps = Jumps()
	plan.Stats = p.stats(w)
	p.valid = true
	return plan
}

// updatePort re-renders one port and records the differences.
func (p *Planner) updatePort(n proxy.ServicePortName, sp *proxy.ServicePort, old *portState, full bool, w *planWriter, problems *[]proxy.Unsupported) {
	var ns *portState
	var chains []chainOut
	if sp != nil {
		out, probs := p.r.renderPort(sp, p.nodeIPs)
		*problems = append(*problems, probs...)
		if len(probs) > 0 {
			p.problems[n] = probs
		} else {
			delete(p.problems, n)
		}
		if out != nil {
			ns = &portState{sp: sp, entries: out.entries, hairpin: out.hairpin, hcPort: out.hcPort, nodeDeps: out.nodeDeps, rules: out.rules}
			for _, c := range out.chains {
				ns.chains = append(ns.chains, c.name)
			}
			chains = out.chains
		}
	} else {
		delete(p.problems, n)
	}
	if full {
		old = nil // state was reset: nothing to remove
	}
	// Chains.
	for _, c := range chains {
		p.emit(w, 0, c)
	}
	if old != nil {
		for _, name := range old.chains {
			p.drop(w, 0, name)
		}
	}
	// Dispatch entries, hairpin addresses, health check ports.
	var oldEntries, newEntries []entry
	if old != nil {
		oldEntries = old.entries
		p.portRule -= old.rules
		p.portChn -= len(old.chains)
		for _, a := range old.hairpin {
			if p.hairpin[a]--; p.hairpin[a] <= 0 {
				delete(p.hairpin, a)
			}
		}
		if old.hcPort != 0 {
			if p.hcPorts[old.hcPort]--; p.hcPorts[old.hcPort] <= 0 {
				delete(p.hcPorts, old.hcPort)
			}
		}
	}
	if ns != nil {
		newEntries = ns.entries
		p.portRule += ns.rules
		p.portChn += len(ns.chains)
		for _, a := range ns.hairpin {
			p.hairpin[a]++
		}
		if ns.hcPort != 0 {
			p.hcPorts[ns.hcPort]++
		}
		p.ports[n] = ns
	} else {
		delete(p.ports, n)
	}
	if !slices.Equal(oldEntries, newEntries) {
		for _, e := range oldEntries {
			p.disp[e.disp].remove(n, e.key)
		}
		for _, e := range newEntries {
			p.disp[e.disp].add(n, e.key)
		}
	}
}

// baseOrder ranks the fixed chains first in restore input, in this order.
var baseOrder = map[string]int{
	ChainServices: 1, ChainNodePorts: 2, ChainHairpin: 3, ChainPostrouting: 4, ChainReject: 5,
	ChainDrop: 6, ChainOffCluster: 7, ChainCanary: 8, ChainFirewall: 9, ChainInput: 10, ChainForward: 11,
}

// render assembles the restore input: per table, the declaration of every
// chain written or deleted (declaring flushes an existing chain), the rules of
// the written chains (fixed chains first), the deletions, then the extra
// lines. With canary (partial plans), both table sections are written and
// each also deletes and re-adds the canary rule and kproxy's jump rules in
// the built-in chains: if someone flushed a table or a built-in chain, or
// deleted kproxy's chains since the last sync, a deletion fails and so does
// the whole (atomic) restore, which tells the caller to sync in full (which
// puts everything back).
func (p *Planner) render(w *planWriter, canary bool, extra map[string][]string) []byte {
	size := 0
	for _, lines := range extra {
		for _, l := range lines {
			size += len(l) + 1
		}
	}
	for ti := range w.written {
		for _, c := range w.written[ti] {
			size += len(c.body) + len(c.name) + 12
		}
		size += len(w.deleted[ti]) * 64
	}
	if size == 0 {
		return nil
	}
	out := make([]byte, 0, size+256)
	for ti, table := range []string{TableNAT, TableFilter} {
		if !canary && len(w.written[ti]) == 0 && len(w.deleted[ti]) == 0 && len(extra[table]) == 0 {
			continue
		}
		written := w.written[ti]
		sort.SliceStable(written, func(i, j int) bool {
			ri, rj := baseOrder[written[i].name], baseOrder[written[j].name]
			if ri == 0 || rj == 0 {
				return ri != 0 && rj == 0
			}
			return ri < rj
		})
		out = append(out, '*')
		out = append(out, table...)
		out = append(out, '\n')
		for _, c := range written {
			out = append(out, ':')
			out = append(out, c.name...)
			out = append(out, " - [0:0]\n"...)
		}
		for _, c := range w.deleted[ti] {
			out = append(out, ':')
			out = append(out, c...)
			out = append(out, " - [0:0]\n"...)
		}
		if canary && !slices.ContainsFunc(written, func(c chainOut) bool { return c.name == ChainCanary }) {
			out = append(out, "-D "+ChainCanary+" -j RETURN\n-A "+ChainCanary+" -j RETURN\n"...)
		}
		if canary {
			for _, j := range Jumps() {
				if j.Table == table {
					rule := j.Rule()
					out = append(out, "-D "+j.Chain+" "+rule+"\n-I "+j.Chain+" 1 "+rule+"\n"...)
				}
			}
		}
		for _, c := range written {
			out = append(out, c.body...)
			w.rules += bytes.Count(c.body, []byte{'\n'})
		}
		for _, c := range w.deleted[ti] {
			out = append(out, "-X "...)
			out = append(out, c...)
			out = append(out, '\n')
		}
		for _, l := range extra[table] {
			out = append(out, l...)
			out = append(out, '\n')
		}
		out = append(out, "COMMIT\n"...)
	}
	return out
}

func (p *Planner) stats(w *planWriter) Stats {
	s := Stats{
		ServicePorts:  len(p.ports),
		Chains:        p.baseChains + p.portChn,
		Rules:         p.baseRules + p.portRule,
		WrittenRules:  w.rules,
		WrittenChains: len(w.written[0]) + len(w.written[1]),
		DeletedChains: len(w.deleted[0]) + len(w.deleted[1]),
		FilterRules:   p.filterRules,
	}
	for _, c := range w.written[1] {
		s.WrittenFilterRules += bytes.Count(c.body, []byte{'\n'})
	}
	for _, d := range p.disp {
		if d.sharded {
			s.Chains += len(d.members)
			// The shard jumps are counted in baseRules; the entries live in
			// the shards and are counted in portRule already.
		} else {
			// Entries are rules of the parent: counted in both portRule and
			// baseRules.
			s.Rules -= d.count
		}
	}
	return s
}

// connsKey renders the least-connection counts of sp's endpoints, in
// endpoint order ("" when sp is not least-connection), so that the planner
// re-renders a port whose counts changed.
func connsKey(sp *proxy.ServicePort, conns map[netip.AddrPort]int) string {
	if sp == nil || sp.EffectiveAlgorithm() != proxy.AlgorithmLeastConnection || len(conns) == 0 {
		return ""
	}
	var b []byte
	for _, list := range [][]proxy.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, ep := range list {
			b = strconv.AppendInt(b, int64(conns[ep.AddrPort()]), 10)
			b = append(b, ',')
		}
		b = append(b, ';')
	}
	return string(b)
}
