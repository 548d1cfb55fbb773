package iptables

import (
	"bufio"
	"bytes"
	"hash/fnv"
	"strings"
)

// KernelChains reads iptables-save output of one table and returns, for each
// chain kproxy owns, the hash of its rules in the form the planner renders
// them (for Input.Existing). A chain whose rules iptables-save prints
// exactly as kproxy wrote them hashes like the planner's rendering, so a
// full sync leaves it alone.
func KernelChains(save []byte) map[string]uint64 {
	out := map[string]uint64{}
	bodies := map[string][]byte{}
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 1 && line[0] == ':':
			name, _, _ := strings.Cut(string(line[1:]), " ")
			if Owned(name) {
				if _, ok := bodies[name]; !ok {
					bodies[name] = []byte{}
				}
			}
		case bytes.HasPrefix(line, []byte("-A "+Prefix)):
			rest := line[3:]
			name := string(rest)
			if i := bytes.IndexByte(rest, ' '); i >= 0 {
				name = string(rest[:i])
			}
			if b, ok := bodies[name]; ok {
				b = append(b, line...)
				bodies[name] = append(b, '\n')
			}
		}
	}
	for name, b := range bodies {
		h := fnv.New64a()
		_, _ = h.Write(b)
		out[name] = h.Sum64()
	}
	return out
}
