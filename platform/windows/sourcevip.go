package windows

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// CalicoEndpointName is the HNS endpoint Calico creates on each Windows node
// for the host; on Calico's overlay its address is the source VIP.
const CalicoEndpointName = "Calico_ep"

// SourceVIPReservationID is the owner kproxy writes in the IPAM store for
// the source VIP it reserves.
const SourceVIPReservationID = "kproxy-source-vip"

// DefaultIPAMDataDir is the CNI host-local IPAM plugin's default data
// directory (on Windows, relative to the system drive's root): the store of
// a network named N is DefaultIPAMDataDir/N.
const DefaultIPAMDataDir = "/var/lib/cni/networks"

// HostLocalReservation reserves the source VIP the way the CNI host-local
// IPAM plugin records an allocation, in the same store, so that the plugin
// never gives the address to a pod: one file per reserved address, named by
// the address and holding the owner's ID. sig-windows-tools obtains the
// source VIP by running host-local itself; this is the same reservation
// without the plugin binary.
//
// The reservation is stable: a store that already holds an address owned by
// SourceVIPReservationID inside the subnet returns it (a restart keeps the
// source VIP, and the load balancers that use it).
type HostLocalReservation struct {
	// Dir is the store: the IPAM's dataDir joined with its network name.
	Dir string
}

// Reserve returns the address of subnet reserved for the source VIP,
// reserving one when there is none: the highest free address (pods are
// handed out from the bottom), never the subnet's network, first (gateway)
// or IPv4 broadcast address, nor one in avoid (addresses HNS already has).
func (r HostLocalReservation) Reserve(subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error) {
	subnet = subnet.Masked()
	if !subnet.IsValid() {
		return netip.Addr{}, errors.New("reserving a source VIP: no pod subnet")
	}
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return netip.Addr{}, fmt.Errorf("reserving a source VIP in %s: %w", r.Dir, err)
	}
	entries, err := os.ReadDir(r.Dir)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reserving a source VIP in %s: %w", r.Dir, err)
	}
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil || !e.Type().IsRegular() || !subnet.Contains(ip) {
			continue
		}
		if owner, err := readOwner(filepath.Join(r.Dir, e.Name())); err == nil && owner == SourceVIPReservationID {
			return ip, nil
		}
	}
	first := subnet.Addr().Next() // the gateway by convention
	last := lastAddr(subnet)
	if subnet.Addr().Is4() {
		last = last.Prev() // broadcast
	}
	const maxTries = 4096
	for ip, n := last, 0; ip.IsValid() && first.Less(ip) && n < maxTries; ip, n = ip.Prev(), n+1 {
		if avoid != nil && avoid(ip) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(r.Dir, ip.String()), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("reserving source VIP %s in %s: %w", ip, r.Dir, err)
		}
		// host-local's format: the owner's ID, a line break, the interface.
		_, werr := f.WriteString(SourceVIPReservationID + "\r\nkproxy")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			_ = os.Remove(f.Name())
			return netip.Addr{}, fmt.Errorf("reserving source VIP %s in %s: %w", ip, r.Dir, werr)
		}
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("reserving a source VIP: no free address in %s (store %s)", subnet, r.Dir)
}

// Find returns the address of the family reserved for the source VIP in
// the store, if any, without reserving one (kproxy check-hns, which does
// not know the node's pod subnet). A missing store holds none.
func (r HostLocalReservation) Find(v6 bool) (netip.Addr, bool, error) {
	entries, err := os.ReadDir(r.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("reading the IPAM store %s: %w", r.Dir, err)
	}
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
		if err != nil || !e.Type().IsRegular() || ip.Is6() != v6 {
			continue
		}
		if owner, err := readOwner(filepath.Join(r.Dir, e.Name())); err == nil && owner == SourceVIPReservationID {
			return ip, true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// FindInIPAMStore returns a CheckOptions.ReservedSourceVIP function that
// looks in a host-local store (a directory).
func FindInIPAMStore() func(store string, v6 bool) (netip.Addr, bool, error) {
	return func(store string, v6 bool) (netip.Addr, bool, error) {
		return HostLocalReservation{Dir: store}.Find(v6)
	}
}

// ReserveInIPAMStore returns a ReserveSourceVIP function that reserves in a
// host-local store (a directory; see Backend.ipamStore for which).
func ReserveInIPAMStore() func(store string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error) {
	return func(store string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error) {
		return HostLocalReservation{Dir: store}.Reserve(subnet, avoid)
	}
}

// IPAMStore is host-local's store for the source VIP of an HNS network: the
// data directory (dataDir when set, else the CNI configuration's, else
// DefaultIPAMDataDir) joined with the CNI configuration's network name when
// its IPAM is host-local (host-local keys its store by it), else with the
// HNS network's name. It says which it chose.
func IPAMStore(cfg *CNIConfig, dataDir, hnsNetwork string) (store, why string) {
	name, why := hnsNetwork, "the HNS network's name (no CNI configuration with host-local IPAM)"
	if cfg.HostLocal() {
		name, why = cfg.Name, "the network name of "+cfg.File
	}
	switch {
	case dataDir != "":
	case cfg.HostLocal():
		dataDir = cfg.DataDir
	default:
		dataDir = DefaultIPAMDataDir
	}
	return filepath.Join(dataDir, name), why
}

func readOwner(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		return strings.TrimSpace(sc.Text()), nil
	}
	return "", sc.Err()
}

// lastAddr returns the highest address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// errSourceVIP explains why no source VIP could be found.
type errSourceVIP struct{ detail string }

func (e errSourceVIP) Error() string {
	return plan.ErrNoSourceVIP.Error() + ": " + e.detail
}

func (e errSourceVIP) Unwrap() error { return plan.ErrNoSourceVIP }

// FindSourceVIP returns the source VIP of an overlay network when none is
// configured: the address of Calico's host endpoint when there is one, else
// the one reserved in the IPAM store for the node's pod subnet of the family.
func FindSourceVIP(opts *Options, store string, rec *reconcile.State, podCIDRs []netip.Prefix) (netip.Addr, string, error) {
	if rec != nil {
		for ip, ep := range rec.Endpoints {
			if !ep.Remote && strings.EqualFold(ep.Name, CalicoEndpointName) {
				return ip, "the " + CalicoEndpointName + " endpoint", nil
			}
		}
	}
	if opts.ReserveSourceVIP == nil {
		return netip.Addr{}, "", errSourceVIP{"none configured and no " + CalicoEndpointName + " endpoint"}
	}
	v6 := opts.Family == v1.IPv6Protocol
	var subnet netip.Prefix
	for _, p := range podCIDRs {
		if p.Addr().Is6() == v6 {
			subnet = p
			break
		}
	}
	if !subnet.IsValid() {
		return netip.Addr{}, "", errSourceVIP{"none configured, no " + CalicoEndpointName + " endpoint, and the Node has no " + string(opts.Family) + " podCIDR to reserve one from"}
	}
	avoid := func(ip netip.Addr) bool { return rec != nil && rec.Endpoints[ip] != nil }
	ip, err := opts.ReserveSourceVIP(store, subnet, avoid)
	if err != nil {
		return netip.Addr{}, "", errSourceVIP{fmt.Sprintf("none configured, no %s endpoint, and reserving one failed: %v", CalicoEndpointName, err)}
	}
	return ip, "reserved in the IPAM store " + store, nil
}
