package linux

import (
	"context"
	"errors"
	"net/netip"

	"github.com/kproxy/kproxy/platform/linux/conntrack"
	v1 "k8s.io/api/core/v1"
)

// ErrNotExist is wrapped by seam errors about a chain or rule that does not exist.
var ErrNotExist = errors.New("does not exist")

// IsNotExist reports whether err says a chain or rule does not exist.
func IsNotExist(err error) bool { return errors.Is(err, ErrNotExist) }

// Iptables is the seam to one IP family's iptables tools, in one flavour.
// Implementations: the real tools (NewSystemIptables, Linux only) and
// FakeIptables. Everything a sync writes goes through Restore; jump rules
// are inserted by a full sync's restore (it has just read the table, so it
// knows which are missing) and deleted one by one by Cleanup. List reads the
// canary chain when a sync has nothing to write.
type Iptables interface {
	// Restore runs iptables-restore --noflush (waiting for the xtables lock)
	// with data as input. It is atomic: on error nothing changed.
	Restore(ctx context.Context, data []byte) error
	// Save returns the iptables-save output of one table.
	Save(ctx context.Context, table string) ([]byte, error)
	// List returns a chain in iptables -S form (through go-iptables); an
	// error wrapping ErrNotExist when the chain does not exist.
	List(ctx context.Context, table, chain string) ([]string, error)
	// Delete deletes one rule of a built-in chain (iptables -D, through
	// go-iptables); an error wrapping ErrNotExist when there is no such rule.
	Delete(ctx context.Context, table, chain string, spec ...string) error
	// Describe names the tools, for logs ("iptables-nft v1.8.9").
	Describe() string
}

// NFTables is the seam to the nft tool, used only to remove upstream
// kube-proxy's nftables table when taking over.
type NFTables interface {
	// ListTables returns "family name" for every table ("ip kube-proxy").
	ListTables(ctx context.Context) ([]string, error)
	// DeleteTable deletes one table.
	DeleteTable(ctx context.Context, family, name string) error
}

// Conntrack is the seam to the kernel's connection tracking table.
type Conntrack interface {
	// DeleteFlows deletes the flows of family for which match returns true
	// and returns how many were deleted.
	DeleteFlows(family v1.IPFamily, match func(conntrack.Flow) bool) (int, error)
	// CountEstablished counts, for each endpoint in eps, the established
	// TCP flows of family whose reply comes from it (the connections
	// DNATed to it). It reads the whole table.
	CountEstablished(family v1.IPFamily, eps map[netip.AddrPort]bool) (map[netip.AddrPort]int, error)
}

// Host is the seam to the node's addresses and sysctls.
type Host interface {
	// LocalAddresses lists the addresses on the node's interfaces (all families).
	LocalAddresses() ([]netip.Addr, error)
	// SetSysctl writes a sysctl, e.g. "net/ipv4/conf/all/route_localnet".
	SetSysctl(name, value string) error
}

// HasIPv6 reports whether host has an IPv6 address other than loopback and
// link-local ones: an IPv4-only node (IPv6 disabled, or only ::1 and fe80::)
// gets no IPv6 backend, which would program rules nothing can reach.
func HasIPv6(host Host) bool {
	addrs, err := host.LocalAddresses()
	if err != nil {
		return true // cannot tell: keep the backend
	}
	for _, a := range addrs {
		if a.Is6() && !a.Is4In6() && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			return true
		}
	}
	return false
}
