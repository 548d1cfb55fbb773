// Package config builds kproxy's configuration: upstream kube-proxy's
// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) plus kproxy's own
// options, from a --config file and upstream-compatible flags.
//
// Use it in this order:
//
//	o := config.NewOptions()
//	o.AddFlags(fs)
//	fs.Parse(args)           // then handle o.Version before anything else
//	err := o.Complete(fs)    // load --config, apply flags, defaults, node name
//	err = o.Validate()       // every bad field at once
//
// After Validate, the typed accessors (ProxyMode, SyncPeriod, ClusterCIDRs,
// NodePortAddresses, ...) return parsed values so that no other package parses
// configuration strings. They never panic: on an unvalidated configuration
// they skip what does not parse.
//
// Precedence is upstream kube-proxy's: without --config, the flags given
// explicitly, then defaults; with --config, the file, then defaults, and of
// the flags that set configuration fields only --hostname-override and the
// logging flags (-v, --vmodule, --logging-format, ...) apply: the others are
// ignored, and Warnings names each one given. Command-level flags (--master,
// --cleanup, --init-only, --write-config-to, kproxy's own) always apply.
//
// The package does no logging; Warnings returns what the caller should log.
package config

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Options holds everything the kproxy command is configured with.
type Options struct {
	// Config is the effective KubeProxyConfiguration: the --config file (if
	// any), then the flags set explicitly, then defaults. NewOptions sets it
	// to the defaults; Complete replaces it.
	Config *v1alpha1.KubeProxyConfiguration

	// ConfigFile is --config.
	ConfigFile string
	// ConfigData is the content of ConfigFile as Complete read and decoded
	// it: what the running configuration comes from, so that a change made
	// while kproxy starts is a change too (see app's config watch).
	ConfigData []byte
	// Master is --master: the API server address, overriding the kubeconfig's.
	Master string
	// NodeName is this node's name: --hostname-override, else the config's
	// hostnameOverride, else the OS hostname; trimmed and lowercased. Set by Complete.
	NodeName string

	// Manifests is --manifests: a directory of Service, EndpointSlice and
	// Node manifests to serve instead of an API server (kproxy's own).
	Manifests string
	// DryRun is --dry-run: print what would be programmed and exit (kproxy's own).
	DryRun bool
	// DryRunOutput is --dry-run-output: DryRunRules (what the backend would
	// program) or DryRunState (the node-local desired state as YAML).
	DryRunOutput string
	// Cleanup is --cleanup: remove everything kproxy programmed and exit.
	Cleanup bool
	// Version is --version: print the version ("true") or the detailed
	// version ("raw") and exit.
	Version VersionFlag
	// WriteConfigTo is --write-config-to: write the effective configuration
	// to this file and exit.
	WriteConfigTo string
	// InitOnly is --init-only: do what needs full privileges, then exit.
	InitOnly bool
	// WindowsService is --windows-service: run under the Windows Service
	// Control Manager. As upstream, only the flag counts (the file's
	// windowsRunAsService is read too late to matter and is warned about).
	WindowsService bool
	// ProfilingAllowRemote is --profiling-allow-remote: allow
	// enableProfiling with a non-loopback metrics address (kproxy's own).
	ProfilingAllowRemote bool
	// TakeOverKubeProxy is --take-over-kube-proxy: after kproxy's first
	// successful full sync, remove upstream kube-proxy's rules (Linux).
	TakeOverKubeProxy bool
	// FullSyncPeriod is --full-sync-period: the longest time between two full
	// syncs; syncs in between rewrite only what changed (kproxy's own).
	FullSyncPeriod time.Duration

	// bindings are the flags that set Config fields, in registration order.
	bindings []binding
	// setBy maps config field paths to the flag that set them explicitly.
	setBy map[string]string
	// ignoredFlags are the flags given with --config that it makes ignored.
	ignoredFlags []string
	// fileWarnings are the file's problems tolerated by lenient decoding.
	fileWarnings []Problem
	// flagz lists every flag with its value, for /flagz.
	flagz []string

	// Flag-only values, applied in Complete.
	flagFeatureGates map[string]bool
	flagLogging      logsapi.LoggingConfiguration
	healthzPort      int32
	metricsPort      int32

	// Seams for tests.
	goos     string
	hostname func() (string, error)
	getenv   func(string) string
}

// binding ties a flag to the Config field it sets.
type binding struct {
	flag string
	// field is the JSON path of the field in KubeProxyConfiguration.
	field string
	// withConfig is set for the flag that applies even with --config
	// (--hostname-override, as upstream).
	withConfig bool
	apply      func(c *v1alpha1.KubeProxyConfiguration)
}

// NewOptions returns options holding the defaults for this platform.
func NewOptions() *Options {
	o := &Options{
		TakeOverKubeProxy: DefaultTakeOverKubeProxy,
		DryRunOutput:      DryRunRules,
		FullSyncPeriod:    DefaultFullSyncPeriod,
		healthzPort:       DefaultHealthzPort,
		metricsPort:       DefaultMetricsPort,
		goos:              runtime.GOOS,
		hostname:          os.Hostname,
		getenv:            os.Getenv,
	}
	o.Config = o.defaults()
	return o
}

// NewOptionsFor returns options holding the defaults of a node of goos
// ("linux", "windows"): the configuration of another machine's kproxy, read
// elsewhere (kubectl kproxy explain on a workstation).
func NewOptionsFor(goos string) *Options {
	o := NewOptions()
	o.goos = goos
	o.Config = o.defaults()
	return o
}

func (o *Options) defaults() *v1alpha1.KubeProxyConfiguration {
	c := &v1alpha1.KubeProxyConfiguration{}
	setDefaults(c, o.goos)
	return c
}

// Complete builds Config after fs was parsed, with upstream kube-proxy's
// precedence (see the package documentation): it loads --config (strictly,
// then leniently with warnings), applies the flags that count, fills
// defaults, carries the logging settings between the file and the flags,
// and determines NodeName.
//
// Explicit flags are applied both before and after defaulting: before, so
// that defaults derived from them follow them (the healthz address family
// from --bind-address); after, so that an explicit zero or empty value (such
// as --metrics-bind-address="" to disable the metrics server, or
// --iptables-min-sync-period=0) is kept rather than defaulted.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	c := &v1alpha1.KubeProxyConfiguration{}
	o.fileWarnings, o.ignoredFlags, o.ConfigData = nil, nil, nil
	if o.ConfigFile != "" {
		loaded, warnings, data, err := loadLenient(o.ConfigFile)
		if err != nil {
			return err
		}
		c, o.fileWarnings, o.ConfigData = loaded, warnings, data
	}

	if f := fs.Lookup("hostname-override"); f != nil && f.Changed && f.Value.String() != "" && strings.TrimSpace(f.Value.String()) == "" {
		// Upstream's check: an empty flag is as good as none, a blank one
		// is an error.
		return errors.New("empty --hostname-override is invalid")
	}

	o.flagz = nil
	fs.VisitAll(func(f *pflag.Flag) { o.flagz = append(o.flagz, fmt.Sprintf("%s=%s", f.Name, f.Value.String())) })
	o.setBy = map[string]string{}
	var explicit []binding
	for _, b := range o.bindings {
		if !fs.Changed(b.flag) {
			continue
		}
		if o.ConfigFile != "" && !b.withConfig {
			o.ignoredFlags = append(o.ignoredFlags, b.flag)
			continue
		}
		explicit = append(explicit, b)
		o.setBy[b.field] = b.flag
	}
	for _, b := range explicit {
		b.apply(c)
	}
	setDefaults(c, o.goos)
	for _, b := range explicit {
		b.apply(c)
	}
	if o.ConfigFile == "" && c.Mode == ModeIPVS && o.setBy["ipvs.minSyncPeriod"] == "" {
		// Upstream's flags start from one minSyncPeriod for every mode,
		// iptables' default (1s); ipvs.minSyncPeriod has no default only in
		// a config file.
		c.IPVS.MinSyncPeriod = metav1.Duration{Duration: DefaultMinSyncPeriod}
	}
	if o.ConfigFile == "" && o.WriteConfigTo == "" {
		// The deprecated --healthz-port and --metrics-port, as upstream: 0
		// disables the server; otherwise the port is added to a bare IP.
		c.HealthzBindAddress = addressFromPort(c.HealthzBindAddress, o.healthzPort)
		c.MetricsBindAddress = addressFromPort(c.MetricsBindAddress, o.metricsPort)
	}
	if c.HealthzBindAddress != "" {
		c.HealthzBindAddress = appendPortIfNeeded(c.HealthzBindAddress, DefaultHealthzPort)
	}
	if c.MetricsBindAddress != "" {
		c.MetricsBindAddress = appendPortIfNeeded(c.MetricsBindAddress, DefaultMetricsPort)
	}

	if err := copyLoggingFlags(fs, &c.Logging, o.setBy); err != nil {
		return err
	}
	if err := syncLogging(fs, c, o.setBy); err != nil {
		return err
	}
	if c.Mode == ModeKernelspace && c.Winkernel.NetworkName == "" {
		// Upstream kube-proxy on Windows finds its HNS network this way.
		c.Winkernel.NetworkName = strings.TrimSpace(o.getenv(kubeNetworkEnv))
	}

	// As upstream (component-helpers' GetHostname): a name that is only
	// white space is an error, wherever it comes from.
	name, from := c.HostnameOverride, "hostnameOverride"
	if name == "" {
		h, err := o.hostname()
		if err != nil {
			return fmt.Errorf("determining the node name (set --hostname-override): %w", err)
		}
		name, from = h, "the OS hostname"
	}
	if name = strings.TrimSpace(name); name == "" {
		return fmt.Errorf("empty node name is invalid (%s is only white space)", from)
	}
	o.NodeName = strings.ToLower(name)
	o.Config = c
	return nil
}

// addressFromPort applies a deprecated --healthz-port or --metrics-port.
func addressFromPort(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	if addr == "" {
		return addr
	}
	return appendPortIfNeeded(addr, int(port))
}

// syncLogging makes -v/--vmodule and the config's logging section agree: an
// explicit flag wins and is recorded in the config; otherwise the file's
// value is applied to klog through the flag.
func syncLogging(fs *pflag.FlagSet, c *v1alpha1.KubeProxyConfiguration, setBy map[string]string) error {
	if f := fs.Lookup("v"); f != nil {
		if f.Changed {
			v, err := strconv.ParseUint(f.Value.String(), 10, 32)
			if err != nil {
				return fmt.Errorf("-v %q: %w", f.Value.String(), err)
			}
			c.Logging.Verbosity = logsapi.VerbosityLevel(v)
			setBy["logging.verbosity"] = "v"
		} else if c.Logging.Verbosity != 0 {
			if err := fs.Set("v", strconv.FormatUint(uint64(c.Logging.Verbosity), 10)); err != nil {
				return fmt.Errorf("applying logging.verbosity %d: %w", c.Logging.Verbosity, err)
			}
		}
	}
	if f := fs.Lookup("vmodule"); f != nil {
		vm := logsapi.VModuleConfigurationPflag(&c.Logging.VModule)
		if f.Changed {
			c.Logging.VModule = nil
			if err := vm.Set(f.Value.String()); err != nil {
				return fmt.Errorf("--vmodule %q: %w", f.Value.String(), err)
			}
			setBy["logging.vmodule"] = "vmodule"
		} else if len(c.Logging.VModule) > 0 {
			if err := fs.Set("vmodule", vm.String()); err != nil {
				return fmt.Errorf("applying logging.vmodule %q: %w", vm.String(), err)
			}
		}
	}
	return nil
}

// Warnings lists settings that kproxy accepts for compatibility but ignores
// or cannot honour, for the caller to log once at start: the file's fields
// that only lenient decoding accepted, the flags --config made ignored, and
// the settings kproxy has no use for.
func (o *Options) Warnings() []string {
	c := o.Config
	var w []string
	for _, p := range o.fileWarnings {
		line := ""
		if p.Line > 0 {
			line = fmt.Sprintf(" (line %d)", p.Line)
		}
		w = append(w, fmt.Sprintf("config file %s%s: %s: ignored, as upstream kube-proxy's lenient decoding does", o.ConfigFile, line, p.Message))
	}
	for _, f := range o.ignoredFlags {
		w = append(w, fmt.Sprintf("--%s is ignored because --config is given (as upstream kube-proxy: set it in the config file)", f))
	}
	if m := o.ModeWarning(); m != "" {
		w = append(w, m)
	}
	var ipvsIgnored []string
	if len(c.IPVS.ExcludeCIDRs) > 0 {
		ipvsIgnored = append(ipvsIgnored, "excludeCIDRs")
	}
	if c.IPVS.StrictARP {
		ipvsIgnored = append(ipvsIgnored, "strictARP")
	}
	if c.IPVS.TCPTimeout.Duration != 0 {
		ipvsIgnored = append(ipvsIgnored, "tcpTimeout")
	}
	if c.IPVS.TCPFinTimeout.Duration != 0 {
		ipvsIgnored = append(ipvsIgnored, "tcpFinTimeout")
	}
	if c.IPVS.UDPTimeout.Duration != 0 {
		ipvsIgnored = append(ipvsIgnored, "udpTimeout")
	}
	if len(ipvsIgnored) > 0 {
		w = append(w, fmt.Sprintf("ipvs.%s ignored: kproxy programs no IPVS", strings.Join(ipvsIgnored, ", ipvs.")))
	}
	if len(c.FeatureGates) > 0 {
		gates := make([]string, 0, len(c.FeatureGates))
		for g := range c.FeatureGates {
			gates = append(gates, g)
		}
		sort.Strings(gates)
		w = append(w, fmt.Sprintf("featureGates are ignored: kproxy has no feature gates (%s)", strings.Join(gates, ", ")))
	}
	if c.PortRange != "" {
		w = append(w, "portRange is ignored: it only applied to the removed userspace proxy")
	}
	if c.ShowHiddenMetricsForVersion != "" {
		w = append(w, "showHiddenMetricsForVersion is ignored: kproxy hides no metrics")
	}
	if c.WindowsRunAsService {
		w = append(w, "windowsRunAsService in the config file is ignored, as upstream: use the --windows-service flag")
	}
	if c.Logging.Options.Text.SplitStream || c.Logging.Options.JSON.SplitStream {
		w = append(w, "logging split streams are ignored: kproxy writes one log stream (stderr)")
	}
	if o.ProxyMode() == ModeIPTables && c.DetectLocalMode == LocalModeClusterCIDR && strings.TrimSpace(c.ClusterCIDR) == "" {
		w = append(w, "detectLocalMode is ClusterCIDR but clusterCIDR is empty: local-traffic detection is off (off-cluster traffic to ClusterIPs is not masqueraded)")
	}
	return w
}

// Flagz lists every flag as "name=value" (set or default), sorted by name,
// as /flagz shows them. Set by Complete.
func (o *Options) Flagz() []string { return o.flagz }

// ModeWarning says, for the mode kproxy has no backend for (ipvs), what it
// runs instead; "" otherwise. The caller also records it as a
// Warning Event on the Node.
func (o *Options) ModeWarning() string {
	c := o.Config
	switch c.Mode {
	case ModeIPVS:
		sched := o.IPVSScheduler()
		return fmt.Sprintf("mode ipvs: kproxy has no ipvs backend and runs its iptables backend instead (ipvs.syncPeriod and ipvs.minSyncPeriod apply; ipvs.scheduler %q is the node-wide load-balancing algorithm: rr, sh and lc map to round-robin, source-hash and least-connection, others to random)", sched)
	}
	return ""
}

// VersionFlag is --version: "" or "false" (run), "true" (print the version
// and exit) or "raw" (print the detailed version and exit), as upstream.
type VersionFlag string

// Set implements pflag.Value.
func (v *VersionFlag) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "false":
		*v = ""
	case "true":
		*v = "true"
	case "raw":
		*v = "raw"
	default:
		return fmt.Errorf("invalid value %q: want true, false or raw", s)
	}
	return nil
}

// String implements pflag.Value.
func (v *VersionFlag) String() string {
	if *v == "" {
		return "false"
	}
	return string(*v)
}

// Type implements pflag.Value.
func (v *VersionFlag) Type() string { return "version" }
