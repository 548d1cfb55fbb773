//go:build !linux

package explaincmd

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
)

func liveIptablesTracer(context.Context, *config.Options, *proxy.Snapshot, v1.IPFamily) (traced, error) {
	return traced{}, errors.New("--live with the iptables mode runs only on a Linux node")
}

func liveNFTablesTracer(context.Context, *config.Options, *proxy.Snapshot, v1.IPFamily) (traced, error) {
	return traced{}, errors.New("--live with the nftables mode runs only on a Linux node")
}
