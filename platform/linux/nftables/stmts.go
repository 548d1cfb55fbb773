package nftables

import (
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// The building blocks of kproxy's rules, as typed values (package nft
// writes their text). A statement in a rule is never changed afterwards
// (resolveOwn replaces a verdict by a new one), so rules may share them.

// field reads an address field of the family's header ("ip saddr").
func (f fam) field(name string) *nft.Payload { return &nft.Payload{Base: f.ip, Field: name} }

// dport reads the destination port of proto's header ("tcp dport", "th
// dport").
func dport(proto string) *nft.Payload { return &nft.Payload{Base: proto, Field: "dport"} }

func l4proto() *nft.Meta { return &nft.Meta{Key: "l4proto"} }

// nftProto is a protocol by its name ("tcp").
func nftProto(name string) nft.Value {
	v, _ := nft.Proto(name)
	return v
}

// eq matches e against one constant ("meta l4proto tcp").
func eq(e nft.Expr, v nft.Value) *nft.Match {
	return &nft.Match{Left: []nft.Expr{e}, Right: []nft.Key{{v}}}
}

// ne matches e against anything but one constant ("ip daddr != ::1").
func ne(e nft.Expr, v nft.Value) *nft.Match {
	m := eq(e, v)
	m.Op = nft.OpNe
	return m
}

// inSet matches a concatenation against the named set ("ip daddr
// @nodeport-ips").
func inSet(set string, es ...nft.Expr) *nft.Match { return &nft.Match{Left: es, Set: set} }

// fibType matches the address type of the source or destination ("fib
// saddr type local").
func fibType(addr, typ string) *nft.Match { return eq(&nft.Fib{Addr: addr}, nft.Name(typ)) }

// verdict returns a copy of v to put in a rule.
func verdict(v nft.Verdict) *nft.Verdict { return &v }

// rulesText writes rules one a line (the text a split chain's name
// hashes).
func rulesText(rs []nft.Rule) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, "\n")
}
