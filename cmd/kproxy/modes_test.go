package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"reflect"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// exitError returns a real *exec.ExitError.
func exitError(t *testing.T) error {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("needs a POSIX shell")
	}
	err := exec.CommandContext(context.Background(), "sh", "-c", "exit 2").Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("sh -c 'exit 2': %v", err)
	}
	return err
}

func TestClassifyErrors(t *testing.T) {
	hnsErr := hns.NewError(hns.OpCreateLoadBalancer, hns.CodePortAlreadyExists, errors.New("port exists"))
	hnsDown := hns.NewError(hns.OpListLoadBalancers, hns.CodeManagerStopped, errors.New("stopped"))
	for _, tc := range []struct {
		name     string
		classify func(error) metrics.Cause
		err      error
		want     metrics.Cause
	}{
		{"iptables-restore exited", classifyIPTablesError, fmt.Errorf("iptables-nft: writing 3 chains: %w", exitError(t)), metrics.CauseRejected},
		{"iptables other error", classifyIPTablesError, errors.New("deleting stale IPv4 conntrack flows: netlink"), metrics.CauseOther},
		{"iptables deadline", classifyIPTablesError, fmt.Errorf("restore: %w", context.DeadlineExceeded), metrics.CauseTimeout},
		{"HNS call error", classifyHNSError, fmt.Errorf("load balancer demo/web: %w", hnsErr), metrics.CauseRejected},
		{"HNS restarting", classifyHNSError, errors.Join(errors.New("other"), hnsDown), metrics.CauseUnavailable},
		{"HNS plan error", classifyHNSError, plan.ErrNoSourceVIP, metrics.CauseOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := metrics.Classify(tc.err, tc.classify); got != tc.want {
				t.Errorf("cause %q, want %q", got, tc.want)
			}
		})
	}
	for name, m := range modes() {
		if m.ClassifyError == nil {
			t.Errorf("mode %s has no error classifier", name)
		}
	}
}

func TestHNSOptionsMetrics(t *testing.T) {
	o := config.NewOptions()
	m := metrics.New(metrics.Options{Mode: metrics.ModeKernelspace})
	if got := modeconfig.HNS(o, v1.IPv4Protocol, nil, app.Env{Metrics: m}).Metrics; got != hns.Metrics(m) {
		t.Errorf("Metrics = %v, want kproxy's", got)
	}
	if got := modeconfig.HNS(o, v1.IPv4Protocol, nil, app.Env{}).Metrics; got != nil {
		t.Errorf("dry run Metrics = %#v, want nil (the backend's no-op default)", got)
	}
}

// TestModeSettings: the kernelspace mode's intent settings, as the daemon
// and kproxy explain build them, are windows.Settings (pods always told
// apart, preserve-destination honoured); the Linux modes honour neither by
// themselves (upstream's Linux proxies ignore preserve-destination).
func TestModeSettings(t *testing.T) {
	for _, mode := range []v1alpha1.ProxyMode{config.ModeIPTables, config.ModeNFTables, config.ModeKernelspace} {
		o := config.NewOptions()
		o.Config.Mode = mode
		m := modes()[string(mode)]
		daemon, explained := app.Settings(o, m), modeconfig.Settings(o)
		if !reflect.DeepEqual(daemon, explained) {
			t.Errorf("%s: the daemon's settings %+v, explain's %+v", mode, daemon, explained)
		}
		win := mode == config.ModeKernelspace
		if daemon.PreserveDestination != win || daemon.PodsAlwaysKnown != win {
			t.Errorf("%s: settings %+v, want preserve-destination and pods always known %v", mode, daemon, win)
		}
		if win && (daemon.PreserveDestination != windows.Settings.PreserveDestination || daemon.PodsAlwaysKnown != windows.Settings.PodsAlwaysKnown) {
			t.Errorf("kernelspace settings %+v, windows.Settings %+v", daemon, windows.Settings)
		}
	}
}
