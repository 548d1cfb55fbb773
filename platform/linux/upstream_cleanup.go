package linux

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// UpstreamIPVSInterface is the dummy interface kube-proxy's ipvs mode binds
// Service addresses to.
const UpstreamIPVSInterface = "kube-ipvs0"

// upstreamIPSetPrefix starts the name of every ipset kube-proxy's ipvs mode
// creates (KUBE-CLUSTER-IP, KUBE-NODE-PORT-TCP, ...).
const upstreamIPSetPrefix = "KUBE-"

// CleanupUpstreamIptables removes upstream kube-proxy's iptables state from
// one family and flavour (ipt): its chains of the iptables and ipvs modes in
// nat, filter and mangle and the jumps to them from built-in chains, as a
// take-over does; chains kubelet owns and chains still used by a chain that
// is not kube-proxy's stay. It returns the removed chains ("table/chain").
func CleanupUpstreamIptables(ctx context.Context, ipt Iptables) ([]string, error) {
	saves := map[string][]byte{}
	for _, t := range TakeoverTables {
		data, err := ipt.Save(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("reading table %s: %w", t, err)
		}
		saves[t] = data
	}
	plan := planTakeovers(saves)
	if plan.empty() {
		return nil, nil
	}
	if err := ipt.Restore(ctx, plan.restoreInput()); err != nil {
		return nil, fmt.Errorf("removing kube-proxy's chains %v: %w", plan.chains(), err)
	}
	return plan.chains(), nil
}

// restoreInput renders the plan as iptables-restore --noflush input.
func (p *takeoverPlan) restoreInput() []byte {
	var b strings.Builder
	for _, t := range TakeoverTables {
		lines := p.lines[t]
		if len(lines) == 0 {
			continue
		}
		b.WriteString("*" + t + "\n")
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// nftFamily is the nftables family of an IP family ("ip", "ip6").
func nftFamily(f v1.IPFamily) string {
	if f == v1.IPv6Protocol {
		return "ip6"
	}
	return "ip"
}

// CleanupUpstreamNFTables deletes kube-proxy's nftables table of family
// ("ip kube-proxy" or "ip6 kube-proxy"), if it exists. It reports whether a
// table was deleted.
func CleanupUpstreamNFTables(ctx context.Context, nft NFTables, family v1.IPFamily) (bool, error) {
	return deleteTable(ctx, nft, family, "kube-proxy")
}

// DeleteOwnNFTable deletes kproxy's nftables table of family (that of the
// nftables mode), if there is one, and reports whether it did.
func DeleteOwnNFTable(ctx context.Context, nft NFTables, family v1.IPFamily) (bool, error) {
	return deleteTable(ctx, nft, family, "kproxy")
}

func deleteTable(ctx context.Context, nft NFTables, family v1.IPFamily, name string) (bool, error) {
	tables, err := nft.ListTables(ctx)
	if err != nil {
		return false, err
	}
	want := nftFamily(family) + " " + name
	for _, t := range tables {
		if t != want {
			continue
		}
		if err := nft.DeleteTable(ctx, nftFamily(family), name); err != nil && !IsNotExist(err) {
			return false, fmt.Errorf("deleting nftables table %s: %w", want, err)
		}
		return true, nil
	}
	return false, nil
}

// IPSets is the seam to the ipset tool.
type IPSets interface {
	// List returns the names of every set; an error wrapping
	// ErrNoIPSetTool when the ipset tool is not installed.
	List(ctx context.Context) ([]string, error)
	// Destroy destroys one set.
	Destroy(ctx context.Context, name string) error
}

// ErrNoIPSetTool is wrapped by IPSets errors when ipset is not installed.
var ErrNoIPSetTool = errors.New("the ipset tool is not installed")

// CleanupUpstreamIPSets destroys kube-proxy's ipvs-mode ipsets (names
// starting with KUBE-), after the iptables rules that used them are gone.
// It returns the destroyed sets; when the ipset tool is missing it returns
// nothing and an error wrapping ErrNoIPSetTool.
func CleanupUpstreamIPSets(ctx context.Context, sets IPSets) ([]string, error) {
	names, err := sets.List(ctx)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var destroyed []string
	var errs []error
	for _, n := range names {
		if !strings.HasPrefix(n, upstreamIPSetPrefix) {
			continue
		}
		if err := sets.Destroy(ctx, n); err != nil {
			errs = append(errs, fmt.Errorf("destroying ipset %s: %w", n, err))
			continue
		}
		destroyed = append(destroyed, n)
	}
	return destroyed, errors.Join(errs...)
}

// countIPVSVirtualServers counts the virtual servers listed in the content
// of /proc/net/ip_vs: one line per virtual server, starting with its
// protocol (TCP, UDP, SCTP) or FWM for a firewall-mark service; the header
// and the real servers ("  -> ...") are not counted.
func countIPVSVirtualServers(data []byte) int {
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "TCP", "UDP", "SCTP", "FWM":
			n++
		}
	}
	return n
}
