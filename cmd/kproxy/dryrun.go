package main

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/platform/linux"
)

// iptablesDryRun renders the iptables-restore input of both families. It
// never touches the kernel: the iptables seams are in-memory fakes, and the
// node's local addresses are read when this is Linux (they select NodePort
// addresses), else taken as none.
func iptablesDryRun(o *config.Options) (app.Backends, error) {
	var out app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		b, err := linux.New(linux.Options{
			Rules:     modeconfig.IPTables(o, fam),
			Iptables:  linux.NewFakeIptables(),
			NFTables:  &linux.FakeNFTables{},
			Conntrack: &linux.FakeConntrack{},
			Host:      &linux.FakeHost{},
		})
		if err != nil {
			return nil, err
		}
		out = append(out, app.FamilyBackend{Family: fam, Backend: b})
	}
	return out, nil
}
