package iptables

import (
	"bytes"
	"maps"
	"net/netip"
	"slices"
	"sort"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
)

// Input is what one sync plans from.
type Input struct {
	// View is the intent of the planner's family: its ports, the node's
	// facts, and which ports changed since the previous View.
	View *intent.View
	// Full rewrites every chain; otherwise only the chains whose content
	// changed among those of the ports View says changed.
	Full bool
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
	// Node replaces View.Node for where NodePorts answer (the applier's
	// primary address kept while the Node is unknown); zero: View.Node.
	Node *proxy.Node
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
	Stats         Stats
	// next is the planner's record once this plan is applied (Commit).
	next *record
}

// portState is what the planner remembers of a service port.
type portState struct {
	in       *intent.Port
	chains   []string
	entries  []entry
	hairpin  []netip.Addr
	hcPort   int32
	nodeDeps bool
	rules    int
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
	record *record
}

// planning is one plan in the making: the planner's settings and the copy
// of its record the plan becomes (Plan never changes the Planner).
type planning struct {
	cfg facts.Config
	r   *renderer
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
	// local are the detect-local matches the rules were rendered with.
	local    []localMatch
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
	c.hairpin = maps.Clone(r.hairpin)
	c.hcPorts = maps.Clone(r.hcPorts)
	for i := range r.believed {
		c.believed[i] = maps.Clone(r.believed[i])
	}
	for i, d := range r.disp {
		c.disp[i] = d.clone()
	}
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
	p.record.reset()
	p.record.local = p.r.local
	p.record.believed = [2]map[string]uint64{{}, {}}
	return p, nil
}

// Config returns the planner's configuration.
func (p *Planner) Config() facts.Config { return p.cfg }

func (p *record) reset() {
	p.ports = map[proxy.ServicePortName]*portState{}
	p.disp = [2]*dispatch{newDispatch(ChainServices), newDispatch(ChainNodePorts)}
	p.hairpin = map[netip.Addr]int{}
	p.hcPorts = map[int32]int{}
	p.portRule, p.portChn = 0, 0
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
func (p *planning) emit(w *planWriter, ti int, c chainOut) {
	w.desired[ti][c.name] = true
	if h, ok := p.believed[ti][c.name]; ok && h == c.hash && !w.force {
		return
	}
	p.believed[ti][c.name] = c.hash
	w.written[ti] = append(w.written[ti], c)
}

// drop deletes chain name of table ti if the kernel has it.
func (p *planning) drop(w *planWriter, ti int, name string) {
	if _, ok := p.believed[ti][name]; ok && !w.desired[ti][name] {
		w.deleted[ti] = append(w.deleted[ti], name)
		delete(p.believed[ti], name)
	}
}

// Plan renders the restore input that makes the kernel match in.View. It
// does not change the planner: Commit the plan once applied.
func (p *Planner) Plan(in Input) *Plan {
	r := *p.r
	r.local = p.record.local
	pl := &planning{cfg: p.cfg, r: &r, record: p.record.clone()}
	plan := pl.plan(in)
	plan.next = pl.record
	return plan
}

func (p *planning) plan(in Input) *Plan {
	full := in.Full || !p.valid
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
	v := in.View
	if p.cfg.LocalDetect == facts.LocalNodeCIDR {
		// The node's pod CIDRs decide what is local: when they change
		// (the Node object arrived or was edited), everything is rewritten.
		if local := nodeLocal(&p.cfg, v.Node); !slices.Equal(local, p.r.local) {
			p.r.local = local
			p.local = local
			if !full {
				in.Full = true
				return p.plan(in)
			}
		}
	}

	// Which ports to (re)render: every port of the view on a full plan,
	// the changed ones otherwise, in name order.
	var names []proxy.ServicePortName
	if full {
		for _, ip := range v.Sorted() {
			names = append(names, ip.Name)
		}
	} else {
		v.ChangedPorts(func(n proxy.ServicePortName, _ *intent.Port) { names = append(names, n) })
		sort.Slice(names, func(i, j int) bool { return names[i].Less(names[j]) })
	}
	for _, n := range names {
		ip := v.Port(n)
		if in.Exclude[n] {
			ip = nil
		}
		old := oldPorts[n]
		if old != nil && ip == old.in && !full {
			continue // the same immutable value: nothing to do
		}
		p.updatePort(n, ip, old, full, w)
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
func (p *planning) updatePort(n proxy.ServicePortName, ip *intent.Port, old *portState, full bool, w *planWriter) {
	var ns *portState
	var chains []chainOut
	if ip != nil {
		out := p.r.render(ip)
		ns = &portState{in: ip, entries: out.entries, hairpin: out.hairpin, hcPort: out.hcPort, nodeDeps: out.nodeDeps, rules: out.rules}
		for _, c := range out.chains {
			ns.chains = append(ns.chains, c.name)
		}
		chains = out.chains
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
func (p *planning) render(w *planWriter, canary bool, extra map[string][]string) []byte {
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

func (p *planning) stats(w *planWriter) Stats {
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
