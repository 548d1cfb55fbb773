package main

import (
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/platform/windows"
)

// kproxy's metrics receive the HNS backend's measurements.
var _ windows.Metrics = (*metrics.Metrics)(nil)

// hnsOptions maps kproxy's configuration onto the HNS backend's for one IP
// family. hns is nil for a dry run.
func hnsOptions(o *config.Options, family v1.IPFamily, hns windows.HNS, env app.Env) windows.Options {
	w := o.Winkernel()
	opts := windows.Options{
		HNS:                   hns,
		Family:                family,
		NetworkName:           w.NetworkName,
		SourceVIP:             w.SourceVIP,
		EnableDSR:             w.EnableDSR,
		RootHNSEndpointName:   w.RootHNSEndpointName,
		ForwardHealthCheckVIP: w.ForwardHealthCheckVIP,
		CheckPeriod:           o.SyncPeriod(),
		Logger:                env.Logger,
	}
	if env.Metrics != nil {
		opts.Metrics = env.Metrics
	}
	if hz, ok := o.HealthzBindAddress(); ok {
		opts.HealthzPort = int(hz.Port())
	}
	return opts
}

// kernelspaceDryRun renders the HNS objects of both families as JSON, on any
// OS, without HNS: the network is taken as an L2Bridge network of that name
// (an overlay network's remote subnets can only be read from HNS).
func kernelspaceDryRun(o *config.Options) (app.Backends, error) {
	var out app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		opts := hnsOptions(o, fam, nil, app.Env{})
		if opts.NetworkName == "" {
			opts.NetworkName = "dry-run"
		}
		b, err := windows.New(opts)
		if err != nil {
			return nil, err
		}
		out = append(out, app.FamilyBackend{Family: fam, Snapshots: b})
	}
	return out, nil
}

// classifyHNSError names the cause of an HNS backend's sync error: HNS
// unreachable or restarting is "unavailable", any other HNS call error
// "rejected"; other errors are left to metrics.Classify.
func classifyHNSError(err error) metrics.Cause {
	if windows.IsTransient(err) {
		return metrics.CauseUnavailable
	}
	var e *windows.Error
	if errors.As(err, &e) {
		return metrics.CauseRejected
	}
	return ""
}
