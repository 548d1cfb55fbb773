package model

// The parsed form of a rule: the items the parser (parse.go) makes of its
// text and the evaluator (eval.go) runs.

import (
	"net/netip"
)

// item is one expression of a rule, evaluated in order: a match (cond), a
// statement (mark, update) or a terminal (verdict, vmap, dnat, masquerade,
// reject).
type item interface{ String() string }

// typ is the type of an expression's value.
type vtype uint8

const (
	tAddr vtype = iota
	tProto
	tPort
	tMark
	tIface
	tFibType
	tNum
	tCTState
	tCTStatus
)

// expr is one primary expression.
type expr struct {
	text string
	typ  vtype
	// what it reads
	kind string // "saddr", "daddr", "l4proto", "dport", "sport", "mark", "iifname", "oifname", "fib-saddr", "fib-daddr", "numgen", "jhash", "ctstate", "ctstatus"
	// proto: for "tcp dport" and the like, the protocol whose header is
	// read ("" for th).
	proto string
	// numgen and jhash
	gen      string // "random", "inc"
	mod, off uint64
	seed     uint32
	hashOf   *expr
}

// cond is a match: exprs (a concatenation) against a right-hand side.
type cond struct {
	text  string
	exprs []*expr
	op    string // "==", "!=", "<", "<=", ">", ">=", "flag" (the bits are set)
	mask  *uint64
	// the right-hand side: one of set (named), list (anonymous set or one
	// constant)
	set  string
	list [][]kval
}

func (c *cond) String() string { return c.text }

type verdictItem struct {
	kind  string // "jump", "goto", "return", "drop", "accept"
	chain string
}

func (v *verdictItem) String() string {
	if v.chain != "" {
		return v.kind + " " + v.chain
	}
	return v.kind
}

type vmapItem struct {
	text  string
	exprs []*expr
	set   string
}

func (v *vmapItem) String() string { return v.text }

type dnatItem struct {
	text string
	// constant target
	to     netip.Addr
	toPort uint16
	// or a data map lookup
	exprs   []*expr
	mapName string
}

func (d *dnatItem) String() string { return d.text }

type masqItem struct{ text string }

// opaqueItem is a rule that could not be read (see Opaque): a branch that
// reaches it ends there, its fate unknown.
type opaqueItem struct{ text string }

func (o *opaqueItem) String() string { return o.text }

func (m *masqItem) String() string { return m.text }

type rejectItem struct{ text, with string }

func (r *rejectItem) String() string { return r.text }

type markItem struct {
	text string
	op   string // "=", "|", "^", "&"
	val  uint32
}

func (m *markItem) String() string { return m.text }

type updateItem struct {
	text string
	set  string
	expr *expr
}

func (u *updateItem) String() string { return u.text }
