package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// kval is one part of a key or value: an address, a prefix or a number
// (protocols are numbers).
type kval struct {
	addr netip.Addr
	pfx  netip.Prefix
	num  uint64
	kind byte // 'a', 'p', 'n', 's' (a string: interface names, types)
	str  string
}

func (k kval) String() string {
	switch k.kind {
	case 'a':
		return k.addr.String()
	case 'p':
		return k.pfx.String()
	case 'n':
		if k.str != "" {
			return k.str // a protocol's name
		}
		return strconv.FormatUint(k.num, 10)
	}
	return k.str
}

func canon(ks []kval) string {
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k.String()
	}
	return strings.Join(parts, " . ")
}

// indexKey is the canonical form of a key for exact lookups (protocols as
// numbers, whatever the text said).
func indexKey(ks []kval) string {
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(" . ")
		}
		if k.kind == 'n' {
			b.WriteString(strconv.FormatUint(k.num, 10))
		} else {
			b.WriteString(k.String())
		}
	}
	return b.String()
}

// matches reports whether a packet value v matches element part e.
func (e kval) matches(v kval) bool {
	switch e.kind {
	case 'p':
		return v.kind == 'a' && e.pfx.Contains(v.addr)
	case 'a':
		return v.kind == 'a' && e.addr == v.addr
	case 'n':
		return v.kind == 'n' && e.num == v.num
	}
	return v.kind == 's' && e.str == v.str
}

var protoNums = map[string]uint64{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}

// parseKval reads one part of an element key or value.
func parseKval(s string) (kval, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return kval{}, err
		}
		return kval{kind: 'p', pfx: p.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return kval{kind: 'a', addr: a}, nil
	}
	if n, ok := protoNums[s]; ok {
		return kval{kind: 'n', num: n, str: s}, nil
	}
	if n, err := strconv.ParseUint(s, 0, 32); err == nil {
		return kval{kind: 'n', num: n}, nil
	}
	return kval{}, fmt.Errorf("element part %q: not an address, prefix, protocol or number", s)
}
