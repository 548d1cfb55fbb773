package model

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// SameRule reports whether two rules are the same rule as values: the same
// statements, expressions and operators, constants equal as values (a
// number whatever its name or digits: "tcp" is 6, "0x00004000" is 16384),
// and the members of an anonymous set equal as a set, in any order (a set
// of addresses and prefixes as the addresses it covers: nft lists such a
// set sorted and merged).
func SameRule(a, b nft.Rule) bool {
	return slices.EqualFunc(a, b, sameStmt)
}

func sameStmt(a, b nft.Stmt) bool {
	switch x := a.(type) {
	case *nft.Match:
		y, ok := b.(*nft.Match)
		return ok && sameExprs(x.Left, y.Left) && (x.Mask == nil) == (y.Mask == nil) && (x.Mask == nil || SameValue(*x.Mask, *y.Mask)) &&
			opOf(x) == opOf(y) && x.Set == y.Set && x.Anon == y.Anon && sameRight(x, y)
	case *nft.Verdict:
		y, ok := b.(*nft.Verdict)
		return ok && *x == *y
	case *nft.VMap:
		y, ok := b.(*nft.VMap)
		return ok && x.Map == y.Map && sameExprs(x.Key, y.Key)
	case *nft.DNAT:
		y, ok := b.(*nft.DNAT)
		return ok && x.Family == y.Family && x.Addr == y.Addr && x.Port == y.Port && x.Map == y.Map && sameExprs(x.Key, y.Key)
	case *nft.Masquerade:
		y, ok := b.(*nft.Masquerade)
		return ok && slices.Equal(x.Flags, y.Flags)
	case *nft.Reject:
		y, ok := b.(*nft.Reject)
		return ok && *x == *y
	case *nft.MarkSet:
		y, ok := b.(*nft.MarkSet)
		return ok && x.Op == y.Op && SameValue(x.Val, y.Val)
	case *nft.Update:
		y, ok := b.(*nft.Update)
		return ok && x.Set == y.Set && reflect.DeepEqual(x.Key, y.Key)
	case *nft.Opaque:
		y, ok := b.(*nft.Opaque)
		return ok && *x == *y
	}
	return false
}

// sameExprs compares expressions as values (their fields, not their
// pointers).
func sameExprs(a, b []nft.Expr) bool {
	return slices.EqualFunc(a, b, func(x, y nft.Expr) bool { return reflect.DeepEqual(x, y) })
}

// sameRight compares the constants of two matches of the same kind: one
// constant, or an anonymous set's members in any order.
func sameRight(x, y *nft.Match) bool {
	if !x.Anon {
		return slices.EqualFunc(x.Right, y.Right, SameKey)
	}
	if xs, ok := coverage(x.Right); ok {
		ys, ok := coverage(y.Right)
		return ok && slices.Equal(xs, ys)
	}
	return slices.Equal(keyIDs(x.Right), keyIDs(y.Right))
}

// keyIDs writes keys as values compare (numbers as numbers), sorted and
// without duplicates.
func keyIDs(ks []nft.Key) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = indexKey(k)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// coverage returns the addresses keys of one address or prefix each cover,
// as the fewest prefixes, sorted (ok false when a key is anything else).
func coverage(ks []nft.Key) ([]netip.Prefix, bool) {
	ps := make([]netip.Prefix, 0, len(ks))
	for _, k := range ks {
		if len(k) != 1 {
			return nil, false
		}
		switch v := k[0]; v.Kind {
		case nft.KindAddr:
			ps = append(ps, netip.PrefixFrom(v.Addr, v.Addr.BitLen()))
		case nft.KindPrefix:
			ps = append(ps, v.Prefix)
		default:
			return nil, false
		}
	}
	return mergePrefixes(ps), true
}

// Coverage writes the addresses an interval set's elements cover, merged
// into the fewest prefixes, sorted, joined with ", " (ok false when an
// element is not one address or prefix).
func Coverage(s *Set) (string, bool) {
	ks := make([]nft.Key, 0, len(s.Elements))
	for _, e := range s.Elements {
		ks = append(ks, e.Key)
	}
	ps, ok := coverage(ks)
	if !ok {
		return "", false
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = prefixValue(p).String()
	}
	return strings.Join(out, ", "), true
}

// SameKey reports whether two keys are equal as values.
func SameKey(a, b nft.Key) bool { return slices.EqualFunc(a, b, SameValue) }

// SameValue reports whether two constants are equal as values: numbers by
// their number (whatever their name or digits), addresses, prefixes and
// words by what they are.
func SameValue(a, b nft.Value) bool {
	if a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case nft.KindNum:
		return a.Num == b.Num
	case nft.KindAddr:
		return a.Addr == b.Addr
	case nft.KindPrefix:
		return a.Prefix.Masked() == b.Prefix.Masked()
	}
	return a.Str == b.Str
}

// SameElem reports whether two elements are equal as values: key, and
// data or verdict.
func SameElem(a, b nft.Elem) bool {
	return SameKey(a.Key, b.Key) && SameKey(a.Data, b.Data) && (a.Verdict == nil) == (b.Verdict == nil) && (a.Verdict == nil || *a.Verdict == *b.Verdict)
}
