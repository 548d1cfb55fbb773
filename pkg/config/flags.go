package config

import (
	goflag "flag"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "Path to a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON), read strictly. Flags given explicitly override its values.")
	fs.StringVar(&o.Master, "master", o.Master, "Address of the Kubernetes API server; overrides the server in the kubeconfig.")
	fs.StringVar(&o.Manifests, "manifests", o.Manifests, "Serve the Service, EndpointSlice and Node manifests (*.yaml, *.yml, *.json) in this directory instead of watching an API server; changes are picked up while running. Only regular files (or symbolic links to them) of at most 32 MiB are read; anything else with a manifest name (a named pipe, a device, a socket, a larger file) is reported once in the log and skipped.")
	fs.BoolVar(&o.DryRun, "dry-run", o.DryRun, "Print what the chosen proxy mode would program, then exit without changing the node.")
	fs.StringVar(&o.DryRunOutput, "dry-run-output", o.DryRunOutput, "What --dry-run prints: 'rules' (the exact iptables-restore input or HNS objects of the proxy mode) or 'state' (the node-local desired state as YAML: each service port with its cluster and local endpoints).")
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "Remove everything kproxy programmed on this node, then exit.")
	fs.BoolVar(&o.Version, "version", o.Version, "Print the version and exit.")
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
	str("hostname-override", "hostnameOverride", "", "Name of this node's Node object. Default: the OS hostname, lowercased.",
		func(c *kpc, v string) { c.HostnameOverride = strings.ToLower(strings.TrimSpace(v)) })
	str("bind-address", "bindAddress", d.BindAddress, "This node's primary IP address, overriding the one from the Node object; 0.0.0.0 or :: only select the primary IP family. No socket is bound to it.",
		func(c *kpc, v string) { c.BindAddress = v })
	str("healthz-bind-address", "healthzBindAddress", d.HealthzBindAddress, "IP:port for the health check server (port 10256 when only an IP is given). Empty disables it.",
		func(c *kpc, v string) { c.HealthzBindAddress = appendPortIfNeeded(v, DefaultHealthzPort) })
	str("metrics-bind-address", "metricsBindAddress", d.MetricsBindAddress, "IP:port for the metrics server (port 10249 when only an IP is given; 0.0.0.0:10249 or [::]:10249 for all interfaces). Empty disables it.",
		func(c *kpc, v string) { c.MetricsBindAddress = appendPortIfNeeded(v, DefaultMetricsPort) })
	boolean("profiling", "enableProfiling", d.EnableProfiling, "Serve Go's profiles on /debug/pprof/ of the metrics server (off by default: they expose internals).",
		func(c *kpc, v bool) { c.EnableProfiling = v })
	boolean("bind-address-hard-fail", "bindAddressHardFail", d.BindAddressHardFail, "Exit when the health check or metrics server cannot bind its port.",
		func(c *kpc, v bool) { c.BindAddressHardFail = v })
	i32("oom-score-adj", "oomScoreAdj", *d.OOMScoreAdj, "OOM score adjustment of the kproxy process, in [-1000, 1000] (Linux).",
		func(c *kpc, v int32) { c.OOMScoreAdj = &v })

	// Proxying.
	str("proxy-mode", "mode", string(d.Mode), "Proxy mode: 'iptables' (Linux) or 'kernelspace' (Windows HNS); the default depends on the OS. Either one works anywhere with --dry-run.",
		func(c *kpc, v string) { c.Mode = v1alpha1.ProxyMode(v) })
	str("cluster-cidr", "clusterCIDR", d.ClusterCIDR, "The pods' IP range, or a comma-separated IPv4,IPv6 pair for dual-stack clusters. With --detect-local-mode=ClusterCIDR, traffic from it counts as local.",
		func(c *kpc, v string) { c.ClusterCIDR = v })
	nodePorts := fs.StringSlice("nodeport-addresses", d.NodePortAddresses, "CIDRs of the node addresses that accept NodePort connections, or 'primary' for the node's primary IPs (from its Node object). Default: every local address.")
	o.bind("nodeport-addresses", "nodePortAddresses", func(c *kpc) { c.NodePortAddresses = trimAll(*nodePorts) })
	boolean("masquerade-all", "iptables.masqueradeAll", d.IPTables.MasqueradeAll, "SNAT all traffic sent to Service cluster IPs (some network plugins need it).",
		func(c *kpc, v bool) { c.IPTables.MasqueradeAll = v })
	i32("iptables-masquerade-bit", "iptables.masqueradeBit", *d.IPTables.MasqueradeBit, "Bit of the packet mark that flags packets to SNAT, in [0, 31].",
		func(c *kpc, v int32) { c.IPTables.MasqueradeBit = &v })
	boolean("iptables-localhost-nodeports", "iptables.localhostNodePorts", *d.IPTables.LocalhostNodePorts, "Accept NodePort connections to 127.0.0.1 (IPv4 only, iptables mode).",
		func(c *kpc, v bool) { c.IPTables.LocalhostNodePorts = &v })
	dur("iptables-sync-period", "iptables.syncPeriod", d.IPTables.SyncPeriod.Duration, "Longest time between two syncs of the proxy rules. Must be greater than 0.",
		func(c *kpc, v time.Duration) { c.IPTables.SyncPeriod = metav1.Duration{Duration: v} })
	dur("iptables-min-sync-period", "iptables.minSyncPeriod", d.IPTables.MinSyncPeriod.Duration, "Shortest time between two syncs of the proxy rules; 0 syncs on every change.",
		func(c *kpc, v time.Duration) { c.IPTables.MinSyncPeriod = metav1.Duration{Duration: v} })
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
