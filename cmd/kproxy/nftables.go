package main

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/platform/linux"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
)

// nftablesDryRun renders the nft -f input of both families. It never
// touches the kernel (in-memory nftables), on any OS; the node's local
// addresses are read when this is Linux.
func nftablesDryRun(o *config.Options) (app.Backends, error) {
	var out app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		b, err := linux.NewNFT(linux.NFTOptions{
			Rules:     modeconfig.NFTables(o, fam),
			NFT:       nftmodel.NewFake(nftables.Family(fam), nftables.TableName),
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
