package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// canon writes values as a key ("10.96.0.1 . tcp . 80").
func canon(ks []nft.Value) string { return nft.Key(ks).String() }

// indexKey is the canonical form of a key for exact lookups (protocols as
// numbers, whatever the text said).
func indexKey(ks []nft.Value) string {
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(" . ")
		}
		if k.Kind == nft.KindNum {
			b.WriteString(strconv.FormatUint(k.Num, 10))
		} else {
			b.WriteString(k.String())
		}
	}
	return b.String()
}

// isWord reports whether v is a word (a name or a string): the two compare
// by their text.
func isWord(v nft.Value) bool { return v.Kind == nft.KindName || v.Kind == nft.KindString }

// partMatches reports whether a packet value v matches element part e.
func partMatches(e, v nft.Value) bool {
	switch e.Kind {
	case nft.KindPrefix:
		return v.Kind == nft.KindAddr && e.Prefix.Contains(v.Addr)
	case nft.KindAddr:
		return v.Kind == nft.KindAddr && e.Addr == v.Addr
	case nft.KindNum:
		return v.Kind == nft.KindNum && e.Num == v.Num
	}
	return isWord(v) && e.Str == v.Str
}

// parseNum reads a number as nft does: decimal, or hexadecimal after "0x"
// (the Value keeps the digits' count, to write it back the same).
func parseNum(s string, bits int) (nft.Value, error) {
	n, err := strconv.ParseUint(s, 0, bits)
	if err != nil {
		return nft.Value{}, err
	}
	v := nft.Num(n)
	if h, ok := strings.CutPrefix(s, "0x"); ok && len(h) <= 0xff {
		v.Hex = uint8(len(h))
	}
	return v, nil
}

// parseKeyPart reads one part of an element key or value: an address, a
// prefix, a protocol or a number.
func parseKeyPart(s string) (nft.Value, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nft.Value{}, err
		}
		return nft.Prefix(p.Masked()), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return nft.Addr(a), nil
	}
	if v, ok := nft.Proto(s); ok {
		return v, nil
	}
	if v, err := parseNum(s, 32); err == nil {
		return v, nil
	}
	return nft.Value{}, fmt.Errorf("element part %q: not an address, prefix, protocol or number", s)
}
