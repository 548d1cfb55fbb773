package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/logging"
	"github.com/kproxy/kproxy/pkg/metrics"
	"github.com/kproxy/kproxy/platform/linux"
	"github.com/kproxy/kproxy/platform/linux/nftables"
)

func addPlatformModes(m app.Modes) {
	mode := m[string(config.ModeIPTables)]
	mode.NewBackend = newIPTablesBackend
	mode.Cleanup = cleanupLinux
	mode.Init = initNode
	m[string(config.ModeIPTables)] = mode
	mode = m[string(config.ModeNFTables)]
	mode.NewBackend = newNFTablesBackend
	mode.Cleanup = cleanupLinux
	mode.Init = initNode
	m[string(config.ModeNFTables)] = mode
}

// newNFTablesBackend starts one nftables backend per IP family (IPv6 only
// when the node has IPv6). Each owns the table "kproxy" of its family; after
// its first full sync it removes kproxy's iptables chains (a switch from
// the iptables mode) and, unless --take-over-kube-proxy=false, kube-proxy's
// state of every mode.
func newNFTablesBackend(ctx context.Context, o *config.Options, env app.Env) (app.Backends, error) {
	log := klog.FromContext(ctx)
	tuneNode(log, o)
	if major, minor, ok := linux.KernelVersion(); ok && (major < 5 || major == 5 && minor < 13) {
		logging.Warning(log, "The nftables mode needs Linux 5.13 or later (as upstream kube-proxy's); this kernel may reject kproxy's rules",
			"kernel", fmt.Sprintf("%d.%d", major, minor))
	}
	var backends app.Backends
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		host := linux.ProcHost()
		if fam == v1.IPv6Protocol && !linux.HasIPv6(host) {
			log.Info("IPv6 Services are not proxied: the node has no IPv6 address (other than loopback and link-local)")
			continue
		}
		n, err := nftables.NewSystem(nftables.Family(fam))
		if err != nil {
			if fam == v1.IPv6Protocol {
				log.Info("IPv6 Services are not proxied: nftables is unusable for IPv6", "err", err)
				continue
			}
			return nil, fmt.Errorf("%s: the nftables mode needs the nft tool and nftables in the kernel: %w", fam, err)
		}
		cfg := modeconfig.NFTables(o, fam)
		takeOver := o.TakeOverKubeProxy
		b, err := linux.NewNFT(linux.NFTOptions{
			Rules:     cfg,
			NFT:       n,
			Conntrack: linux.NetlinkConntrack(),
			Host:      host,
			Metrics:   env.Metrics.NFTables(fam),
			Logger:    log,
			TakeOver: func(ctx context.Context) error {
				return takeOverFromIptables(ctx, o, fam, takeOver)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fam, err)
		}
		log.Info("nftables backend ready", "family", fam, "table", fmt.Sprintf("%s %s", nftables.Family(fam), nftables.TableName))
		backends = append(backends, app.FamilyBackend{Family: fam, Backend: b})
	}
	return backends, nil
}

// takeOverFromIptables removes, once kproxy's nftables table serves the
// family, kproxy's own iptables chains and, with upstream, kube-proxy's
// iptables chains (both flavours) and nftables table of the family.
func takeOverFromIptables(ctx context.Context, o *config.Options, fam v1.IPFamily, upstream bool) error {
	log := klog.FromContext(ctx)
	var errs []error
	if sys, err := linux.NewSystem(fam, linux.FlavourAuto); err == nil {
		b, err := linux.New(linux.Options{Rules: modeconfig.IPTables(o, fam), Iptables: sys.Iptables, NFTables: sys.NFTables,
			Conntrack: sys.Conntrack, Host: sys.Host})
		if err == nil {
			err = b.Cleanup(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("kproxy's iptables chains: %w", err))
		}
		if upstream {
			if deleted, err := linux.CleanupUpstreamNFTables(ctx, sys.NFTables, fam); err != nil {
				errs = append(errs, fmt.Errorf("kube-proxy's nftables table: %w", err))
			} else if deleted {
				log.Info("Took over from kube-proxy: deleted its nftables table", "family", fam)
			}
		}
	}
	if upstream {
		for _, fl := range []linux.Flavour{linux.FlavourLegacy, linux.FlavourNFT} {
			ipt, err := linux.NewSystemIptables(fam, fl)
			if err != nil {
				continue
			}
			removed, err := linux.CleanupUpstreamIptables(ctx, ipt)
			if err != nil {
				errs = append(errs, fmt.Errorf("kube-proxy's iptables chains (%s): %w", fl, err))
			} else if len(removed) > 0 {
				log.Info("Took over from kube-proxy: removed its iptables chains", "family", fam, "flavour", fl, "chains", len(removed))
			}
		}
	}
	return errors.Join(errs...)
}

// newIPTablesBackend starts one backend per IP family the node's iptables
// tools support: IPv4 always, IPv6 unless ip6tables is unusable (a node
// without IPv6 gets an IPv4-only proxy, and says so).
func newIPTablesBackend(ctx context.Context, o *config.Options, env app.Env) (app.Backends, error) {
	log := klog.FromContext(ctx)
	tuneNode(log, o)
	var backends app.Backends
	flavours := map[v1.IPFamily]linux.Flavour{}
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
		cfg := modeconfig.IPTables(o, fam)
		cfg.RandomFully = linux.HasRandomFully(sys.Iptables)
		b, err := linux.New(linux.Options{
			Rules:        cfg,
			KeepUpstream: !o.TakeOverKubeProxy,
			Iptables:     sys.Iptables,
			NFTables:     sys.NFTables,
			Conntrack:    sys.Conntrack,
			Host:         sys.Host,
			Metrics:      env.Metrics.IPTables(fam),
			Logger:       log,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fam, err)
		}
		log.Info("iptables backend ready", "family", fam, "tools", sys.Iptables.Describe())
		// Weights of least-connection Services, from conntrack (idle
		// without such Services).
		backends = append(backends, app.FamilyBackend{Family: fam, Backend: b})
		flavours[fam] = sys.Flavour
	}
	env.Metrics.IPTablesPacketCounters(func() (metrics.PacketCounters, error) {
		return readPacketCounters(ctx, flavours)
	})
	return backends, nil
}

// readPacketCounters reads, at a scrape, the counters of the rules behind
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total and
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total in each
// family (two small filter chains per family).
func readPacketCounters(ctx context.Context, flavours map[v1.IPFamily]linux.Flavour) (metrics.PacketCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := metrics.PacketCounters{InvalidDropped: map[string]uint64{}, LocalhostNodePortsAccepted: map[string]uint64{}}
	var errs []error
	for fam, fl := range flavours {
		pc, err := linux.ReadPacketCounters(ctx, fam, fl)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if pc.FoundInvalidDropped {
			out.InvalidDropped[string(fam)] = pc.InvalidDropped
		}
		if pc.FoundLocalhostNodePortsAccepted {
			out.LocalhostNodePortsAccepted[string(fam)] = pc.LocalhostNodePortsAccepted
		}
	}
	if err := errors.Join(errs...); err != nil {
		klog.FromContext(ctx).V(2).Info("Reading rule counters for the packet metrics failed; serving the last values", "err", err)
	}
	return out, nil
}

// cleanupLinux is --cleanup in every Linux mode: it removes everything
// kproxy owns, in both families and both modes (iptables chains, nftables
// tables), then, as upstream kube-proxy's --cleanup does, kube-proxy's
// state of every mode (cleanupUpstream) — unless --take-over-kube-proxy=false,
// which keeps kube-proxy's state (the rollback DaemonSet runs it that way,
// next to a running kube-proxy).
func cleanupLinux(ctx context.Context, o *config.Options) error {
	errs := []error{cleanupOwn(ctx, o)}
	if o.TakeOverKubeProxy {
		errs = append(errs, cleanupUpstream(ctx))
	} else {
		klog.FromContext(ctx).Info("Cleanup: kube-proxy's state left in place (--take-over-kube-proxy=false)")
	}
	return errors.Join(errs...)
}

// cleanupOwn removes everything kproxy owns, in both families.
func cleanupOwn(ctx context.Context, o *config.Options) error {
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
		b, err := linux.New(linux.Options{Rules: modeconfig.IPTables(o, fam), Iptables: sys.Iptables, NFTables: sys.NFTables,
			Conntrack: sys.Conntrack, Host: sys.Host})
		if err == nil {
			err = b.Cleanup(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam, err))
		}
		if deleted, err := linux.DeleteOwnNFTable(ctx, sys.NFTables, fam); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fam, err))
		} else if deleted {
			klog.FromContext(ctx).Info("Cleanup: deleted kproxy's nftables table", "family", fam)
		}
	}
	return errors.Join(errs...)
}

// cleanupUpstream removes what upstream kube-proxy leaves on a node, in
// every mode, as its own --cleanup does: the iptables chains of its iptables
// and ipvs modes (both families, both iptables flavours), its nftables
// tables "ip kube-proxy" and "ip6 kube-proxy", and for the ipvs mode its
// KUBE-* ipsets (skipped, and said, when the ipset tool is missing) and its
// dummy interface kube-ipvs0. IPVS virtual servers are not removed (said in
// the log when there are some).
func cleanupUpstream(ctx context.Context) error {
	log := klog.FromContext(ctx)
	var errs []error
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, fl := range []linux.Flavour{linux.FlavourLegacy, linux.FlavourNFT} {
			ipt, err := linux.NewSystemIptables(fam, fl)
			if err != nil {
				log.V(2).Info("Cleanup: no iptables tools of this flavour", "family", fam, "flavour", fl, "err", err)
				continue
			}
			removed, err := linux.CleanupUpstreamIptables(ctx, ipt)
			if err != nil {
				errs = append(errs, fmt.Errorf("kube-proxy's %s iptables chains (%s): %w", fam, fl, err))
			} else if len(removed) > 0 {
				log.Info("Cleanup: removed kube-proxy's iptables chains", "family", fam, "flavour", fl, "chains", removed)
			}
		}
		sys, err := linux.NewSystem(fam, linux.FlavourAuto)
		if err != nil {
			continue
		}
		deleted, err := linux.CleanupUpstreamNFTables(ctx, sys.NFTables, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy's %s nftables table: %w", fam, err))
		} else if deleted {
			log.Info("Cleanup: deleted kube-proxy's nftables table", "family", fam)
		}
	}
	sets, err := linux.CleanupUpstreamIPSets(ctx, linux.SystemIPSets())
	switch {
	case errors.Is(err, linux.ErrNoIPSetTool):
		log.Info("Cleanup: ipset is not installed; kube-proxy's ipvs-mode ipsets, if any, were not looked for")
	case err != nil:
		errs = append(errs, fmt.Errorf("kube-proxy's ipsets: %w", err))
	}
	if len(sets) > 0 {
		log.Info("Cleanup: destroyed kube-proxy's ipsets", "sets", sets)
	}
	if deleted, err := linux.DeleteUpstreamIPVSInterface(); err != nil {
		errs = append(errs, err)
	} else if deleted {
		log.Info("Cleanup: deleted kube-proxy's interface", "interface", linux.UpstreamIPVSInterface)
	}
	// Unlike upstream's --cleanup, IPVS virtual servers are not flushed
	// (docs/compatibility.md, "kube-proxy compatibility"): say so.
	if n, err := linux.IPVSVirtualServers(); err != nil {
		log.V(2).Info("Cleanup: could not read the IPVS table", "err", err)
	} else if n > 0 {
		logging.Warning(log, "Cleanup: IPVS virtual servers are left in place (upstream kube-proxy's --cleanup flushes them, kproxy's does not); remove them with 'ipvsadm --clear' once no other software on the node uses IPVS", "virtualServers", n)
	}
	return errors.Join(errs...)
}

// linuxAddrs lists the node's addresses for the Linux modes, over netlink.
func linuxAddrs() ([]netip.Addr, error) { return linux.ProcHost().LocalAddresses() }

// tuneNode applies, once at start, the process and kernel settings kube-proxy
// applies: kproxy's OOM score and the conntrack sysctls. Failures are
// logged, never fatal (a read-only /proc/sys, or nf_conntrack_max outside
// the host's network namespace).
func tuneNode(log klog.Logger, o *config.Options) {
	if err := linux.SetOOMScoreAdj(int(o.OOMScoreAdj())); err != nil {
		logging.Warning(log, "Could not set the OOM score adjustment", "err", err)
	}
	s := conntrackSettings(o)
	if err := linux.TuneConntrack(linux.ProcHost(), s); err != nil {
		logging.Warning(log, "Some conntrack settings were not applied", "err", err)
	} else if len(s.Sysctls()) > 0 {
		log.V(2).Info("Conntrack settings applied", "sysctls", s.Sysctls())
	}
}

// initNode is --init-only: what needs full privileges (the OOM score and
// the conntrack sysctls), failing on any error, as upstream. A kproxy
// started afterwards with only NET_ADMIN and NET_RAW finds the sysctls
// already at their values and writes nothing.
func initNode(ctx context.Context, o *config.Options) error {
	return initNodeWith(ctx, o, linux.SetOOMScoreAdj, linux.ProcHost())
}

// initNodeWith is initNode with the OOM score and the sysctls written
// through setOOM and host.
func initNodeWith(ctx context.Context, o *config.Options, setOOM func(int) error, host linux.Host) error {
	var errs []error
	if err := setOOM(int(o.OOMScoreAdj())); err != nil {
		errs = append(errs, err)
	}
	s := conntrackSettings(o)
	if err := linux.TuneConntrack(host, s); err != nil {
		errs = append(errs, err)
	}
	// The backend enables route_localnet for IPv4 localhost NodePorts; set
	// it here so that an unprivileged kproxy finds it set (see
	// iptablesConfig for the condition).
	if o.LocalhostNodePorts() && o.NodePortAddresses().IncludesIPv4Loopback() {
		if err := host.SetSysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("--init-only: %w", err)
	}
	klog.FromContext(ctx).Info("Initialization done", "sysctls", s.Sysctls())
	return nil
}

func conntrackSettings(o *config.Options) linux.ConntrackSettings {
	ct := o.Conntrack()
	return linux.ConntrackSettings{
		Max:                   ct.Max(runtime.NumCPU()),
		TCPEstablishedTimeout: ct.TCPEstablishedTimeout,
		TCPCloseWaitTimeout:   ct.TCPCloseWaitTimeout,
		TCPBeLiberal:          ct.TCPBeLiberal,
		UDPTimeout:            ct.UDPTimeout,
		UDPStreamTimeout:      ct.UDPStreamTimeout,
	}
}
