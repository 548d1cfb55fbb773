package nftables

import "sigs.k8s.io/knftables"

// A full transaction holds every element of the table: at 10,000 Services
// with 10 endpoints each, some 110,000, which nft parses and evaluates one
// by one (about 3 s of a 3.5 s full sync on this project's machine). Over
// netlink the same elements take a fraction of that. Split divides a full
// transaction into what nft -f writes (the table, sets, chains and rules,
// and the elements of the sets nlbatch.go does not encode), one netlink
// batch that flushes the encoded sets and fills them again, and a last
// nft -f that deletes what nothing wants any more. Each part is atomic;
// between them the table is consistent:
//
//   - after the first part, the encoded sets still hold the previous
//     elements, and every chain they point at is still there (the chains
//     no longer wanted are neither flushed nor deleted yet; a wanted one is
//     written again under its name, whose rules are a function of it);
//   - the batch replaces the elements in one step;
//   - only then are the chains and sets nothing points at deleted.
//
// A failure in any part fails the sync (the next one is full again), and
// the first one changes nothing. What differs from one transaction: the
// fixed chains' new rules (a changed node fact, e.g. another NodePort
// address) apply a moment before the new elements.

// Split returns a full rendered transaction in the three parts above (post
// may have no operations). ok is false when t is not a full transaction
// of a renderer or has no element to move.
func (t *Tx) Split() (pre *Tx, bulk []ElemOp, post *Tx, ok bool) {
	src := t.src
	if src == nil || !src.full || len(src.delElems) > 0 {
		return nil, nil, nil, false
	}
	stale := map[string]bool{}
	for _, o := range src.delChains {
		stale[o.obj.(*knftables.Chain).Name] = true
	}
	bulk = make([]ElemOp, 0, len(src.head)+len(src.addElems))
	p := &tx{full: true, chains: src.chains, rules: src.rules}
	q := &tx{delChains: src.delChains, delSets: src.delSets}
	for _, o := range src.head {
		if o.verb == "flush" {
			switch obj := o.obj.(type) {
			case *knftables.Chain:
				// A wanted chain is flushed where it is written again; one
				// no longer wanted only right before its deletion.
				if stale[obj.Name] {
					q.head = append(q.head, o)
				}
				continue
			case *knftables.Set:
				if f, err := FlushOp(obj.Name); err == nil {
					bulk = append(bulk, f)
					continue
				}
			case *knftables.Map:
				if f, err := FlushOp(obj.Name); err == nil {
					bulk = append(bulk, f)
					continue
				}
			}
		}
		p.head = append(p.head, o)
	}
	moved := 0
	for _, e := range src.addElems {
		if e.set.encodable() {
			bulk = append(bulk, ElemOp{Elem: e})
			moved++
			continue
		}
		p.addElems = append(p.addElems, e)
	}
	if moved == 0 {
		return nil, nil, nil, false
	}
	pre, post = &Tx{table: t.table}, &Tx{table: t.table}
	p.write(pre, t.newTx)
	q.write(post, t.newTx)
	return pre, bulk, post, true
}
