package main

import (
	"errors"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// Environment variables of the HNS backend on a node (docs/windows.md).
const (
	// envIPAMDataDir overrides the host-local IPAM data directory in which
	// the source VIP is reserved (default: the CNI configuration's, else
	// windows.DefaultIPAMDataDir).
	envIPAMDataDir = "KPROXY_IPAM_DATA_DIR"
	// envStateDir is where kproxy keeps what it learned on the node (the
	// HNS echoes), default defaultStateDir.
	envStateDir = "KPROXY_STATE_DIR"
)

// defaultStateDir is kproxy's state directory on a Windows node (on the
// system drive).
const defaultStateDir = `C:\var\lib\kproxy`

// hostHNSOptions sets the options that come from the node (its CNI
// configuration, its Windows build, kproxy's state directory) for a backend
// that programs the host's HNS.
func hostHNSOptions(opts *windows.Options, getenv func(string) string) {
	opts.CNIConfig = cniConfigReader(getenv)
	opts.IPAMDataDir = getenv(envIPAMDataDir)
	// Overlay networks without a configured source VIP: reserved in the
	// CNI host-local store (docs/windows.md).
	opts.ReserveSourceVIP = windows.ReserveInIPAMStore()
	dir := getenv(envStateDir)
	if dir == "" {
		dir = defaultStateDir
	}
	opts.EchoFile = filepath.Join(dir, "hns-echoes-"+strings.ToLower(string(opts.Family))+".json")
	opts.WindowsBuild = windowsBuild()
}

// cniConfigReader reads the node's CNI configuration from
// $KPROXY_CNI_CONF_DIR (a list, like PATH), else windows.DefaultCNIConfDirs.
func cniConfigReader(getenv func(string) string) func() (*windows.CNIConfig, error) {
	dirs := windows.DefaultCNIConfDirs
	if v := getenv(windows.EnvCNIConfDir); v != "" {
		dirs = filepath.SplitList(v)
	}
	return func() (*windows.CNIConfig, error) { return windows.ReadCNIConfig(dirs) }
}

// kproxy's metrics receive the HNS backend's measurements.
var _ hns.Metrics = (*metrics.Metrics)(nil)

// kernelspaceDryRun renders the HNS objects of both families as JSON, on any
// OS, without HNS: the network is taken as an L2Bridge network of that name
// (an overlay network's remote subnets can only be read from HNS).
func kernelspaceDryRun(o *config.Options) (app.Backends, error) {
	var out app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		opts := modeconfig.HNS(o, fam, nil, app.Env{})
		if opts.NetworkName == "" {
			opts.NetworkName = "dry-run"
		}
		b, err := windows.New(opts)
		if err != nil {
			return nil, err
		}
		out = append(out, app.FamilyBackend{Family: fam, Backend: b})
	}
	return out, nil
}

// classifyHNSError names the cause of an HNS backend's sync error: HNS
// unreachable or restarting is "unavailable", any other HNS call error
// "rejected"; other errors are left to metrics.Classify.
func classifyHNSError(err error) metrics.Cause {
	if hns.IsTransient(err) {
		return metrics.CauseUnavailable
	}
	var e *hns.Error
	if errors.As(err, &e) {
		return metrics.CauseRejected
	}
	return ""
}
