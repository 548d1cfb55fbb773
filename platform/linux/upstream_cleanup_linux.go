package linux

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
)

// SystemIPSets is the ipset tool of the current network namespace.
func SystemIPSets() IPSets { return execIPSet{} }

type execIPSet struct{}

func (execIPSet) List(ctx context.Context) ([]string, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", ErrNoIPSetTool)
	}
	out, err := exec.CommandContext(ctx, "ipset", "list", "-n").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ipset list -n: %w: %s", err, firstLines(string(out), 3))
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			names = append(names, l)
		}
	}
	return names, nil
}

func (execIPSet) Destroy(ctx context.Context, name string) error {
	out, err := exec.CommandContext(ctx, "ipset", "destroy", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ipset destroy %s: %w: %s", name, err, firstLines(string(out), 3))
	}
	return nil
}

// DeleteUpstreamIPVSInterface deletes kube-proxy's ipvs-mode interface
// kube-ipvs0 (a dummy interface holding the Service addresses) in the
// current network namespace, by name as upstream's cleanup does. It reports
// whether it existed.
func DeleteUpstreamIPVSInterface() (bool, error) {
	link, err := netlink.LinkByName(UpstreamIPVSInterface)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return false, nil
		}
		return false, fmt.Errorf("looking up %s: %w", UpstreamIPVSInterface, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return false, fmt.Errorf("deleting %s: %w", UpstreamIPVSInterface, err)
	}
	return true, nil
}

// IPVSVirtualServers counts the IPVS virtual servers of the current network
// namespace (/proc/net/ip_vs), kube-proxy's ipvs mode's or anyone's; 0
// when the kernel has no IPVS. kproxy's --cleanup does not remove them
// (upstream's flushes every one): the caller says so when there are some.
func IPVSVirtualServers() (int, error) {
	data, err := os.ReadFile("/proc/net/ip_vs")
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the IPVS table: %w", err)
	}
	return countIPVSVirtualServers(data), nil
}
