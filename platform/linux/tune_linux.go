package linux

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

const hashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"

// raiseHashsize makes the conntrack hash table at least want buckets, as
// kube-proxy does: the kernel sizes it from memory at boot, and a small
// table with a large nf_conntrack_max makes long bucket chains.
func raiseHashsize(want int) error {
	cur, err := os.ReadFile(hashsizePath)
	if err != nil {
		return fmt.Errorf("reading %s: %w", hashsizePath, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(cur)))
	if err != nil {
		return fmt.Errorf("reading %s: %w", hashsizePath, err)
	}
	if n >= want {
		return nil
	}
	if err := os.WriteFile(hashsizePath, []byte(strconv.Itoa(want)), 0o644); err != nil {
		return fmt.Errorf("raising %s from %d to %d: %w", hashsizePath, n, want, err)
	}
	return nil
}

// maxWritable reports whether nf_conntrack_max is writable here: true only
// in the host's initial network namespace.
func maxWritable() bool {
	fi, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max")
	return err == nil && fi.Mode().Perm()&0o200 != 0
}

// SetOOMScoreAdj sets the OOM score adjustment of the kproxy process.
func SetOOMScoreAdj(v int) error {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(v)), 0o644); err != nil {
		return fmt.Errorf("setting oom_score_adj to %d: %w", v, err)
	}
	return nil
}
