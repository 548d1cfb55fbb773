package linux

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/platform/linux/iptables"
)

// ReadPacketCounters lists kproxy's filter chains ChainForward and
// ChainFirewall with their counters ("iptables -S CHAIN -v", two small
// chains) in one family and flavour, and parses them.
func ReadPacketCounters(ctx context.Context, family v1.IPFamily, flavour Flavour) (PacketCounters, error) {
	bin := CommandsFor(family, flavour).Iptables
	var all []byte
	for _, chain := range []string{iptables.ChainForward, iptables.ChainFirewall} {
		out, err := exec.CommandContext(ctx, bin, "-w", strconv.Itoa(lockWaitSeconds), "-t", "filter", "-S", chain, "-v").Output()
		if err != nil {
			return PacketCounters{}, fmt.Errorf("%s -S %s -v: %w", bin, chain, err)
		}
		all = append(all, out...)
	}
	return ParsePacketCounters(all), nil
}
