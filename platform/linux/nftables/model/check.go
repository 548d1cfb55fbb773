package model

// The checker: what the tracer models of the typed values of package nft.
// A rule is checked however it was made (read from nft -f text by the
// Fake, built from the kernel's JSON by ParseJSON, or by a test): a form
// outside it is an error, never a statement silently evaluated as
// something else.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// checkRule checks rule r of a table of family ip ("ip" or "ip6").
func checkRule(ip string, r nft.Rule) error {
	if len(r) == 0 {
		return errors.New("empty rule")
	}
	for i, st := range r {
		if i > 0 && nft.Terminal(r[i-1]) {
			return fmt.Errorf("%q after the verdict %q", r[i:], r[i-1])
		}
		if err := checkStmt(ip, st, len(r) == 1); err != nil {
			return err
		}
	}
	return nil
}

func checkStmt(ip string, st nft.Stmt, alone bool) error {
	switch x := st.(type) {
	case *nft.Match:
		return checkMatch(ip, x)
	case *nft.Verdict:
		return checkVerdict(x)
	case *nft.VMap:
		if x.Map == "" {
			return errors.New("vmap: only named maps (@name) are modelled")
		}
		return checkExprs(ip, x.Key)
	case *nft.DNAT:
		if x.Family != "" && x.Family != ip {
			return fmt.Errorf("dnat %s in an %s table", x.Family, ip)
		}
		if x.Map != "" {
			return checkExprs(ip, x.Key)
		}
		if !x.Addr.IsValid() || x.Addr.Is6() != (ip == "ip6") || x.Addr.Is4In6() || x.Addr.Zone() != "" {
			return fmt.Errorf("dnat to %s in an %s table", x.Addr, ip)
		}
		return nil
	case *nft.Masquerade:
		for _, f := range x.Flags {
			if !slices.Contains([]string{"fully-random", "random", "persistent"}, f) {
				return fmt.Errorf("masquerade %s not modelled", f)
			}
		}
		return nil
	case *nft.Reject:
		fam, typ, _ := strings.Cut(x.With, " type ")
		if x.With == "" || x.With == "tcp reset" || (typ != "" && !strings.Contains(typ, " ") && slices.Contains([]string{"icmp", "icmpv6", "icmpx"}, fam)) {
			return nil
		}
		return fmt.Errorf("reject with %q not modelled", x.With)
	case *nft.MarkSet:
		if !slices.Contains([]string{"", "|", "^", "&"}, x.Op) {
			return fmt.Errorf("meta mark set meta mark %q not modelled", x.Op)
		}
		if x.Val.Kind != nft.KindNum || x.Val.Num > 0xffffffff {
			return fmt.Errorf("mark value %s", x.Val)
		}
		return nil
	case *nft.Update:
		if x.Set == "" || x.Key == nil {
			return errors.New("update: want @set { expression }")
		}
		if x.Key.Type() != nft.TypeAddr {
			return fmt.Errorf("update @%s { %s }: only addresses modelled", x.Set, x.Key)
		}
		return checkExpr(ip, x.Key)
	case *nft.Opaque:
		if !alone {
			return errors.New("an opaque statement in a rule of others")
		}
		return nil
	case nil:
		return errors.New("no statement")
	}
	return fmt.Errorf("statement %q not modelled", st)
}

func checkVerdict(v *nft.Verdict) error {
	switch v.Kind {
	case "jump", "goto":
		if v.Chain == "" || strings.ContainsAny(v.Chain, " \t") {
			return fmt.Errorf("%s without a chain", v.Kind)
		}
		return nil
	case "accept", "drop", "return":
		if v.Chain == "" {
			return nil
		}
	}
	return fmt.Errorf("verdict %q not modelled", v)
}

func checkExprs(ip string, es []nft.Expr) error {
	if len(es) == 0 {
		return errors.New("no expression")
	}
	for _, e := range es {
		if err := checkExpr(ip, e); err != nil {
			return err
		}
	}
	return nil
}

func checkExpr(ip string, e nft.Expr) error {
	switch x := e.(type) {
	case *nft.Payload:
		switch {
		case (x.Base == "ip" || x.Base == "ip6") && (x.Field == "saddr" || x.Field == "daddr"):
			if x.Base != ip {
				return fmt.Errorf("%s expression in an %s table", x.Base, ip)
			}
			return nil
		case slices.Contains([]string{"th", "tcp", "udp", "sctp"}, x.Base) && (x.Field == "dport" || x.Field == "sport"):
			return nil
		}
	case *nft.Meta:
		if slices.Contains([]string{"l4proto", "mark", "iifname", "oifname"}, x.Key) {
			return nil
		}
	case *nft.Fib:
		if x.Addr == "saddr" || x.Addr == "daddr" {
			return nil
		}
	case *nft.Numgen:
		if (x.Mode == "random" || x.Mode == "inc") && x.Mod > 0 && x.Mod <= 1<<32 && x.Offset < 1<<32 {
			return nil
		}
	case *nft.Jhash:
		if x.Of == nil || x.Of.Type() != nft.TypeAddr {
			return fmt.Errorf("jhash of %v: only an address is modelled", x.Of)
		}
		if x.Mod < 2 || x.Mod > 1<<32 || x.Offset >= 1<<32 {
			return fmt.Errorf("jhash modulus %d offset %d not modelled", x.Mod, x.Offset)
		}
		return checkExpr(ip, x.Of)
	case *nft.CT:
		if x.Key == "state" || x.Key == "status" {
			return nil
		}
	case nil:
		return errors.New("no expression")
	}
	return fmt.Errorf("expression %q not modelled", e)
}

// checkMatch checks a match's operator and constants against its
// expressions' types.
func checkMatch(ip string, m *nft.Match) error {
	if err := checkExprs(ip, m.Left); err != nil {
		return err
	}
	typ := m.Left[0].Type()
	if m.Mask != nil {
		if len(m.Left) != 1 || (typ != nft.TypeMark && typ != nft.TypeCTStatus && typ != nft.TypeNum) {
			return fmt.Errorf("%q: & on %s not modelled", m, m.Left[0])
		}
		if err := checkConst(ip, typ, *m.Mask); err != nil {
			return err
		}
	}
	switch m.Op {
	case nft.OpImplicit, nft.OpEq, nft.OpNe, nft.OpLt, nft.OpLe, nft.OpGt, nft.OpGe:
	default:
		return fmt.Errorf("operator %q not modelled", m.Op)
	}
	if m.Mask == nil && len(m.Left) == 1 && typ == nft.TypeCTStatus && m.Op != nft.OpImplicit && m.Op != nft.OpEq {
		return fmt.Errorf("%q: ct status %s without a mask not modelled", m, m.Op)
	}
	eq := m.Op == nft.OpImplicit || m.Op == nft.OpEq || m.Op == nft.OpNe
	if !eq && (len(m.Left) != 1 || typ == nft.TypeAddr || typ == nft.TypeIface || typ == nft.TypeFibType || typ == nft.TypeCTState) {
		return fmt.Errorf("%q: %s on %s not modelled", m, m.Op, m.Left[0])
	}
	switch {
	case m.Set != "":
		if !eq {
			return fmt.Errorf("%s @set not modelled", m.Op)
		}
		if m.Anon || len(m.Right) > 0 {
			return fmt.Errorf("%q: a named set and constants", m)
		}
		return nil
	case m.Anon:
		if !eq {
			return fmt.Errorf("%s { set } not modelled", m.Op)
		}
		if len(m.Right) == 0 {
			return errors.New("empty { set }")
		}
	case len(m.Right) != 1:
		return fmt.Errorf("%q: want one value to compare with", m)
	}
	for _, k := range m.Right {
		if len(k) != len(m.Left) {
			return fmt.Errorf("%q: %s has %d parts, the expression %d", m, k, len(k), len(m.Left))
		}
		for i, v := range k {
			if err := checkConst(ip, m.Left[i].Type(), v); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkConst checks that v is a constant of type typ.
func checkConst(ip string, typ nft.Type, v nft.Value) error {
	ok := false
	switch typ {
	case nft.TypeAddr:
		if v.Kind == nft.KindAddr || v.Kind == nft.KindPrefix {
			if a := addrOf(v); a.Is6() != (ip == "ip6") || a.Is4In6() {
				return fmt.Errorf("address %s in an %s table", v, ip)
			}
			ok = true
		}
	case nft.TypeProto, nft.TypePort, nft.TypeMark, nft.TypeNum, nft.TypeCTStatus:
		ok = v.Kind == nft.KindNum && v.Num <= 0xffffffff
	case nft.TypeIface:
		ok = v.Kind == nft.KindString
	case nft.TypeFibType:
		ok = v.Kind == nft.KindName && slices.Contains(nft.FibTypes, v.Str)
	case nft.TypeCTState:
		ok = v.Kind == nft.KindName && slices.Contains(nft.CTStates, v.Str)
	}
	if !ok {
		return fmt.Errorf("constant %s: not a value of the expression's type", v)
	}
	return nil
}

// checkElem checks an element of s: its key's parts are numbers,
// addresses or prefixes; a verdict map's value is a verdict, a data map's
// data, a set's nothing.
func checkElem(s *Set, e nft.Elem) error {
	for _, k := range [2]nft.Key{e.Key, e.Data} {
		for _, v := range k {
			if v.Kind != nft.KindNum && v.Kind != nft.KindAddr && v.Kind != nft.KindPrefix {
				return fmt.Errorf("element part %s: not an address, prefix, protocol or number", v)
			}
		}
	}
	switch {
	case len(e.Key) == 0:
		return errors.New("no key")
	case !s.IsMap:
		if e.Data != nil || e.Verdict != nil {
			return errors.New("a set element with a value")
		}
	case s.IsVerdictMap():
		if e.Verdict == nil {
			return errors.New("a verdict map element without a verdict")
		}
		return checkVerdict(e.Verdict)
	case e.Data == nil:
		return errors.New("a data map element without data")
	}
	return nil
}

// checkBase checks a base chain's spec.
func checkBase(c nft.BaseChain) error {
	switch c.Hook {
	case "prerouting", "input", "forward", "output", "postrouting":
	default:
		return fmt.Errorf("hook %q not modelled", c.Hook)
	}
	switch c.Type {
	case "nat", "filter":
	default:
		return fmt.Errorf("chain type %q not modelled", c.Type)
	}
	switch c.Policy {
	case "", "accept", "drop":
	default:
		return fmt.Errorf("policy %q not modelled", c.Policy)
	}
	return nil
}
