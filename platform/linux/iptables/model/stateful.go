package model

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/kproxy/kproxy/platform/linux/trace"
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
	slot := trace.ClusterSlot(src, m.clusterSeed, m.clusterTotal)
	return m.clusterMask&(1<<slot) != 0
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
