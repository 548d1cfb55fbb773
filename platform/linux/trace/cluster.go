package trace

import (
	"math/bits"
	"net/netip"
)

// ClusterSlot returns the slot (0 to total-1) that the kernel's xt_cluster
// match computes for a connection whose original source is src: Bob
// Jenkins' jhash of the address words with seed (jhash_1word for IPv4,
// jhash2 over four words for IPv6), the words read in the byte order the
// kernel reads them on a little-endian machine, then scaled to total as
// reciprocal_scale does. Exported so that tests and planners can predict
// where a client lands.
func ClusterSlot(src netip.Addr, seed, total uint32) uint32 {
	var h uint32
	if src.Is4() {
		b := src.As4()
		h = jhash1Word(le32(b[:]), seed)
	} else {
		b := src.As16()
		h = jhash2([]uint32{le32(b[0:4]), le32(b[4:8]), le32(b[8:12]), le32(b[12:16])}, seed)
	}
	return uint32((uint64(h) * uint64(total)) >> 32)
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

const jhashInitval = 0xdeadbeef

func jhashFinal(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

// jhash1Word is the kernel's jhash_1word.
func jhash1Word(a, initval uint32) uint32 {
	iv := initval + jhashInitval + 1<<2
	return jhashFinal(a+iv, iv, iv)
}

// jhash2 is the kernel's jhash2 over 32-bit words.
func jhash2(k []uint32, initval uint32) uint32 {
	a := jhashInitval + uint32(len(k))<<2 + initval
	b, c := a, a
	for len(k) > 3 {
		a += k[0]
		b += k[1]
		c += k[2]
		a, b, c = jhashMix(a, b, c)
		k = k[3:]
	}
	switch len(k) {
	case 3:
		c += k[2]
		fallthrough
	case 2:
		b += k[1]
		fallthrough
	case 1:
		a += k[0]
		c = jhashFinal(a, b, c)
	}
	return c
}
