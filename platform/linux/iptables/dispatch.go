package iptables

import (
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// dispatch is one dispatch chain (KPROXY-SERVICES or KPROXY-NODEPORTS) and
// its shards. Each service port contributes entries with a shard key; in flat
// mode every entry is a rule of the parent chain, in sharded mode the parent
// holds one jump per non-empty shard and each shard chain holds its entries.
// Shards keep a partial sync's rewrite small: adding a Service rewrites one
// shard of a few dozen rules, never a chain of every Service.
type dispatch struct {
	parent string
	// committed state
	sharded bool
	count   int
	members map[uint16]map[proxy.ServicePortName]struct{}
	// dirty keys of this sync
	dirty map[uint16]bool
}

// clone copies the dispatch (its member sets too).
func (d *dispatch) clone() *dispatch {
	c := *d
	c.members = make(map[uint16]map[proxy.ServicePortName]struct{}, len(d.members))
	for k, m := range d.members {
		c.members[k] = maps.Clone(m)
	}
	c.dirty = maps.Clone(d.dirty)
	return &c
}

func newDispatch(parent string) *dispatch {
	return &dispatch{parent: parent, members: map[uint16]map[proxy.ServicePortName]struct{}{}, dirty: map[uint16]bool{}}
}

func (d *dispatch) add(name proxy.ServicePortName, key uint16) {
	m := d.members[key]
	if m == nil {
		m = map[proxy.ServicePortName]struct{}{}
		d.members[key] = m
	}
	m[name] = struct{}{}
	d.count++
	d.dirty[key] = true
}

func (d *dispatch) remove(name proxy.ServicePortName, key uint16) {
	if m := d.members[key]; m != nil {
		delete(m, name)
		if len(m) == 0 {
			delete(d.members, key)
		}
	}
	d.count--
	d.dirty[key] = true
}

// shardName names the chain of a shard.
func (d *dispatch) shardName(key uint16) string {
	if d.parent == ChainServices {
		const hex = "0123456789ABCDEF"
		return shardServices + string([]byte{hex[key>>4&0xf], hex[key&0xf]})
	}
	proto := [...]string{"TCP", "UDP", "SCTP"}[key>>10]
	return shardNodePorts + proto + "-" + strconv.Itoa(int(key&0x3ff))
}

// shardMatch renders the parent's match for a shard.
func (d *dispatch) shardMatch(key uint16, is6 bool) string {
	if d.parent == ChainServices {
		b := strconv.Itoa(int(key))
		if is6 {
			b = strconv.FormatUint(uint64(key), 16)
			if key == 0 {
				return "-d ::/::ff"
			}
			return "-d ::" + b + "/::ff"
		}
		return "-d 0.0.0." + b + "/0.0.0.255"
	}
	proto := strings.ToLower([...]string{"TCP", "UDP", "SCTP"}[key>>10])
	lo := int(key&0x3ff) << 6
	return "-p " + proto + " -m " + proto + " --dport " + strconv.Itoa(lo) + ":" + strconv.Itoa(lo+63)
}

// decideMode shards the chain when it has more than threshold entries
// (never when threshold is negative) and reports whether the mode changed.
// The mode is a function of the count alone, so a plan depends only on the
// snapshot, never on the history that led to it.
func (d *dispatch) decideMode(threshold int) bool {
	want := threshold >= 0 && d.count > threshold
	changed := want != d.sharded
	d.sharded = want
	return changed
}

func sortedKeys(m map[uint16]map[proxy.ServicePortName]struct{}) []uint16 {
	keys := make([]uint16, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedNames(m map[proxy.ServicePortName]struct{}) []proxy.ServicePortName {
	out := make([]proxy.ServicePortName, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b proxy.ServicePortName) int {
		switch {
		case a.Less(b):
			return -1
		case b.Less(a):
			return 1
		}
		return 0
	})
	return out
}

// writeDispatch decides each dispatch chain's mode and writes the shards
// that changed. The parents are written by writeBase.
func (p *planning) writeDispatch(w *planWriter, full bool) (modeChanged [2]bool) {
	for i, d := range p.disp {
		modeChanged[i] = d.decideMode(p.cfg.ShardThreshold)
		if !d.sharded {
			if modeChanged[i] {
				var shards []string
				for name := range p.believed[0] {
					if isShardOf(d, name) {
						shards = append(shards, name)
					}
				}
				sort.Strings(shards)
				for _, name := range shards {
					p.drop(w, 0, name)
				}
			}
			continue
		}
		var keys []uint16
		if modeChanged[i] || full {
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
				p.drop(w, 0, name)
				continue
			}
			b := &builder{chain: name}
			p.addEntries(b, sortedNames(m), i, func(e entry) bool { return e.key == k })
			p.emit(w, 0, b.out())
		}
	}
	return modeChanged
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
func (p *planning) dispatchBody(b *builder, d *dispatch) {
	di := dispatchIndex(d)
	if d.sharded {
		for _, k := range sortedKeys(d.members) {
			b.add(d.shardMatch(k, p.cfg.Is6()), "-j", d.shardName(k))
		}
		return
	}
	all := map[proxy.ServicePortName]struct{}{}
	for _, m := range d.members {
		for n := range m {
			all[n] = struct{}{}
		}
	}
	p.addEntries(b, sortedNames(all), di, func(entry) bool { return true })
}

// addEntries adds the entries of dispatch table di that match, of the ports
// names in order: first every ClusterIP entry, then every external one (an
// external frontend never shadows a ClusterIP, whatever the names).
func (p *planning) addEntries(b *builder, names []proxy.ServicePortName, di int, match func(entry) bool) {
	for _, external := range []bool{false, true} {
		for _, n := range names {
			for _, e := range p.ports[n].entries {
				if e.disp == di && e.external == external && match(e) {
					b.add(e.spec)
				}
			}
		}
	}
}
