package ruleset

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
)

// finishNth checks "-m statistic --mode nth --every N [--packet P]" as
// iptables does (1 ≤ N, 0 ≤ P ≤ N-1) and sets the counter where the kernel
// starts it: the rule matches the packets whose index (from 0) modulo N is
// P, among the packets that reach the rule.
func finishNth(m *match) error {
	if _, ok := m.opts["--probability"]; ok {
		return errors.New("statistic nth takes no --probability")
	}
	every, err := strconv.ParseUint(m.opts["--every"], 10, 32)
	if err != nil || every == 0 {
		return fmt.Errorf("bad --every %q", m.opts["--every"])
	}
	packet := uint64(0)
	if v, ok := m.opts["--packet"]; ok {
		if packet, err = strconv.ParseUint(v, 10, 32); err != nil || packet >= every {
			return fmt.Errorf("bad --packet %q (0 <= p <= %d)", v, every-1)
		}
	}
	m.nth = true
	m.every = uint32(every - 1)
	m.count = new(atomic.Uint32)
	m.count.Store(m.every - uint32(packet))
	return nil
}

// nthMatch advances the counter of an nth match for one packet reaching it
// and reports whether the packet matches: the kernel's xt_statistic step
// (count wraps to 0 after every, and 0 matches).
func (m *match) nthMatch() bool {
	for {
		old := m.count.Load()
		next := old + 1
		if old == m.every {
			next = 0
		}
		if m.count.CompareAndSwap(old, next) {
			return next == 0
		}
	}
}

// finishCluster checks "-m cluster" as the kernel does (1 ≤ total ≤ 32, the
// mask within total) and records its parameters.
func finishCluster(m *match) error {
	total, err := strconv.ParseUint(m.opts["--cluster-total-nodes"], 0, 32)
	if err != nil || total == 0 || total > 32 {
		return fmt.Errorf("bad --cluster-total-nodes %q (1-32)", m.opts["--cluster-total-nodes"])
	}
	var mask uint64
	switch {
	case m.opts["--cluster-local-nodemask"] != "":
		// iptables itself reads only values 1-32 here (it checks the mask
		// against the node count range), so kproxy writes
		// --cluster-local-node; but iptables-save prints any mask this
		// way, and the model reads saves (kproxy explain --live).
		if mask, err = strconv.ParseUint(m.opts["--cluster-local-nodemask"], 0, 32); err != nil || mask == 0 {
			return fmt.Errorf("bad --cluster-local-nodemask %q", m.opts["--cluster-local-nodemask"])
		}
	case m.opts["--cluster-local-node"] != "":
		n, err := strconv.ParseUint(m.opts["--cluster-local-node"], 0, 32)
		if err != nil || n == 0 || n > total {
			return fmt.Errorf("bad --cluster-local-node %q", m.opts["--cluster-local-node"])
		}
		mask = 1 << (n - 1)
	default:
		return errors.New("cluster match needs --cluster-local-node or --cluster-local-nodemask")
	}
	if total < 32 && mask >= 1<<total {
		return fmt.Errorf("--cluster-local-nodemask %#x beyond %d nodes", mask, total)
	}
	seed, err := strconv.ParseUint(m.opts["--cluster-hash-seed"], 0, 32)
	if err != nil {
		return fmt.Errorf("bad --cluster-hash-seed %q", m.opts["--cluster-hash-seed"])
	}
	m.clusterTotal, m.clusterMask, m.clusterSeed = uint32(total), uint32(mask), uint32(seed)
	return nil
}

// clusterMatch is the kernel's xt_cluster decision for a connection from
// src: the slot is jhash(source address, seed) scaled to total, and the
// rule matches when the slot's bit is in the mask.
func (m *match) clusterMatch(src netip.Addr) bool {
	slot := ClusterSlot(src, m.clusterSeed, m.clusterTotal)
	return m.clusterMask&(1<<slot) != 0
}

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

var clusterNode = regexp.MustCompile(`--cluster-local-node ([0-9]+)\b`)

// saveCluster rewrites "--cluster-local-node K" as iptables-save prints it:
// "--cluster-local-nodemask" and the mask 1 << (K-1) in eight hex digits.
// (The options after it must already be in save's order: total nodes, then
// seed.) The node number was checked by finishCluster.
func saveCluster(spec string) string {
	if !strings.Contains(spec, "--cluster-local-node ") {
		return spec
	}
	return clusterNode.ReplaceAllStringFunc(spec, func(s string) string {
		k, _ := strconv.Atoi(clusterNode.FindStringSubmatch(s)[1])
		return fmt.Sprintf("--cluster-local-nodemask 0x%08x", uint32(1)<<(k-1))
	})
}
