package nftables

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/pmap"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// Input is what one render needs.
type Input struct {
	// Full rewrites everything kproxy owns in its table, in one
	// transaction (the table stays in place: no connection meets a moment
	// without rules).
	Full bool
	// Ports holds the intent of each port to render: every port for a full
	// render, the changed ones otherwise (nil: the port is gone).
	Ports map[proxy.ServicePortName]*intent.Port
	// Node holds the node-wide facts. A change of PodSources changes every
	// port's intent: the caller renders in full then.
	Node Node
	// Existing lists what kproxy's table holds, read before a full render
	// (nil: no table). Chains and sets kproxy no longer wants are deleted.
	Existing *Existing
}

// Existing names the objects in kproxy's table.
type Existing struct {
	Chains, Sets []string
}

// Stats counts what kproxy's table holds after a plan and what the plan
// writes.
type Stats struct {
	ServicePorts int
	// Chains and Elements count the chains and the elements (of every set
	// and map) kproxy owns after the plan; Rules the rules of its chains.
	Chains, Rules, Elements int
	// WrittenChains, WrittenRules, AddedElements, DeletedElements and
	// DeletedChains count what the transaction does.
	WrittenChains, WrittenRules, AddedElements, DeletedElements, DeletedChains int
}

// Plan is what one render produced: the transaction to run, and what else
// the applier must do.
type Plan struct {
	Full bool
	// Tx is the transaction (empty when nothing changed).
	Tx *Tx
	// RouteLocalnet: localhost NodePorts are on, the applier must set
	// net.ipv4.conf.all.route_localnet=1.
	RouteLocalnet bool
	Stats         Stats
}

// Applied is what kproxy's table holds after a transaction succeeded: the
// record a render starts from. It is a value: Render never modifies the
// Applied it is given, and the one it returns must only be used (kept) once
// its transaction succeeded.
type Applied struct {
	gen  uint64
	node Node
	base bool
	// The maps are persistent (package pmap): a partial render clones the
	// record in O(1) and copies only what it changes.
	ports *proxy.PortMap[*appliedPort]
	// shared counts the references to each shared chain (by name); their
	// definitions are in defs.
	shared  *pmap.Map[string, int]
	defs    *pmap.Map[string, chainDef]
	hairpin *pmap.Map[netip.Addr, int]
	// elements, chains and rules count what the table holds; fixed and
	// own count the fixed chains and the ports' own chains.
	elements, chains, rules, fixed, own int
}

type appliedPort struct {
	in  *intent.Port
	out *portOut
}

// Ports returns the number of service ports recorded.
func (a *Applied) Ports() int {
	if a == nil {
		return 0
	}
	return a.ports.Len()
}

// Intent returns the intent a port was rendered from (nil: not rendered).
func (a *Applied) Intent(n proxy.ServicePortName) *intent.Port {
	if a == nil {
		return nil
	}
	if ap := a.ports.Value(n); ap != nil {
		return ap.in
	}
	return nil
}

func (a *Applied) clone() *Applied {
	return &Applied{
		gen: a.gen, node: a.node, base: a.base,
		ports:    a.ports.Clone(),
		shared:   a.shared.Clone(),
		defs:     a.defs.Clone(),
		hairpin:  a.hairpin.Clone(),
		elements: a.elements, chains: a.chains, rules: a.rules, fixed: a.fixed, own: a.own,
	}
}

func emptyApplied(gen uint64) *Applied {
	return &Applied{gen: gen, ports: proxy.NewPortMap[*appliedPort](), shared: pmap.NewOrdered[string, int](),
		defs: pmap.NewOrdered[string, chainDef](), hairpin: pmap.New[netip.Addr, int](netip.Addr.Less)}
}

// Renderer renders one family's table. It is pure and stateless apart from
// its configuration: what the kernel holds reaches it as the Applied of
// the last successful transaction.
type Renderer struct {
	cfg   facts.Config
	newTx func() *knftables.Transaction
}

// NewRenderer returns a renderer for cfg (its family, masquerade bit,
// detect-local mode, capabilities).
func NewRenderer(cfg facts.Config) (*Renderer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("nftables renderer: %w", err)
	}
	// knftables writes the operations other than elements: its
	// transactions render "add chain ip kproxy ..." and so on.
	newTx := knftables.NewFake(Family(cfg.Family), TableName).NewTransaction
	return &Renderer{cfg: cfg, newTx: newTx}, nil
}

// Config returns the renderer's configuration.
func (rd *Renderer) Config() facts.Config { return rd.cfg }

// tx collects a transaction's operations in the order they must run:
// chains (and sets) first, then their rules, the element deletions, the
// element additions, and the deletions of what nothing refers to any more.
// Elements have lists of their own (a full sync has some 100,000 of them:
// no per-element allocation).
type tx struct {
	head, chains, rules []op
	delElems, addElems  []Elem
	delChains, delSets  []op
	stats               Stats
	// full: every chain written is flushed first (it may exist).
	full bool
	// touchedShared and touchedHairpin: the shared chains and hairpin
	// addresses whose counts a partial render changed (finish looks only
	// at those).
	touchedShared  map[string]struct{}
	touchedHairpin map[netip.Addr]struct{}
}

// op is an operation on an object other than an element.
type op struct {
	verb string // add, flush, delete
	obj  knftables.Object
}

// write renders the operations into tx, in order. Objects other than
// elements are written by knftables; runs of element operations on one
// set are batched into one command each (nft parses one command of a
// thousand elements far faster than a thousand commands).
func (t *tx) write(out *Tx, newTx func() *knftables.Transaction) {
	t.summarize(out)
	out.src, out.newTx = t, newTx
}

// objOps counts the operations on objects other than elements.
func (t *tx) objOps() int {
	return len(t.head) + len(t.chains) + len(t.rules) + len(t.delChains) + len(t.delSets)
}

// summarize counts the operations into out, and lists them as ElemOps
// when every one is an element's.
func (t *tx) summarize(out *Tx) {
	out.ops = t.objOps() + len(t.delElems) + len(t.addElems)
	out.elems = nil
	if t.objOps() > 0 {
		return
	}
	out.elems = make([]ElemOp, 0, len(t.delElems)+len(t.addElems))
	for _, e := range t.delElems {
		out.elems = append(out.elems, ElemOp{Delete: true, Elem: e})
	}
	for _, e := range t.addElems {
		out.elems = append(out.elems, ElemOp{Elem: e})
	}
	if len(out.elems) == 0 {
		out.elems = nil
	}
}

// text renders the nft -f input of the operations.
func (t *tx) text(table string, newTx func() *knftables.Transaction) []byte {
	var text []byte
	objects := func(lists ...[]op) {
		kt := newTx()
		for _, list := range lists {
			for _, o := range list {
				switch o.verb {
				case "add":
					kt.Add(o.obj)
				case "flush":
					kt.Flush(o.obj)
				case "delete":
					kt.Delete(o.obj)
				}
			}
		}
		if kt.NumOperations() > 0 {
			text = append(text, kt.String()...)
		}
	}
	elements := func(verb string, list []Elem) {
		runSet, runLen := setNone, 0
		for i := range list {
			e := &list[i]
			if runLen == 0 || runSet != e.set || runLen >= maxBatch {
				if runLen > 0 {
					text = append(text, " }\n"...)
				}
				text = append(text, verb...)
				text = append(text, " element "...)
				text = append(text, table...)
				text = append(text, ' ')
				text = append(text, e.set.String()...)
				text = append(text, " { "...)
				runSet, runLen = e.set, 0
			} else {
				text = append(text, ", "...)
			}
			text = e.appendKey(text)
			if verb == "add" && e.hasValue() {
				text = append(text, " : "...)
				text = e.appendValue(text)
			}
			runLen++
		}
		if runLen > 0 {
			text = append(text, " }\n"...)
		}
	}
	objects(t.head, t.chains, t.rules)
	elements("delete", t.delElems)
	elements("add", t.addElems)
	objects(t.delChains, t.delSets)
	return text
}

// maxBatch bounds the elements of one batched command.
const maxBatch = 2000

// Tx is one transaction: the nft -f input, in order. It is a value; an
// Interface runs it.
type Tx struct {
	// table is "ip kproxy" (the family and table every operation names).
	table string
	// text is the nft -f input; a rendered transaction writes it from src
	// the first time it is asked for (a full one sent over netlink never
	// needs all of it).
	text  []byte
	src   *tx
	newTx func() *knftables.Transaction
	ops   int
	// elems lists the operations when every one is an element's (the
	// hot path, which System can send over netlink); nil otherwise.
	elems []ElemOp
}

// render writes the text from src, once.
func (t *Tx) render() {
	if t.src != nil && t.text == nil {
		t.text = t.src.text(t.table, t.newTx)
	}
}

// ElemOp is one element operation of a transaction: an addition, a
// deletion (the element's value is not used), or a flush.
type ElemOp struct {
	Delete bool
	// Flush deletes every element of the element's set (it has no other
	// part: see FlushOp); only a full transaction's netlink part has it
	// (see Tx.Split).
	Flush bool
	Elem
}

// Elements returns the transaction's operations when they are all element
// operations of kproxy's table (nil otherwise).
func (t *Tx) Elements() []ElemOp { return t.elems }

// Family returns the nftables family the transaction is for.
func (t *Tx) Family() knftables.Family {
	f, _, _ := strings.Cut(t.table, " ")
	return knftables.Family(f)
}

// String returns the nft -f input.
func (t *Tx) String() string { t.render(); return string(t.text) }

// Bytes returns the nft -f input (not to be modified).
func (t *Tx) Bytes() []byte { t.render(); return t.text }

// NumOperations counts the operations (each element counts).
func (t *Tx) NumOperations() int { return t.ops }

func (t *tx) addChain(c chainDef) {
	t.chains = append(t.chains, op{verb: "add", obj: &knftables.Chain{Name: c.name}})
	if t.full {
		t.chains = append(t.chains, op{verb: "flush", obj: &knftables.Chain{Name: c.name}})
	}
	for _, r := range c.rules {
		t.rules = append(t.rules, op{verb: "add", obj: &knftables.Rule{Chain: c.name, Rule: r.String()}})
	}
	t.stats.WrittenChains++
	t.stats.WrittenRules += len(c.rules)
}

func (t *tx) delChain(name string) {
	t.delChains = append(t.delChains, op{verb: "delete", obj: &knftables.Chain{Name: name}})
	t.stats.DeletedChains++
}

func (t *tx) addElem(e Elem) {
	t.addElems = append(t.addElems, e)
	t.stats.AddedElements++
}

func (t *tx) delElem(e Elem) {
	t.delElems = append(t.delElems, e)
	t.stats.DeletedElements++
}

func (t *tx) addSet(s setDef) {
	t.chains = append(t.chains, op{verb: "add", obj: &knftables.Set{Name: s.name, Type: s.typ, Flags: setFlags(s.flags),
		Timeout: knftables.PtrTo(time.Duration(s.timeout) * time.Second)}})
}

func setFlags(fs []string) []knftables.SetFlag {
	var out []knftables.SetFlag
	for _, f := range fs {
		out = append(out, knftables.SetFlag(f))
	}
	return out
}

// Render makes the transaction that takes the table from last (nil: no
// record, as at start) to what in asks, and the record of the table after
// it. Only a full render rewrites the fixed objects; a partial one touches
// the changed ports' elements and chains.
func (rd *Renderer) Render(in Input, last *Applied) (*Plan, *Applied) {
	full := in.Full || last == nil || !last.base || !last.node.equal(in.Node)
	r := newRenderer(rd.cfg, in.Node.PodSources)
	var next *Applied
	t := &tx{full: full}
	plan := &Plan{Full: full}
	var gen uint64
	if last != nil {
		gen = last.gen
	}
	if full {
		next = emptyApplied(gen)
		next.node = in.Node
		next.base = true
		t.addElems = make([]Elem, 0, estimateElems(in.Ports))
		rd.writeFixed(r, t, in, next)
	} else {
		next = last.clone()
	}

	// Every frontend of a port is its own: the intent gave each to one
	// port only (pkg/intent's ownership), and a port that lost one is in
	// the changed ports with the port that gained it.
	names := slices.SortedFunc(maps.Keys(in.Ports), func(a, b proxy.ServicePortName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	for _, n := range names {
		p := in.Ports[n]
		var old *appliedPort
		if !full {
			old = last.ports.Value(n)
		}
		var out *portOut
		if p != nil {
			out = r.port(p)
			var oldOut *portOut
			if old != nil {
				oldOut = old.out
			}
			next.gen = resolveOwn(out, oldOut, portKey(n), next.gen)
		}
		rd.diffPort(t, next, n, old, p, out)
	}

	rd.finish(t, last, next, full)
	if !full && (len(t.chains)+len(t.rules)+len(t.delElems)+len(t.addElems)+len(t.delChains)+len(t.delSets) > 0) {
		rd.canary(r, t)
	}
	if full && in.Existing != nil {
		// Whatever kproxy's table holds that nothing wants any more: its
		// chains were flushed at the start, so nothing points at them.
		for _, c := range in.Existing.Chains {
			if !rd.wantChain(next, c) {
				t.delChain(c)
			}
		}
		for _, s := range in.Existing.Sets {
			if !rd.wantSet(r, next, s) {
				t.delSets = append(t.delSets, op{verb: "delete", obj: &knftables.Set{Name: s}})
			}
		}
	}
	if full {
		next.elements = t.stats.AddedElements
	} else {
		next.elements += t.stats.AddedElements - t.stats.DeletedElements
	}
	next.chains = next.fixed + next.shared.Len() + next.own
	plan.Stats = t.stats
	plan.Stats.ServicePorts = next.ports.Len()
	plan.Stats.Elements = next.elements
	plan.Stats.Chains = next.chains
	plan.Stats.Rules = next.rules
	plan.RouteLocalnet = in.Node.Localhost
	plan.Tx = rd.tx()
	t.write(plan.Tx, rd.newTx)
	return plan, next
}

// estimateElems is about the number of elements a full render of ports
// writes (exact for ClusterIP ports with random endpoint picks): the
// list is sized once instead of growing by copies through 100,000.
func estimateElems(ports map[proxy.ServicePortName]*intent.Port) int {
	n := 64
	for _, p := range ports {
		if p != nil {
			n += portElems(p)
		}
	}
	return n
}

// portElems is about the number of elements of one port: one dispatch
// element per frontend, one slot per endpoint.
func portElems(p *intent.Port) int { return len(p.Frontends) + len(p.Cluster) + len(p.Local) }

// canary deletes and adds the canary elements again (see canaries).
func (rd *Renderer) canary(r *renderer, t *tx) {
	for _, e := range r.canaries() {
		t.delElem(e)
		t.addElem(e)
	}
	t.stats.AddedElements -= len(r.canaries())
	t.stats.DeletedElements -= len(r.canaries())
}

// Canary returns a transaction that only deletes and adds the canary
// elements again: it fails when the table or its dispatch maps lost them
// (a sync with nothing to write runs it to check).
func (rd *Renderer) Canary() *Tx {
	t := &tx{}
	rd.canary(newRenderer(rd.cfg, false), t)
	out := rd.tx()
	t.write(out, rd.newTx)
	return out
}

// TextTx returns a transaction of nft -f text written by hand (tests,
// tools): one command per line.
func TextTx(family knftables.Family, text string) *Tx {
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return &Tx{table: string(family) + " " + TableName, text: []byte(text), ops: strings.Count(text, "\n")}
}

// DeleteTable returns a transaction that deletes kproxy's table of family
// whether it exists or not.
func DeleteTable(family knftables.Family) *Tx {
	t := string(family) + " " + TableName
	return &Tx{table: t, text: []byte("add table " + t + "\ndelete table " + t + "\n"), ops: 2}
}

func (rd *Renderer) tx() *Tx {
	return &Tx{table: string(Family(rd.cfg.Family)) + " " + TableName}
}

// writeFixed starts a full transaction: the table, its fixed sets and maps
// (flushed), every chain it holds flushed, and the fixed chains.
func (rd *Renderer) writeFixed(r *renderer, t *tx, in Input, next *Applied) {
	t.head = append(t.head, op{verb: "add", obj: &knftables.Table{Comment: knftables.PtrTo("kproxy: Service proxy rules")}})
	for _, s := range r.fixedSets() {
		obj := s.object()
		if set, ok := obj.(*knftables.Set); ok && s.name == SetPodCIDRs {
			set.AutoMerge = knftables.PtrTo(true)
		}
		t.head = append(t.head, op{verb: "add", obj: obj}, op{verb: "flush", obj: s.flush()})
	}
	if in.Existing != nil {
		for _, c := range in.Existing.Chains {
			t.head = append(t.head, op{verb: "flush", obj: &knftables.Chain{Name: c}})
		}
	}
	for _, c := range r.fixedChains(in.Node) {
		t.chains = append(t.chains, op{verb: "add", obj: c.object()}, op{verb: "flush", obj: &knftables.Chain{Name: c.name}})
		for _, rule := range c.rules {
			t.rules = append(t.rules, op{verb: "add", obj: &knftables.Rule{Chain: c.name, Rule: rule.String()}})
		}
		t.stats.WrittenChains++
		t.stats.WrittenRules += len(c.rules)
		next.rules += len(c.rules)
		next.fixed++
	}
	for _, e := range r.fixedElems(in.Node) {
		t.addElem(e)
	}
}

func (rd *Renderer) wantChain(a *Applied, name string) bool {
	if a.shared.Value(name) > 0 {
		return true
	}
	for _, c := range newRenderer(rd.cfg, a.node.PodSources).fixedChains(a.node) {
		if c.name == name {
			return true
		}
	}
	// A port's own chain: "port-<key>-..." (few: scan the ports that have
	// some).
	if strings.HasPrefix(name, "port-") {
		for _, ap := range a.ports.All() {
			if ap.out != nil && slices.ContainsFunc(ap.out.own, func(c chainDef) bool { return c.name == name }) {
				return true
			}
		}
	}
	return false
}

func (rd *Renderer) wantSet(r *renderer, a *Applied, name string) bool {
	for _, s := range r.fixedSets() {
		if s.name == name {
			return true
		}
	}
	if strings.HasPrefix(name, "aff-") {
		for _, ap := range a.ports.All() {
			if ap.out != nil && slices.ContainsFunc(ap.out.sets, func(s setDef) bool { return s.name == name }) {
				return true
			}
		}
	}
	return false
}

// resolveOwn names the port's own chains: a chain whose rules are what the
// last rendering of the port had under the same role keeps that name;
// another gets a fresh one, so the old chain can be deleted once nothing
// points at it. Verdicts to own chains (by role) in rules and elements
// are replaced by verdicts to the names. It returns the generation
// counter.
func resolveOwn(out, old *portOut, pk string, gen uint64) uint64 {
	names := map[string]string{}
	// rename returns the verdict v to an own chain by role going to the
	// chain's name (nil when v goes elsewhere: verdicts are shared, never
	// changed).
	rename := func(v *nft.Verdict) *nft.Verdict {
		role, ok := strings.CutPrefix(v.Chain, rolePrefix)
		if !ok {
			return nil
		}
		name, ok := names[role]
		if !ok {
			return nil
		}
		return &nft.Verdict{Kind: v.Kind, Chain: name}
	}
	// substRule returns r with its verdicts renamed (r itself when none
	// is: rules share nothing a renaming changes).
	substRule := func(r nft.Rule) nft.Rule {
		var out nft.Rule
		for i, st := range r {
			v, ok := st.(*nft.Verdict)
			if !ok {
				continue
			}
			nv := rename(v)
			if nv == nil {
				continue
			}
			if out == nil {
				out = slices.Clone(r)
			}
			out[i] = nv
		}
		if out == nil {
			return r
		}
		return out
	}
	for i := range out.own {
		c := &out.own[i]
		for j := range c.rules {
			c.rules[j] = substRule(c.rules[j])
		}
		if old != nil {
			for _, oc := range old.own {
				if oc.role == c.role && oc.sameRules(*c) {
					c.name = oc.name
				}
			}
		}
		if c.name == "" {
			gen++
			c.name = fmt.Sprintf("port-%s-%s-%d", pk, c.role, gen)
		}
		names[c.role] = c.name
	}
	for i := range out.elems {
		if v := out.elems[i].verdict; v != nil {
			if nv := rename(v); nv != nil {
				out.elems[i].verdict = nv
			}
		}
	}
	return gen
}

// diffPort writes the operations that take port n from old to out and
// records out.
func (rd *Renderer) diffPort(t *tx, a *Applied, n proxy.ServicePortName, old *appliedPort, p *intent.Port, out *portOut) {
	var oldOut *portOut
	if old != nil {
		oldOut = old.out
	}
	if oldOut == nil {
		oldOut = &portOut{}
	}
	if out == nil {
		out = &portOut{}
	}
	// Own sets and chains new in this rendering.
	oldSets := map[string]bool{}
	for _, s := range oldOut.sets {
		oldSets[s.name] = true
	}
	for _, s := range out.sets {
		if !oldSets[s.name] {
			t.addSet(s)
		}
	}
	oldOwn := map[string]bool{}
	for _, c := range oldOut.own {
		oldOwn[c.name] = true
	}
	newOwn := map[string]bool{}
	for _, c := range out.own {
		newOwn[c.name] = true
		if !oldOwn[c.name] {
			t.addChain(c)
			a.rules += len(c.rules)
		}
	}
	// Shared chains are counted here and written once every port is done
	// (finishShared): one port may give up a chain another now needs.
	for _, c := range out.shared {
		a.shared.Set(c.name, a.shared.Value(c.name)+1)
		a.defs.Set(c.name, c)
		t.touchShared(c.name)
	}
	// Elements.
	if len(oldOut.elems) == 0 {
		for _, e := range out.elems {
			t.addElem(e)
		}
	} else {
		// The old elements by id (their index).
		oldElems := make(map[Elem]int, len(oldOut.elems))
		for i, e := range oldOut.elems {
			oldElems[e.id()] = i
		}
		newElems := make(map[Elem]bool, len(out.elems))
		for _, e := range out.elems {
			newElems[e.id()] = true
			if i, ok := oldElems[e.id()]; ok {
				o := &oldOut.elems[i]
				if o.sameValue(&e) {
					continue
				}
				t.delElem(*o)
			}
			t.addElem(e)
		}
		for _, e := range oldOut.elems {
			if !newElems[e.id()] {
				t.delElem(e)
			}
		}
	}
	// Hairpin addresses: a set shared by every port, counted and written
	// once every port is done.
	for _, h := range oldOut.hairpin {
		if n := a.hairpin.Value(h) - 1; n > 0 {
			a.hairpin.Set(h, n)
		} else {
			a.hairpin.Delete(h)
		}
		t.touchHairpin(h)
	}
	for _, h := range out.hairpin {
		a.hairpin.Set(h, a.hairpin.Value(h)+1)
		t.touchHairpin(h)
	}
	// What nothing points at any more: a port's own chains in reverse
	// order (each points only at chains before it).
	for _, c := range slices.Backward(oldOut.own) {
		if !newOwn[c.name] {
			t.delChain(c.name)
			a.rules -= len(c.rules)
		}
	}
	for _, c := range oldOut.shared {
		if n := a.shared.Value(c.name) - 1; n > 0 {
			a.shared.Set(c.name, n)
		} else {
			a.shared.Delete(c.name)
		}
		t.touchShared(c.name)
	}
	a.own += len(out.own) - len(oldOut.own)
	newSets := map[string]bool{}
	for _, s := range out.sets {
		newSets[s.name] = true
	}
	for _, s := range oldOut.sets {
		if !newSets[s.name] {
			t.delSets = append(t.delSets, op{verb: "delete", obj: &knftables.Set{Name: s.name}})
		}
	}
	if p == nil {
		a.ports.Delete(n)
		return
	}
	a.ports.Set(n, &appliedPort{in: p, out: out})
}

// finish writes the shared chains a first reference needs and deletes those
// nothing refers to any more, and updates the hairpin set, now that every
// port is done. A partial render looks only at the chains and addresses
// its ports counted (t.touched*), a full one at every one.
func (rd *Renderer) finish(t *tx, last, next *Applied, full bool) {
	var oldShared *pmap.Map[string, int]
	var oldHairpin *pmap.Map[netip.Addr, int]
	var shared, gone []string
	var hairpins []netip.Addr
	if !full && last != nil {
		oldShared, oldHairpin = last.shared, last.hairpin
		shared = slices.Sorted(maps.Keys(t.touchedShared))
		gone = shared
		hairpins = slices.SortedFunc(maps.Keys(t.touchedHairpin), netip.Addr.Compare)
	} else {
		shared = slices.Collect(next.shared.Keys())
		hairpins = slices.Collect(next.hairpin.Keys())
	}
	for _, name := range shared {
		if oldShared.Value(name) == 0 && next.shared.Value(name) > 0 {
			c := next.defs.Value(name)
			t.addChain(c)
			next.rules += len(c.rules)
		}
	}
	// The route chains (masq-, split-) point at the DNAT chains: delete
	// them first.
	gone = slices.Clone(gone)
	slices.SortFunc(gone, func(a, b string) int {
		return cmp.Or(cmp.Compare(b2i(strings.HasPrefix(a, "dnat-")), b2i(strings.HasPrefix(b, "dnat-"))), cmp.Compare(a, b))
	})
	for _, name := range gone {
		if oldShared.Value(name) > 0 && next.shared.Value(name) == 0 {
			t.delChain(name)
			next.rules -= len(last.defs.Value(name).rules)
			next.defs.Delete(name)
		}
	}
	for _, h := range hairpins {
		if oldHairpin.Value(h) == 0 && next.hairpin.Value(h) > 0 {
			t.addElem(hairpinElem(h))
		}
	}
	for _, h := range hairpins {
		if oldHairpin.Value(h) > 0 && next.hairpin.Value(h) == 0 {
			t.delElem(hairpinElem(h))
		}
	}
}

func (t *tx) touchShared(name string) {
	if t.touchedShared == nil {
		t.touchedShared = map[string]struct{}{}
	}
	t.touchedShared[name] = struct{}{}
}

func (t *tx) touchHairpin(h netip.Addr) {
	if t.touchedHairpin == nil {
		t.touchedHairpin = map[netip.Addr]struct{}{}
	}
	t.touchedHairpin[h] = struct{}{}
}

// ElementTx returns a transaction of element operations on family's
// kproxy table, in the order a render writes them: flushes first (a
// transaction with one is not element-only: see Tx.Elements), then
// deletions, then additions.
func ElementTx(family knftables.Family, ops []ElemOp) *Tx {
	t := &tx{}
	for _, o := range ops {
		switch {
		case o.Flush:
			t.head = append(t.head, op{verb: "flush", obj: o.set.object()})
		case o.Delete:
			t.delElem(o.Elem)
		default:
			t.addElem(o.Elem)
		}
	}
	out := &Tx{table: string(family) + " " + TableName}
	t.write(out, func() *knftables.Transaction { return knftables.NewFake(family, TableName).NewTransaction() })
	return out
}
