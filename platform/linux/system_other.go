//go:build !linux

package linux

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
)

// errNotLinux is returned by the real seams off Linux.
var errNotLinux = errors.New("the iptables backend needs Linux")

// System holds the real seams (Linux only).
type System struct {
	Flavour   Flavour
	Iptables  Iptables
	NFTables  NFTables
	Conntrack Conntrack
	Host      Host
}

// NewSystem returns the real seams; off Linux it fails.
func NewSystem(v1.IPFamily, Flavour) (*System, error) { return nil, errNotLinux }

// NewSystemIptables returns the Iptables seam; off Linux it fails.
func NewSystemIptables(v1.IPFamily, Flavour) (Iptables, error) { return nil, errNotLinux }

// DetectFlavour probes the iptables flavours; off Linux it fails.
func DetectFlavour(context.Context, v1.IPFamily) (Flavour, error) { return "", errNotLinux }

// HasRandomFully reports whether MASQUERADE --random-fully is supported.
func HasRandomFully(Iptables) bool { return true }

// ProcHost returns the host seam (Linux only: elsewhere one that fails).
func ProcHost() Host { return &FakeHost{AddrErr: errNotLinux} }

// NetlinkConntrack returns the conntrack seam (Linux only: elsewhere a fake).
func NetlinkConntrack() Conntrack { return &FakeConntrack{} }

// KernelVersion returns the running Linux kernel's version; off Linux, none.
func KernelVersion() (major, minor int, ok bool) { return 0, 0, false }
