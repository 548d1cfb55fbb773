package config

import (
	goflag "flag"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	// Registers the "json" logging format (--logging-format=json), as
	// kube-proxy's command does; cmd/kproxy applies it.
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// kpc abbreviates the configuration type in this file.
type kpc = v1alpha1.KubeProxyConfiguration

// AddFlags registers kproxy's flags on fs: upstream kube-proxy's names and
// meanings where they exist, kproxy's own otherwise, and klog's -v/--v and
// --vmodule. Flags that set a KubeProxyConfiguration field take effect in
// Complete, and only when given explicitly; the defaults shown in the help
// are those Complete applies when neither a flag nor the file sets a field.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	d := o.defaults()

	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)

	str := func(name, field, def, usage string, set func(c *kpc, v string)) {
		p := fs.String(name, def, usage)
		o.bind(name, field, func(c *kpc) { set(c, *p) })
	}
	boolean := func(name, field string, def bool, usage string, set func(c *kpc, v bool)) {
		p := fs.Bool(name, def, usage)
		o.bind(name, field, func(c *kpc) { set(c, *p) })
	}
	i32 := func(name, field string, def int32, usage string, set func(c *kpc, v int32)) {
		p := fs.Int32(name, def, usage)
		o.bind(name, field, func(c *kpc) { set(c, *p) })
	}
	dur := func(name, field string, def time.Duration, usage string, set func(c *kpc, v time.Duration)) {
		p := fs.Duration(name, def, usage)
		o.bind(name, field, func(c *kpc) { set(c, *p) })
	}

	// kproxy's own and command-level flags.
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "Path to a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON). As upstream kube-proxy: read strictly, then leniently with a warning per unknown field; when it is given, the flags that set configuration fields are ignored (warned), except --hostname-override and the logging flags. kproxy exits when the file changes, so that its DaemonSet restarts it.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", o.WriteConfigTo, "If set, write the effective configuration (defaults, then --config or the flags) to this file and exit.")
	fs.BoolVar(&o.InitOnly, "init-only", o.InitOnly, "Perform the initialization steps that need full root privileges (OOM score, conntrack sysctls on Linux), then exit. kproxy can then run with only the NET_ADMIN and NET_RAW capabilities.")
	fs.BoolVar(&o.WindowsService, "windows-service", o.WindowsService, "Run as a Windows service, integrated with the Service Control Manager (Windows only; ignored elsewhere).")
	fs.BoolVar(&o.ProfilingAllowRemote, "profiling-allow-remote", o.ProfilingAllowRemote, "Allow --profiling (enableProfiling) when the metrics server listens on a non-loopback address; without it such a configuration is refused, since profiles expose internals to the network (kproxy's own).")
	fs.Var(cliflag.NewMapStringBool(&o.flagFeatureGates), "feature-gates", "A set of key=value pairs of feature gates. Accepted for compatibility with kube-proxy and ignored (warned): kproxy has no feature gates. Ignored if a config file is specified by --config.")
	o.bind("feature-gates", "featureGates", func(c *kpc) { c.FeatureGates = maps.Clone(o.flagFeatureGates) })
	fs.Int32Var(&o.healthzPort, "healthz-port", DefaultHealthzPort, "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", DefaultMetricsPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")
	fs.StringVar(&o.Master, "master", o.Master, "Address of the Kubernetes API server; overrides the server in the kubeconfig.")
	fs.StringVar(&o.Manifests, "manifests", o.Manifests, "Serve the Service, EndpointSlice and Node manifests (*.yaml, *.yml, *.json) in this directory instead of watching an API server; changes are picked up while running. Only regular files (or symbolic links to them) of at most 32 MiB are read; anything else with a manifest name (a named pipe, a device, a socket, a larger file) is reported once in the log and skipped.")
	fs.BoolVar(&o.DryRun, "dry-run", o.DryRun, "Print what the chosen proxy mode would program, then exit without changing the node. It fails (exit 1) when a --manifests file does not parse, or when the API server has not delivered its initial lists within 30s.")
	fs.StringVar(&o.DryRunOutput, "dry-run-output", o.DryRunOutput, "What --dry-run prints: 'rules' or 'state'. 'rules': for each IP family, exactly the input that a full sync on a node without kproxy's rules would give iptables-restore --noflush (iptables and ipvs modes) or nft -f (nftables mode), preceded by comment lines naming the family, what was left out and (iptables) the jump rules kproxy ensures separately in the built-in chains; in kernelspace mode, the HNS load balancers and endpoints as JSON. 'state': the node-local desired state as YAML (each service port with its cluster and local endpoints).")
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "Remove everything kproxy programmed on this node and, as kube-proxy's --cleanup, kube-proxy's state of every mode (Linux: iptables chains, nftables tables, ipsets, kube-ipvs0; kept with --take-over-kube-proxy=false), then exit.")
	fs.Var(&o.Version, "version", "--version, --version=raw prints version information and quits.")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.BoolVar(&o.TakeOverKubeProxy, "take-over-kube-proxy", o.TakeOverKubeProxy, "After kproxy's first successful full sync, remove the rules left by upstream kube-proxy (Linux).")
	fs.DurationVar(&o.FullSyncPeriod, "full-sync-period", o.FullSyncPeriod, "Longest time between two syncs that rewrite everything kproxy owns; syncs in between rewrite only what changed.")

	// API server connection.
	str("kubeconfig", "clientConnection.kubeconfig", d.ClientConnection.Kubeconfig, "Path to a kubeconfig file with the API server address and credentials (in-cluster configuration when empty).",
		func(c *kpc, v string) { c.ClientConnection.Kubeconfig = v })
	str("kube-api-content-type", "clientConnection.contentType", d.ClientConnection.ContentType, "Content type of requests to the API server.",
		func(c *kpc, v string) { c.ClientConnection.ContentType = v })
	qps := fs.Float32("kube-api-qps", d.ClientConnection.QPS, "Queries per second allowed to the API server.")
	o.bind("kube-api-qps", "clientConnection.qps", func(c *kpc) { c.ClientConnection.QPS = *qps })
	i32("kube-api-burst", "clientConnection.burst", d.ClientConnection.Burst, "Burst of queries allowed to the API server.",
		func(c *kpc, v int32) { c.ClientConnection.Burst = v })
	dur("config-sync-period", "configSyncPeriod", d.ConfigSyncPeriod.Duration, "How often the Node informer re-delivers this node's Node object. Services and EndpointSlices are not re-delivered: kproxy keeps only its parsed form of them and relists after every broken watch. Must be greater than 0.",
		func(c *kpc, v time.Duration) { c.ConfigSyncPeriod = metav1.Duration{Duration: v} })

	// Node identity and servers.
	str("hostname-override", "hostnameOverride", "", "Name of this node's Node object. Default: the OS hostname, lowercased. Also applies when --config is given.",
		func(c *kpc, v string) {
			if v != "" { // as upstream, an empty flag leaves the file's name
				c.HostnameOverride = strings.ToLower(strings.TrimSpace(v))
			}
		})
	o.bindings[len(o.bindings)-1].withConfig = true
	str("show-hidden-metrics-for-version", "showHiddenMetricsForVersion", d.ShowHiddenMetricsForVersion, "The previous version for which to show hidden metrics. Accepted for compatibility and ignored (warned): kproxy hides no metrics.",
		func(c *kpc, v string) { c.ShowHiddenMetricsForVersion = v })
	str("bind-address", "bindAddress", d.BindAddress, "Overrides this node's primary IP of the address's family (otherwise the Node object's first address of that family); 0.0.0.0 and :: override nothing. An IPv6 value (:: included) makes the default health and metrics server addresses IPv6 ones. As upstream, no socket is bound to it.",
		func(c *kpc, v string) { c.BindAddress = v })
	str("healthz-bind-address", "healthzBindAddress", d.HealthzBindAddress, "IP:port for the health check server (port 10256 when only an IP is given). Empty disables it.",
		func(c *kpc, v string) { c.HealthzBindAddress = v })
	str("metrics-bind-address", "metricsBindAddress", d.MetricsBindAddress, "IP:port for the metrics server (port 10249 when only an IP is given; 0.0.0.0:10249 or [::]:10249 for all interfaces). Empty disables it.",
		func(c *kpc, v string) { c.MetricsBindAddress = v })
	boolean("profiling", "enableProfiling", d.EnableProfiling, "Serve Go's profiles on /debug/pprof/ of the metrics server (off by default: they expose internals).",
		func(c *kpc, v bool) { c.EnableProfiling = v })
	boolean("bind-address-hard-fail", "bindAddressHardFail", d.BindAddressHardFail, "Exit when the health check or metrics server cannot bind its port.",
		func(c *kpc, v bool) { c.BindAddressHardFail = v })
	i32("oom-score-adj", "oomScoreAdj", *d.OOMScoreAdj, "OOM score adjustment of the kproxy process, in [-1000, 1000] (Linux).",
		func(c *kpc, v int32) { c.OOMScoreAdj = &v })

	// Proxying.
	str("proxy-mode", "mode", string(d.Mode), "Proxy mode: 'iptables' or 'nftables' (Linux), 'kernelspace' (Windows HNS); the default depends on the OS. Each one works anywhere with --dry-run. 'ipvs' is accepted on Linux and runs the iptables backend, with a warning.",
		func(c *kpc, v string) { c.Mode = v1alpha1.ProxyMode(v) })
	str("cluster-cidr", "clusterCIDR", d.ClusterCIDR, "The pods' IP range, or a comma-separated IPv4,IPv6 pair for dual-stack clusters. With --detect-local-mode=ClusterCIDR, traffic from it counts as local.",
		func(c *kpc, v string) { c.ClusterCIDR = v })
	nodePorts := fs.StringSlice("nodeport-addresses", d.NodePortAddresses, "CIDRs of the node addresses that accept NodePort connections, or 'primary' for the node's primary IPs (from its Node object). Default: every local address.")
	o.bind("nodeport-addresses", "nodePortAddresses", func(c *kpc) { c.NodePortAddresses = trimAll(*nodePorts) })
	boolean("masquerade-all", "iptables.masqueradeAll", d.IPTables.MasqueradeAll, "SNAT all traffic sent to Service cluster IPs (some network plugins need it).",
		func(c *kpc, v bool) {
			if c.Mode == ModeNFTables {
				c.NFTables.MasqueradeAll = v
				return
			}
			c.IPTables.MasqueradeAll = v
		})
	i32("iptables-masquerade-bit", "iptables.masqueradeBit", *d.IPTables.MasqueradeBit, "Bit of the packet mark that flags packets to SNAT, in [0, 31].",
		func(c *kpc, v int32) { c.IPTables.MasqueradeBit = &v })
	boolean("iptables-localhost-nodeports", "iptables.localhostNodePorts", *d.IPTables.LocalhostNodePorts, "Accept NodePort connections to 127.0.0.1 (IPv4 only, iptables mode).",
		func(c *kpc, v bool) { c.IPTables.LocalhostNodePorts = &v })
	dur("iptables-sync-period", "iptables.syncPeriod", d.IPTables.SyncPeriod.Duration, "Longest time between two syncs of the proxy rules. Must be greater than 0. Ignored in ipvs mode (see --ipvs-sync-period).",
		func(c *kpc, v time.Duration) { setSyncPeriod(c, false, false, v) })
	dur("iptables-min-sync-period", "iptables.minSyncPeriod", d.IPTables.MinSyncPeriod.Duration, "Shortest time between two syncs of the proxy rules; 0 syncs on every change. Ignored in ipvs mode (see --ipvs-min-sync-period).",
		func(c *kpc, v time.Duration) { setSyncPeriod(c, false, true, v) })

	// IPVS: kproxy runs its iptables backend for mode ipvs; these periods
	// apply then, as upstream; the scheduler sets the node-wide
	// load-balancing algorithm (see IPVSScheduler) and the rest is accepted
	// and warned about.
	dur("ipvs-sync-period", "ipvs.syncPeriod", d.IPVS.SyncPeriod.Duration, "In ipvs mode: longest time between two syncs of the proxy rules. Must be greater than 0.",
		func(c *kpc, v time.Duration) { setSyncPeriod(c, true, false, v) })
	dur("ipvs-min-sync-period", "ipvs.minSyncPeriod", d.IPVS.MinSyncPeriod.Duration, "In ipvs mode: shortest time between two syncs of the proxy rules; 0 syncs on every change.",
		func(c *kpc, v time.Duration) { setSyncPeriod(c, true, true, v) })
	str("ipvs-scheduler", "ipvs.scheduler", d.IPVS.Scheduler, "The ipvs scheduler when the proxy mode is ipvs: the node-wide load-balancing algorithm of Services without the kproxy.io/load-balancing annotation (rr: round-robin, sh: source-hash, lc: least-connection; others: random, warned).",
		func(c *kpc, v string) { c.IPVS.Scheduler = v })
	ipvsExclude := fs.StringSlice("ipvs-exclude-cidrs", d.IPVS.ExcludeCIDRs, "CIDRs the ipvs proxier should not touch when cleaning up IPVS rules. Accepted for compatibility and ignored (warned).")
	o.bind("ipvs-exclude-cidrs", "ipvs.excludeCIDRs", func(c *kpc) { c.IPVS.ExcludeCIDRs = trimAll(*ipvsExclude) })
	boolean("ipvs-strict-arp", "ipvs.strictARP", d.IPVS.StrictARP, "Set arp_ignore to 1 and arp_announce to 2 (ipvs mode). Accepted for compatibility and ignored (warned).",
		func(c *kpc, v bool) { c.IPVS.StrictARP = v })
	dur("ipvs-tcp-timeout", "ipvs.tcpTimeout", d.IPVS.TCPTimeout.Duration, "Idle timeout of IPVS TCP connections. Accepted for compatibility and ignored (warned).",
		func(c *kpc, v time.Duration) { c.IPVS.TCPTimeout = metav1.Duration{Duration: v} })
	dur("ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", d.IPVS.TCPFinTimeout.Duration, "Timeout of IPVS TCP connections after a FIN. Accepted for compatibility and ignored (warned).",
		func(c *kpc, v time.Duration) { c.IPVS.TCPFinTimeout = metav1.Duration{Duration: v} })
	dur("ipvs-udp-timeout", "ipvs.udpTimeout", d.IPVS.UDPTimeout.Duration, "Timeout of IPVS UDP packets. Accepted for compatibility and ignored (warned).",
		func(c *kpc, v time.Duration) { c.IPVS.UDPTimeout = metav1.Duration{Duration: v} })
	str("detect-local-mode", "detectLocalMode", string(d.DetectLocalMode), "How traffic from local pods is recognised: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.",
		func(c *kpc, v string) { c.DetectLocalMode = v1alpha1.LocalMode(v) })
	str("pod-bridge-interface", "detectLocal.bridgeInterface", d.DetectLocal.BridgeInterface, "With --detect-local-mode=BridgeInterface: traffic arriving from this bridge is local.",
		func(c *kpc, v string) { c.DetectLocal.BridgeInterface = v })
	str("pod-interface-name-prefix", "detectLocal.interfaceNamePrefix", d.DetectLocal.InterfaceNamePrefix, "With --detect-local-mode=InterfaceNamePrefix: traffic arriving from interfaces whose name starts with this is local.",
		func(c *kpc, v string) { c.DetectLocal.InterfaceNamePrefix = v })

	// Conntrack (Linux).
	i32("conntrack-max-per-core", "conntrack.maxPerCore", *d.Conntrack.MaxPerCore, "Conntrack table entries per CPU core; 0 leaves the limit (and --conntrack-min) alone.",
		func(c *kpc, v int32) { c.Conntrack.MaxPerCore = &v })
	i32("conntrack-min", "conntrack.min", *d.Conntrack.Min, "Lowest conntrack table size, whatever --conntrack-max-per-core gives.",
		func(c *kpc, v int32) { c.Conntrack.Min = &v })
	dur("conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", d.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout of established TCP connections; 0 leaves the kernel's value.",
		func(c *kpc, v time.Duration) { c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: v} })
	dur("conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", d.Conntrack.TCPCloseWaitTimeout.Duration, "Timeout of TCP connections in CLOSE_WAIT; 0 leaves the kernel's value.",
		func(c *kpc, v time.Duration) { c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: v} })
	boolean("conntrack-tcp-be-liberal", "conntrack.tcpBeLiberal", d.Conntrack.TCPBeLiberal, "Set nf_conntrack_tcp_be_liberal: do not mark out-of-window TCP packets invalid.",
		func(c *kpc, v bool) { c.Conntrack.TCPBeLiberal = v })
	dur("conntrack-udp-timeout", "conntrack.udpTimeout", d.Conntrack.UDPTimeout.Duration, "Idle timeout of unreplied UDP flows; 0 leaves the kernel's value.",
		func(c *kpc, v time.Duration) { c.Conntrack.UDPTimeout = metav1.Duration{Duration: v} })
	dur("conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", d.Conntrack.UDPStreamTimeout.Duration, "Idle timeout of assured UDP flows; 0 leaves the kernel's value.",
		func(c *kpc, v time.Duration) { c.Conntrack.UDPStreamTimeout = metav1.Duration{Duration: v} })

	// Windows HNS (kernelspace mode).
	str("network-name", "winkernel.networkName", d.Winkernel.NetworkName, "HNS network whose Services kproxy programs (kernelspace mode). Default: the KUBE_NETWORK environment variable.",
		func(c *kpc, v string) { c.Winkernel.NetworkName = v })
	str("source-vip", "winkernel.sourceVip", d.Winkernel.SourceVip, "Source VIP of load-balanced traffic on overlay networks (kernelspace mode).",
		func(c *kpc, v string) { c.Winkernel.SourceVip = v })
	boolean("enable-dsr", "winkernel.enableDSR", d.Winkernel.EnableDSR, "Use direct server return for load balancers (kernelspace mode).",
		func(c *kpc, v bool) { c.Winkernel.EnableDSR = v })
	str("root-hnsendpoint-name", "winkernel.rootHnsEndpointName", d.Winkernel.RootHnsEndpointName, "Name of the host's HNS endpoint on l2bridge networks (kernelspace mode).",
		func(c *kpc, v string) { c.Winkernel.RootHnsEndpointName = v })
	boolean("forward-healthcheck-vip", "winkernel.forwardHealthCheckVip", d.Winkernel.ForwardHealthCheckVip, "Also load-balance the health check node port on the Service VIP (kernelspace mode).",
		func(c *kpc, v bool) { c.Winkernel.ForwardHealthCheckVip = v })

	addKlogFlags(fs)
	addLoggingFlags(fs, &o.flagLogging)
}

// setSyncPeriod applies --iptables-(min-)sync-period (ipvs false) or
// --ipvs-(min-)sync-period (ipvs true) as upstream: each only in its modes,
// the iptables flags also setting nftables mode's periods.
func setSyncPeriod(c *kpc, ipvs, minimum bool, v time.Duration) {
	d := metav1.Duration{Duration: v}
	switch {
	case ipvs != (c.Mode == ModeIPVS):
		return
	case ipvs && minimum:
		c.IPVS.MinSyncPeriod = d
	case ipvs:
		c.IPVS.SyncPeriod = d
	case c.Mode == ModeNFTables && minimum:
		c.NFTables.MinSyncPeriod = d
	case c.Mode == ModeNFTables:
		c.NFTables.SyncPeriod = d
	case minimum:
		c.IPTables.MinSyncPeriod = d
	default:
		c.IPTables.SyncPeriod = d
	}
}

// loggingFlagNames are the logging flags besides -v and --vmodule, as
// component-base registers them for upstream kube-proxy.
var loggingFlagNames = []string{"logging-format", "log-flush-frequency", "log-text-split-stream", "log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

// loggingFlagSet returns component-base's logging flags bound to l, as
// upstream registers them (the log-json-* ones come with the JSON format,
// which this package links, as kube-proxy does).
func loggingFlagSet(l *logsapi.LoggingConfiguration) *pflag.FlagSet {
	fs := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logsapi.AddFlags(l, fs)
	return fs
}

// addLoggingFlags adds upstream's logging flags other than -v and
// --vmodule (klog's own, added by addKlogFlags) to fs, bound to l.
func addLoggingFlags(fs *pflag.FlagSet, l *logsapi.LoggingConfiguration) {
	lfs := loggingFlagSet(l)
	for _, name := range loggingFlagNames {
		if f := lfs.Lookup(name); f != nil && fs.Lookup(name) == nil {
			fs.AddFlag(f)
		}
	}
}

// copyLoggingFlags copies the logging flags given on the command line into
// l (they win over the config file, as upstream).
func copyLoggingFlags(fs *pflag.FlagSet, l *logsapi.LoggingConfiguration, setBy map[string]string) error {
	lfs := loggingFlagSet(l)
	for _, name := range loggingFlagNames {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		if err := lfs.Set(name, f.Value.String()); err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
		setBy["logging"] = name
	}
	return nil
}
func (o *Options) bind(flag, field string, apply func(c *kpc)) {
	o.bindings = append(o.bindings, binding{flag: flag, field: field, apply: apply})
}

// addKlogFlags adds klog's -v/--v and --vmodule to fs (upstream kube-proxy
// exposes these two; klog's file-output flags are left out).
func addKlogFlags(fs *pflag.FlagSet) {
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	for _, name := range []string{"v", "vmodule"} {
		if f := gfs.Lookup(name); f != nil && fs.Lookup(name) == nil {
			fs.AddGoFlag(f)
		}
	}
}

func trimAll(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
