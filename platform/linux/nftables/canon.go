package nftables

import (
	"cmp"
	"math/big"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// anonSet matches an anonymous set in rule text ("{ a, b }").
var anonSet = regexp.MustCompile(`\{ ([^{}]*) \}`)

// CanonRule returns a rule's text with every anonymous set of addresses
// and prefixes written as nft lists it back: sorted, overlapping and
// adjacent members merged, as the fewest prefixes. Two rules with the same
// canonical text match the same packets; the renderer writes a source
// range firewall's set in its own order (ranges, then addresses), nft lists
// it sorted and merged.
func CanonRule(rule string) string {
	if !strings.Contains(rule, "{ ") {
		return rule
	}
	return anonSet.ReplaceAllStringFunc(rule, func(m string) string {
		body := m[2 : len(m)-2]
		var ps []netip.Prefix
		for _, part := range strings.Split(body, ", ") {
			if p, err := netip.ParsePrefix(part); err == nil {
				ps = append(ps, p.Masked())
				continue
			}
			a, err := netip.ParseAddr(part)
			if err != nil {
				return m // not a set of addresses
			}
			ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
		}
		var out []string
		for _, p := range mergePrefixes(ps) {
			if p.Bits() == p.Addr().BitLen() {
				out = append(out, p.Addr().String())
			} else {
				out = append(out, p.String())
			}
		}
		return "{ " + strings.Join(out, ", ") + " }"
	})
}

// SameRule reports whether two rule texts are the same rule (see
// CanonRule).
func SameRule(a, b string) bool { return a == b || CanonRule(a) == CanonRule(b) }

// mergePrefixes returns the fewest prefixes covering exactly the union of
// ps (all of one family), sorted.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	type span struct{ lo, hi netip.Addr }
	var spans []span
	for _, p := range ps {
		spans = append(spans, span{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Or(a.lo.Compare(b.lo), a.hi.Compare(b.hi)) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			// Overlapping or adjacent: one span.
			if next := last.hi.Next(); !s.lo.IsValid() || s.lo.Compare(last.hi) <= 0 || (next.IsValid() && s.lo == next) {
				if s.hi.Compare(last.hi) > 0 {
					last.hi = s.hi
				}
				continue
			}
		}
		merged = append(merged, s)
	}
	var out []netip.Prefix
	for _, s := range merged {
		out = append(out, RangePrefixes(s.lo, s.hi)...)
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// RangePrefixes splits [lo, hi] into the fewest prefixes.
func RangePrefixes(lo, hi netip.Addr) []netip.Prefix {
	bits := lo.BitLen()
	toInt := func(a netip.Addr) *big.Int { return new(big.Int).SetBytes(a.AsSlice()) }
	fromInt := func(n *big.Int) netip.Addr {
		b := make([]byte, bits/8)
		n.FillBytes(b)
		a, _ := netip.AddrFromSlice(b)
		return a
	}
	cur, end := toInt(lo), toInt(hi)
	one := big.NewInt(1)
	var out []netip.Prefix
	for cur.Cmp(end) <= 0 {
		// The largest block aligned at cur that stays within end.
		size := 0
		for size < bits {
			next := size + 1
			mask := new(big.Int).Sub(new(big.Int).Lsh(one, uint(next)), one)
			if new(big.Int).And(cur, mask).Sign() != 0 {
				break
			}
			last := new(big.Int).Add(cur, mask)
			if last.Cmp(end) > 0 {
				break
			}
			size = next
		}
		out = append(out, netip.PrefixFrom(fromInt(cur), bits-size))
		cur.Add(cur, new(big.Int).Lsh(one, uint(size)))
	}
	return out
}
