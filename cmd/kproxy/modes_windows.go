package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

func addPlatformModes(m app.Modes) {
	mode := m[string(config.ModeKernelspace)]
	mode.NewBackend = newHNSBackend
	mode.Cleanup = cleanupHNS
	m[string(config.ModeKernelspace)] = mode
}

// newHNSBackend starts one HNS backend per IP family; each only touches load
// balancers and endpoints of its family.
func newHNSBackend(ctx context.Context, o *config.Options, env app.Env) (app.Backends, error) {
	h, err := hns.NewHNS()
	if err != nil {
		return nil, fmt.Errorf("HNS: %w", err)
	}
	var backends app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		opts := modeconfig.HNS(o, fam, h, env)
		hostHNSOptions(&opts, os.Getenv)
		b, err := windows.New(opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fam, err)
		}
		backends = append(backends, app.FamilyBackend{Family: fam, Backend: b})
	}
	klog.FromContext(ctx).Info("HNS backend ready", "network", o.Winkernel().NetworkName)
	return backends, nil
}

// cleanupHNS removes the load balancers and remote endpoints kproxy created.
func cleanupHNS(ctx context.Context, o *config.Options) error {
	h, err := hns.NewHNS()
	if err != nil {
		return fmt.Errorf("HNS: %w", err)
	}
	var errs []error
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		opts := modeconfig.HNS(o, fam, h, app.Env{})
		opts.CNIConfig = cniConfigReader(os.Getenv) // the network the CNI names
		b, err := windows.New(opts)
		if err == nil {
			err = b.Cleanup(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam, err))
		}
	}
	return errors.Join(errs...)
}

// linuxAddrs: a dry run of a Linux mode on Windows knows no address.
func linuxAddrs() ([]netip.Addr, error) { return nil, nil }
