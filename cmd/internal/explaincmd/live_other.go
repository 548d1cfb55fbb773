//go:build !linux

package explaincmd

import (
	"context"
	"errors"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/explain"
	"github.com/kproxy/kproxy/pkg/proxy"
)

func liveIptablesTracer(context.Context, *config.Options, *proxy.Snapshot, v1.IPFamily) (explain.Tracer, []netip.Addr, error) {
	return nil, nil, errors.New("--live with the iptables mode runs only on a Linux node")
}

func liveNFTablesTracer(context.Context, *config.Options, *proxy.Snapshot, v1.IPFamily) (explain.Tracer, []netip.Addr, error) {
	return nil, nil, errors.New("--live with the nftables mode runs only on a Linux node")
}
