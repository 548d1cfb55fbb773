package linux

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/linux/iptables"
)

// PacketCounters are the packet counters of the rules behind upstream
// kube-proxy's packet metrics in one family; a Found flag is false when the
// rule is not there (tcpBeLiberal, IPv6, localhost NodePorts off).
type PacketCounters struct {
	InvalidDropped, LocalhostNodePortsAccepted           uint64
	FoundInvalidDropped, FoundLocalhostNodePortsAccepted bool
}

// ParsePacketCounters reads the counters from "iptables -S CHAIN -v"
// output of kproxy's filter chains (ChainForward, ChainFirewall), where each
// rule carries "-c PACKETS BYTES".
func ParsePacketCounters(listing []byte) PacketCounters {
	var pc PacketCounters
	sc := bufio.NewScanner(bytes.NewReader(listing))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		pkts, ok := ruleCounter(line)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(line, "-A "+iptables.ChainForward+" ") && strings.Contains(line, "--ctstate INVALID") && strings.HasSuffix(line, "-j DROP"):
			pc.InvalidDropped += pkts
			pc.FoundInvalidDropped = true
		case strings.HasPrefix(line, "-A "+iptables.ChainFirewall+" ") && strings.Contains(line, "kproxy localhost nodeports"):
			pc.LocalhostNodePortsAccepted += pkts
			pc.FoundLocalhostNodePortsAccepted = true
		}
	}
	return pc
}

// ruleCounter returns the packet count of "-c PACKETS BYTES" in a rule.
func ruleCounter(line string) (uint64, bool) {
	f := strings.Fields(line)
	for i := 0; i+2 < len(f); i++ {
		if f[i] == "-c" {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
