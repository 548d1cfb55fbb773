package nft

import (
	"fmt"
	"strings"
)

// Type is the type of the values an expression yields: it says how the
// constants compared with it are written and read.
type Type uint8

const (
	TypeAddr     Type = iota // an address (ip saddr)
	TypeProto                // a protocol (meta l4proto)
	TypePort                 // a port (th dport)
	TypeMark                 // the packet mark
	TypeIface                // an interface name
	TypeFibType              // an address type (fib daddr type)
	TypeNum                  // a number (numgen, jhash)
	TypeCTState              // a ct state
	TypeCTStatus             // ct status flags
)

// Expr is an expression that reads a value from a packet (or draws one).
// Its dynamic type is one of the pointer types below; an expression is
// identified by its pointer (the tracer keys numgen inc counters so).
type Expr interface {
	String() string
	Type() Type
}

// Payload reads a header field: Base is "ip" or "ip6" (Field "saddr",
// "daddr"), or "th", "tcp", "udp", "sctp" (Field "dport", "sport"; "th"
// reads any transport header, the others only their protocol's).
type Payload struct{ Base, Field string }

func (p *Payload) String() string { return p.Base + " " + p.Field }

// Type is TypeAddr for an address field, TypePort otherwise.
func (p *Payload) Type() Type {
	if p.Field == "saddr" || p.Field == "daddr" {
		return TypeAddr
	}
	return TypePort
}

// Meta reads packet metadata: Key is "l4proto", "mark", "iifname" or
// "oifname" (the interface names are written without "meta").
type Meta struct{ Key string }

func (m *Meta) String() string {
	if m.Key == "iifname" || m.Key == "oifname" {
		return m.Key
	}
	return "meta " + m.Key
}

func (m *Meta) Type() Type {
	switch m.Key {
	case "l4proto":
		return TypeProto
	case "mark":
		return TypeMark
	}
	return TypeIface
}

// Fib looks up the type of the packet's source or destination address
// (Addr "saddr" or "daddr").
type Fib struct{ Addr string }

func (f *Fib) String() string { return "fib " + f.Addr + " type" }
func (f *Fib) Type() Type     { return TypeFibType }

// Numgen draws a number in [Offset, Offset+Mod): Mode "random" draws at
// random, "inc" counts up (a counter per expression).
type Numgen struct {
	Mode        string
	Mod, Offset uint64
}

func (n *Numgen) String() string {
	s := fmt.Sprintf("numgen %s mod %d", n.Mode, n.Mod)
	if n.Offset != 0 {
		s += fmt.Sprintf(" offset %d", n.Offset)
	}
	return s
}

func (n *Numgen) Type() Type { return TypeNum }

// Jhash hashes the value of Of with Seed into [Offset, Offset+Mod).
type Jhash struct {
	Of          Expr
	Mod, Offset uint64
	Seed        uint32
}

func (j *Jhash) String() string {
	s := fmt.Sprintf("jhash %s mod %d seed %s", j.Of, j.Mod, Hex32(j.Seed))
	if j.Offset != 0 {
		s += fmt.Sprintf(" offset %d", j.Offset)
	}
	return s
}

func (j *Jhash) Type() Type { return TypeNum }

// CT reads the packet's connection: Key "state" or "status".
type CT struct{ Key string }

func (c *CT) String() string { return "ct " + c.Key }

func (c *CT) Type() Type {
	if c.Key == "status" {
		return TypeCTStatus
	}
	return TypeCTState
}

// Concat writes a concatenation of expressions ("ip daddr . th dport").
func Concat(es []Expr) string {
	if len(es) == 1 {
		return es[0].String()
	}
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return strings.Join(parts, " . ")
}
