// Package nft is kproxy's nftables vocabulary as typed values: the
// constants rules compare with and set elements hold (Value, Key), the
// expressions that read a packet (Expr), the statements a rule is made of
// (Stmt), rules (Rule), element values and base chain specs. It covers
// exactly the forms kproxy's renderer writes and its tracer evaluates.
//
// The String methods are the one writer of their text: a value built here
// and written with String is what nft -f receives, and the Fake's reader
// (nftables/model, standing for nft) reads that text back into the same
// values; the tracer and the drift check work on the values alone. The package
// imports nothing of kproxy's, so the renderer may use it (test/layout:
// renderers import no model or tracer package).
package nft

import (
	"net/netip"
	"strconv"
)

// Kind says which field of a Value holds it.
type Kind uint8

const (
	// KindNum is a number (Num). A protocol or a ct status flag has a
	// name too (Str), written instead of the number.
	KindNum Kind = iota
	// KindAddr is an address (Addr).
	KindAddr
	// KindPrefix is a prefix (Prefix).
	KindPrefix
	// KindName is a bare word nft knows (Str): a ct state, a fib address
	// type.
	KindName
	// KindString is a quoted string (Str): an interface name.
	KindString
)

// Value is one constant: a part of a set element's key or value, or the
// right-hand side of a match.
type Value struct {
	Kind   Kind
	Num    uint64
	Addr   netip.Addr
	Prefix netip.Prefix
	// Str is KindName's word, KindString's text, or KindNum's name.
	Str string
	// Hex, for KindNum without a name, writes the number in hexadecimal
	// with at least this many digits ("0x00004000"); 0 writes it in
	// decimal.
	Hex uint8
}

// Num returns a number written in decimal.
func Num(n uint64) Value { return Value{Kind: KindNum, Num: n} }

// Hex32 returns a 32-bit number written as 0x and eight hex digits (marks,
// masks, seeds).
func Hex32(n uint32) Value { return Value{Kind: KindNum, Num: uint64(n), Hex: 8} }

// Addr returns an address.
func Addr(a netip.Addr) Value { return Value{Kind: KindAddr, Addr: a} }

// Prefix returns a prefix.
func Prefix(p netip.Prefix) Value { return Value{Kind: KindPrefix, Prefix: p} }

// Name returns a bare word (a ct state, a fib address type).
func Name(s string) Value { return Value{Kind: KindName, Str: s} }

// Quoted returns a string written quoted (an interface name; a trailing
// "*" matches by prefix).
func Quoted(s string) Value { return Value{Kind: KindString, Str: s} }

// Named returns a number written as its name.
func Named(name string, n uint64) Value { return Value{Kind: KindNum, Num: n, Str: name} }

// Proto returns a protocol by its name ("tcp"); ok is false for a name
// not in Protocols.
func Proto(name string) (Value, bool) {
	n, ok := Protocols[name]
	return Named(name, n), ok
}

// Protocols are the protocols kproxy names, by name.
var Protocols = map[string]uint64{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}

// CTStatusBits are the ct status flags kproxy names (IPS_* of the
// kernel).
var CTStatusBits = map[string]uint64{"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8, "snat": 0x10, "dnat": 0x20, "dying": 0x200}

// CTStates are the ct states.
var CTStates = []string{"invalid", "established", "related", "new", "untracked"}

// FibTypes are the address types fib reports.
var FibTypes = []string{"unspec", "unicast", "local", "broadcast", "anycast", "multicast", "blackhole", "unreachable", "prohibit", "throw", "nat", "xresolve"}

// CTStatus returns a ct status flag by its name; ok is false for a name
// not in CTStatusBits.
func CTStatus(name string) (Value, bool) {
	n, ok := CTStatusBits[name]
	return Named(name, n), ok
}

func (v Value) String() string { return string(v.Append(nil)) }

// Append appends the value's text (what String returns) to b.
func (v Value) Append(b []byte) []byte {
	switch v.Kind {
	case KindNum:
		switch {
		case v.Str != "":
			return append(b, v.Str...)
		case v.Hex > 0:
			b = append(b, "0x"...)
			for d := hexDigits(v.Num); d < int(v.Hex); d++ {
				b = append(b, '0')
			}
			return strconv.AppendUint(b, v.Num, 16)
		}
		return strconv.AppendUint(b, v.Num, 10)
	case KindAddr:
		return v.Addr.AppendTo(b)
	case KindPrefix:
		return v.Prefix.AppendTo(b)
	case KindString:
		return strconv.AppendQuote(b, v.Str)
	}
	return append(b, v.Str...)
}

// hexDigits counts the hexadecimal digits of n (1 for 0).
func hexDigits(n uint64) int {
	d := 1
	for n >= 16 {
		n >>= 4
		d++
	}
	return d
}

// Key is a concatenation of values: a set element's key, a data map
// element's value, one member of an anonymous set.
type Key []Value

// String writes the parts joined by " . ".
func (k Key) String() string { return string(k.Append(nil)) }

// Append appends the key's text (what String returns) to b.
func (k Key) Append(b []byte) []byte {
	for i, v := range k {
		if i > 0 {
			b = append(b, " . "...)
		}
		b = v.Append(b)
	}
	return b
}
