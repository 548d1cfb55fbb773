package rules

import (
	"bytes"
	"net/netip"
	"slices"
	"sort"

	"github.com/kproxy/kproxy/pkg/proxy"
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
	// Existing lists the chains present in the kernel per table ("nat",
	// "filter"), read before a full sync so stale chains (from an earlier
	// run) are deleted. Only kproxy's chains are considered. Nil means the
	// planner's own record is trusted.
	Existing map[string][]string
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
	Conntrack []ConntrackFilter
	// Problems describe input that was skipped (object and field named).
	Problems []string
	Stats    Stats
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
}

// Planner turns snapshots into iptables-restore input. It remembers what it
// rendered so that a partial plan rewrites only what changed. It is not safe
// for concurrent use.
//
// Protocol: call Plan for each sync, apply the Plan, and call Invalidate if
// applying failed (the next Plan is then full). A Planner never touches the
// kernel: the chains present there reach it as data (Input.Existing).
type Planner struct {
	cfg Config
	r   *renderer

	valid    bool
	ports    map[proxy.ServicePortName]*portState
	disp     [2]*dispatch
	hairpin  map[netip.Addr]int
	hcPorts  map[int32]int
	believed [2]map[string]uint64 // nat, filter: chain → content hash
	nodeIPs  []netip.Addr
	portRule int // rules in per-port chains and dispatch entries
	portChn  int
	// rules and chains of the fixed chains (dispatch parents included)
	baseRules, baseChains int
}

// NewPlanner returns a planner for cfg.
func NewPlanner(cfg Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ShardThreshold == 0 {
		cfg.ShardThreshold = DefaultShardThreshold
	}
	p := &Planner{cfg: cfg, r: newRenderer(cfg)}
	p.reset()
	p.believed = [2]map[string]uint64{{}, {}}
	return p, nil
}

// Config returns the planner's configuration.
func (p *Planner) Config() Config { return p.cfg }

func (p *Planner) reset() {
	p.ports = map[proxy.ServicePortName]*portState{}
	p.disp = [2]*dispatch{newDispatch(ChainServices), newDispatch(ChainNodePorts)}
	p.hairpin = map[netip.Addr]int{}
	p.hcPorts = map[int32]int{}
	p.portRule, p.portChn = 0, 0
}

// Invalidate forgets that the last plan was applied: the next plan is full.
func (p *Planner) Invalidate() { p.valid = false }

// tableIndex maps a table name to its index in believed.
func tableIndex(t string) int {
	if t == TableFilter {
		return 1
	}
	return 0
}

// planWriter collects what a plan writes, per table.
type planWriter struct {
	written [2][]chainOut
	deleted [2][]string
	rules   int
}

// Plan renders the restore input that makes the kernel match in.View.
func (p *Planner) Plan(in Input) *Plan {
	full := in.Changes.Full || !p.valid
	plan := &Plan{Full: full}
	w := &planWriter{}
	oldPorts := p.ports
	if full {
		p.reset()
		if in.Existing != nil {
			for ti, t := range []string{TableNAT, TableFilter} {
				seen := map[string]uint64{}
				for _, c := range in.Existing[t] {
					if Owned(c) {
						seen[c] = p.believed[ti][c] // keep the hash if we know it
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

	nodeIPs := p.r.nodeIPs(in.Node, in.LocalAddrs)
	nodeChanged := !slices.Equal(nodeIPs, p.nodeIPs)
	p.nodeIPs = nodeIPs

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
		old := oldPorts[n]
		if old != nil && sp == old.sp && !full && !(nodeChanged && old.nodeDeps) {
			continue // the same immutable value: nothing to do
		}
		var oldSP *proxy.ServicePort
		if old != nil {
			oldSP = old.sp
		}
		if f := conntrackFor(p.r, oldSP, sp, full, in.LocalAddrs); f != nil {
			plan.Conntrack = append(plan.Conntrack, f...)
		}
		p.updatePort(n, sp, old, full, w, &plan.Problems)
	}

	p.writeDispatch(w, in, full)
	p.writeBase(w, in, full, plan)

	if full {
		// Delete every owned chain we did not write.
		for ti := range p.believed {
			wrote := map[string]bool{}
			for _, c := range w.written[ti] {
				wrote[c.name] = true
			}
			var stale []string
			for c := range p.believed[ti] {
				if !wrote[c] {
					stale = append(stale, c)
				}
			}
			sort.Strings(stale)
			for _, c := range stale {
				w.deleted[ti] = append(w.deleted[ti], c)
				delete(p.believed[ti], c)
			}
		}
	}
	plan.Restore = p.render(w)
	plan.Jumps = jumps()
	plan.Stats = p.stats(w)
	p.valid = true
	return plan
}

// updatePort re-renders one port and records the differences.
func (p *Planner) updatePort(n proxy.ServicePortName, sp *proxy.ServicePort, old *portState, full bool, w *planWriter, problems *[]string) {
	var ns *portState
	var chains []chainOut
	if sp != nil {
		out, probs := p.r.renderPort(sp, p.nodeIPs)
		*problems = append(*problems, probs...)
		if out != nil {
			ns = &portState{sp: sp, entries: out.entries, hairpin: out.hairpin, hcPort: out.hcPort, nodeDeps: out.nodeDeps, rules: out.rules}
			for _, c := range out.chains {
				ns.chains = append(ns.chains, c.name)
			}
			chains = out.chains
		}
	}
	if full {
		old = nil // state was reset: nothing to remove
	}
	// Chains.
	for _, c := range chains {
		if h, ok := p.believed[0][c.name]; !ok || h != c.hash || full {
			w.written[0] = append(w.written[0], c)
			p.believed[0][c.name] = c.hash
		}
	}
	if old != nil {
		for _, name := range old.chains {
			if ns != nil && slices.Contains(ns.chains, name) {
				continue
			}
			if _, ok := p.believed[0][name]; ok {
				w.deleted[0] = append(w.deleted[0], name)
				delete(p.believed[0], name)
			}
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

// writeDispatch renders the dirty parts of both dispatch chains. The
// KPROXY-SERVICES parent is written by writeBase (it has a tail).
func (p *Planner) writeDispatch(w *planWriter, in Input, full bool) {
	for _, d := range p.disp {
		modeChanged := d.decideMode(p.cfg.ShardThreshold)
		if !d.sharded {
			// Shards left over from sharded mode are deleted as stale below.
			if modeChanged || full {
				for name := range p.believed[0] {
					if isShardOf(d, name) {
						w.deleted[0] = append(w.deleted[0], name)
						delete(p.believed[0], name)
					}
				}
			}
			continue
		}
		keys := make([]uint16, 0, len(d.dirty))
		if modeChanged || full {
			keys = sortedKeys(d.members)
		} else {
			for k := range d.dirty {
				keys = append(keys, k)
			}
			slices.Sort(keys)
		}
		for _, k := range keys {
			name := d.shardName(k)
			m := d.members[k]
			if len(m) == 0 {
				if _, ok := p.believed[0][name]; ok {
					w.deleted[0] = append(w.deleted[0], name)
					delete(p.believed[0], name)
				}
				continue
			}
			b := &builder{chain: name}
			for _, n := range sortedNames(m) {
				for _, e := range p.ports[n].entries {
					if e.disp == dispatchIndex(d) && e.key == k {
						b.add(e.spec)
					}
				}
			}
			c := b.out()
			if h, ok := p.believed[0][name]; !ok || h != c.hash || full {
				w.written[0] = append(w.written[0], c)
				p.believed[0][name] = c.hash
			}
		}
	}
}

func dispatchIndex(d *dispatch) int {
	if d.parent == ChainServices {
		return dispServices
	}
	return dispNodePorts
}

func isShardOf(d *dispatch, chain string) bool {
	prefix := shardServices
	if d.parent == ChainNodePorts {
		prefix = shardNodePorts
	}
	return len(chain) > len(prefix) && chain[:len(prefix)] == prefix
}

// dispatchBody renders a dispatch parent: all entries (flat) or one jump per
// shard (sharded).
func (p *Planner) dispatchBody(b *builder, d *dispatch) {
	di := dispatchIndex(d)
	if d.sharded {
		for _, k := range sortedKeys(d.members) {
			b.add(d.shardMatch(k, p.cfg.is6()), "-j", d.shardName(k))
		}
		return
	}
	all := map[proxy.ServicePortName]struct{}{}
	for _, m := range d.members {
		for n := range m {
			all[n] = struct{}{}
		}
	}
	for _, n := range sortedNames(all) {
		for _, e := range p.ports[n].entries {
			if e.disp == di {
				b.add(e.spec)
			}
		}
	}
}

// writeBase renders the fixed chains and writes those whose content changed.
func (p *Planner) writeBase(w *planWriter, in Input, full bool, plan *Plan) {
	r := p.r
	var nat, filter []chainOut

	// KPROXY-SERVICES: dispatch, then the jump to NodePorts. Both dispatch
	// parents are small (at most ShardThreshold rules, or one jump per
	// shard), so they are rendered every time and written when they differ.
	all, ips := r.nodePortDestinations(in.Node, in.LocalAddrs)
	svc := &builder{chain: ChainServices}
	p.dispatchBody(svc, p.disp[0])
	switch {
	case all && r.localhostNodePorts():
		svc.add("-m addrtype --dst-type LOCAL -j", ChainNodePorts)
	case all:
		svc.add("! -d", r.loopback.String(), "-m addrtype --dst-type LOCAL -j", ChainNodePorts)
	default:
		for _, ip := range ips {
			svc.add("-d", r.host(ip), "-j", ChainNodePorts)
		}
	}
	localhost := r.localhostNodePorts() && (all || slices.ContainsFunc(ips, netip.Addr.IsLoopback))
	plan.RouteLocalnet = localhost
	np := &builder{chain: ChainNodePorts}
	p.dispatchBody(np, p.disp[1])
	nat = append(nat, svc.out(), np.out())
	p.disp[0].dirty = map[uint16]bool{}
	p.disp[1].dirty = map[uint16]bool{}

	// Hairpin: a pod reaching itself through a Service must be masqueraded
	// so that the answer comes back through the node.
	hp := &builder{chain: ChainHairpin}
	addrs := make([]netip.Addr, 0, len(p.hairpin))
	for a := range p.hairpin {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		hp.add("-s", r.host(a), "-d", r.host(a), r.masquerade)
	}
	nat = append(nat, hp.out())

	post := &builder{chain: ChainPostrouting}
	post.add("-m conntrack --ctstate DNAT -j", ChainHairpin)
	post.add("-m mark !", r.matchMasq[len("-m mark "):], "-j RETURN")
	post.add(r.clearMasq)
	post.add(r.masquerade)
	nat = append(nat, post.out())

	rej := &builder{chain: ChainReject}
	rej.add(r.setReject)
	rej.add("-j ACCEPT")
	drop := &builder{chain: ChainDrop}
	drop.add(r.setDrop)
	drop.add("-j ACCEPT")
	nat = append(nat, rej.out(), drop.out())
	if len(r.cidrs) > 1 && !r.cfg.MasqueradeAll {
		oc := &builder{chain: ChainOffCluster}
		for _, c := range r.cidrs {
			oc.add("-s", c.String(), "-j RETURN")
		}
		oc.add(r.setMasq)
		nat = append(nat, oc.out())
	}
	canary := &builder{chain: ChainCanary}
	canary.add("-j RETURN")
	nat = append(nat, canary.out())

	// filter
	fw := &builder{chain: ChainFirewall}
	fw.add(r.matchReject, "-j REJECT --reject-with", r.rejectWith)
	fw.add(r.matchDrop, "-j DROP")
	if localhost {
		// CVE-2020-8558: with route_localnet, never accept packets to
		// 127.0.0.0/8 from elsewhere unless they are our DNATed NodePort
		// traffic or its replies.
		fw.add("! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP")
	}
	filter = append(filter, fw.out())
	inp := &builder{chain: ChainInput}
	inp.add("-j", ChainFirewall)
	hcs := make([]int32, 0, len(p.hcPorts))
	for port := range p.hcPorts {
		hcs = append(hcs, port)
	}
	slices.Sort(hcs)
	for _, port := range hcs {
		inp.add(portMatch("tcp", port), "-j ACCEPT")
	}
	filter = append(filter, inp.out())
	fwd := &builder{chain: ChainForward}
	fwd.add("-j", ChainFirewall)
	fwd.add("-m conntrack --ctstate INVALID -j DROP")
	fwd.add(r.matchMasq, "-j ACCEPT")
	fwd.add("-m conntrack --ctstate DNAT -j ACCEPT")
	filter = append(filter, fwd.out())
	fcanary := &builder{chain: ChainCanary}
	fcanary.add("-j RETURN")
	filter = append(filter, fcanary.out())

	for ti, list := range [][]chainOut{nat, filter} {
		var keep []chainOut
		for _, c := range list {
			if h, ok := p.believed[ti][c.name]; ok && h == c.hash && !full {
				continue
			}
			p.believed[ti][c.name] = c.hash
			keep = append(keep, c)
		}
		// Base chains go first, in their fixed order.
		w.written[ti] = append(keep, w.written[ti]...)
	}
	if _, ok := p.believed[0][ChainOffCluster]; ok && !(len(r.cidrs) > 1 && !r.cfg.MasqueradeAll) {
		w.deleted[0] = append(w.deleted[0], ChainOffCluster)
		delete(p.believed[0], ChainOffCluster)
	}
	p.baseRules, p.baseChains = 0, 0
	for _, list := range [][]chainOut{nat, filter} {
		for _, c := range list {
			p.baseRules += bytes.Count(c.body, []byte{'\n'})
			p.baseChains++
		}
	}
}

// render assembles the restore input: per table, the declaration of every
// chain written or deleted (declaring flushes an existing chain), the rules of
// the written chains, then the deletions.
func (p *Planner) render(w *planWriter) []byte {
	size := 0
	for ti := range w.written {
		for _, c := range w.written[ti] {
			size += len(c.body) + len(c.name) + 12
		}
		size += len(w.deleted[ti]) * 64
	}
	if size == 0 {
		return nil
	}
	out := make([]byte, 0, size+64)
	for ti, table := range []string{TableNAT, TableFilter} {
		if len(w.written[ti]) == 0 && len(w.deleted[ti]) == 0 {
			continue
		}
		out = append(out, '*')
		out = append(out, table...)
		out = append(out, '\n')
		for _, c := range w.written[ti] {
			out = append(out, ':')
			out = append(out, c.name...)
			out = append(out, " - [0:0]\n"...)
		}
		for _, c := range w.deleted[ti] {
			out = append(out, ':')
			out = append(out, c...)
			out = append(out, " - [0:0]\n"...)
		}
		for _, c := range w.written[ti] {
			out = append(out, c.body...)
			w.rules += bytes.Count(c.body, []byte{'\n'})
		}
		for _, c := range w.deleted[ti] {
			out = append(out, "-X "...)
			out = append(out, c...)
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

// jumps lists the rules kproxy needs in built-in chains.
func jumps() []Jump {
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	return []Jump{
		{TableNAT, "PREROUTING", append(c("kproxy service portals"), "-j", ChainServices)},
		{TableNAT, "OUTPUT", append(c("kproxy service portals"), "-j", ChainServices)},
		{TableNAT, "POSTROUTING", append(c("kproxy postrouting"), "-j", ChainPostrouting)},
		{TableFilter, "INPUT", append(c("kproxy input"), "-j", ChainInput)},
		{TableFilter, "FORWARD", append(c("kproxy forward"), "-j", ChainForward)},
		{TableFilter, "OUTPUT", append(c("kproxy output"), "-j", ChainFirewall)},
	}
}

// Jumps lists the rules kproxy needs in built-in chains (also in every Plan).
func Jumps() []Jump { return jumps() }

// Chains lists the chains the planner believes exist in the kernel, per table.
func (p *Planner) Chains() map[string][]string {
	out := map[string][]string{}
	for ti, t := range []string{TableNAT, TableFilter} {
		for c := range p.believed[ti] {
			out[t] = append(out[t], c)
		}
		sort.Strings(out[t])
	}
	return out
}
