package model

import (
	"cmp"
	"math/big"
	"net/netip"
	"slices"
)

// mergePrefixes returns the fewest prefixes covering exactly the union of
// ps (all of one family), sorted: what nft lists for an interval set or an
// anonymous set of addresses.
func mergePrefixes(ps []netip.Prefix) []netip.Prefix {
	type span struct{ lo, hi netip.Addr }
	var spans []span
	for _, p := range ps {
		p = p.Masked()
		spans = append(spans, span{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Or(a.lo.Compare(b.lo), a.hi.Compare(b.hi)) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			// Overlapping or adjacent: one span.
			if next := last.hi.Next(); s.lo.Compare(last.hi) <= 0 || (next.IsValid() && s.lo == next) {
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
