package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/platform/linux"
)

func addPlatformModes(m app.Modes) {
	mode := m[string(config.ModeIPTables)]
	mode.NewBackend = newIPTablesBackend
	mode.Cleanup = cleanupIPTables
	m[string(config.ModeIPTables)] = mode
}

// newIPTablesBackend starts one backend per IP family the node's iptables
// tools support: IPv4 always, IPv6 unless ip6tables is unusable (a node
// without IPv6 gets an IPv4-only proxy, and says so).
func newIPTablesBackend(ctx context.Context, o *config.Options, env app.Env) (app.Backends, error) {
	log := klog.FromContext(ctx)
	tuneNode(log, o)
	var backends app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		sys, err := linux.NewSystem(fam, linux.FlavourAuto)
		if err != nil {
			if fam == v1.IPv6Protocol {
				log.Info("IPv6 Services are not proxied: the IPv6 iptables tools are unusable", "err", err)
				continue
			}
			return nil, fmt.Errorf("%s: %w", fam, err)
		}
		if fam == v1.IPv6Protocol && !linux.HasIPv6(sys.Host) {
			log.Info("IPv6 Services are not proxied: the node has no IPv6 address (other than loopback and link-local)")
			continue
		}
		cfg := iptablesConfig(o, fam)
		cfg.RandomFully = linux.HasRandomFully(sys.Iptables)
		b, err := linux.New(linux.Options{
			Rules:        cfg,
			KeepUpstream: !o.TakeOverKubeProxy,
			Iptables:     sys.Iptables,
			NFTables:     sys.NFTables,
			Conntrack:    sys.Conntrack,
			Host:         sys.Host,
			Metrics:      env.Metrics.IPTables(fam),
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fam, err)
		}
		log.Info("iptables backend ready", "family", fam, "tools", sys.Iptables.Describe())
		// Weights of least-connection Services, from conntrack (idle
		// without such Services).
		go b.RunLeastConnection(ctx)
		backends = append(backends, app.FamilyBackend{Family: fam, Backend: b})
	}
	return backends, nil
}

// cleanupIPTables removes everything kproxy owns, in both families.
func cleanupIPTables(ctx context.Context, o *config.Options) error {
	var errs []error
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		sys, err := linux.NewSystem(fam, linux.FlavourAuto)
		if err != nil {
			if fam == v1.IPv6Protocol {
				continue // nothing can have been programmed
			}
			errs = append(errs, fmt.Errorf("%s: %w", fam, err))
			continue
		}
		b, err := linux.New(linux.Options{Rules: iptablesConfig(o, fam), Iptables: sys.Iptables, NFTables: sys.NFTables,
			Conntrack: sys.Conntrack, Host: sys.Host})
		if err == nil {
			err = b.Cleanup(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam, err))
		}
	}
	return errors.Join(errs...)
}

func dryRunHost() linux.Host {
	if sys, err := linux.NewSystem(v1.IPv4Protocol, linux.FlavourAuto); err == nil {
		return sys.Host
	}
	return &linux.FakeHost{}
}

// tuneNode applies, once at start, the process and kernel settings kube-proxy
// applies: kproxy's OOM score and the conntrack sysctls. Failures are
// logged, never fatal (a read-only /proc/sys, or nf_conntrack_max outside
// the host's network namespace).
func tuneNode(log klog.Logger, o *config.Options) {
	if err := linux.SetOOMScoreAdj(int(o.OOMScoreAdj())); err != nil {
		log.Info("Warning: could not set the OOM score adjustment", "err", err)
	}
	ct := o.Conntrack()
	s := linux.ConntrackSettings{
		Max:                   ct.Max(runtime.NumCPU()),
		TCPEstablishedTimeout: ct.TCPEstablishedTimeout,
		TCPCloseWaitTimeout:   ct.TCPCloseWaitTimeout,
		TCPBeLiberal:          ct.TCPBeLiberal,
		UDPTimeout:            ct.UDPTimeout,
		UDPStreamTimeout:      ct.UDPStreamTimeout,
	}
	if err := linux.TuneConntrack(linux.ProcHost(), s); err != nil {
		log.Info("Warning: some conntrack settings were not applied", "err", err)
	} else if len(s.Sysctls()) > 0 {
		log.V(2).Info("Conntrack settings applied", "sysctls", s.Sysctls())
	}
}
