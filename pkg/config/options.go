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
// Precedence, highest first: flags given explicitly on the command line, the
// --config file, defaults. Unlike upstream kube-proxy, flags are not ignored
// when --config is given.
//
// The package does no logging; Warnings returns what the caller should log.
package config

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
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
	// Version is --version: print the version and exit.
	Version bool
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
	apply func(c *v1alpha1.KubeProxyConfiguration)
}

// NewOptions returns options holding the defaults for this platform.
func NewOptions() *Options {
	o := &Options{
		TakeOverKubeProxy: DefaultTakeOverKubeProxy,
		DryRunOutput:      DryRunRules,
		FullSyncPeriod:    DefaultFullSyncPeriod,
		goos:              runtime.GOOS,
		hostname:          os.Hostname,
		getenv:            os.Getenv,
	}
	o.Config = o.defaults()
	return o
}

func (o *Options) defaults() *v1alpha1.KubeProxyConfiguration {
	c := &v1alpha1.KubeProxyConfiguration{}
	setDefaults(c, o.goos)
	return c
}

// Complete builds Config after fs was parsed: it loads --config strictly,
// applies the flags the user set explicitly (fs.Changed), fills defaults,
// carries the log verbosity between the file and -v, and determines NodeName.
//
// Explicit flags are applied both before and after defaulting: before, so
// that defaults derived from them follow them (the healthz address family
// from --bind-address); after, so that an explicit zero or empty value (such
// as --metrics-bind-address="" to disable the metrics server, or
// --iptables-min-sync-period=0) is kept rather than defaulted.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	c := &v1alpha1.KubeProxyConfiguration{}
	if o.ConfigFile != "" {
		loaded, err := Load(o.ConfigFile)
		if err != nil {
			return err
		}
		c = loaded
	}

	o.setBy = map[string]string{}
	var explicit []binding
	for _, b := range o.bindings {
		if fs.Changed(b.flag) {
			explicit = append(explicit, b)
			o.setBy[b.field] = b.flag
		}
	}
	for _, b := range explicit {
		b.apply(c)
	}
	setDefaults(c, o.goos)
	for _, b := range explicit {
		b.apply(c)
	}

	if err := syncLogging(fs, c, o.setBy); err != nil {
		return err
	}
	if c.Mode == ModeKernelspace && c.Winkernel.NetworkName == "" {
		// Upstream kube-proxy on Windows finds its HNS network this way.
		c.Winkernel.NetworkName = strings.TrimSpace(o.getenv(kubeNetworkEnv))
	}

	name := strings.TrimSpace(c.HostnameOverride)
	if name == "" {
		h, err := o.hostname()
		if err != nil {
			return fmt.Errorf("determining the node name (set --hostname-override): %w", err)
		}
		name = strings.TrimSpace(h)
	}
	o.NodeName = strings.ToLower(name)
	o.Config = c
	return nil
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
// or cannot honour, for the caller to log once at start.
func (o *Options) Warnings() []string {
	c := o.Config
	var w []string
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
		w = append(w, "windowsRunAsService is ignored: run kproxy as a HostProcess container")
	}
	if c.Logging.Format != "" && c.Logging.Format != "text" {
		w = append(w, fmt.Sprintf("logging.format %q is ignored: kproxy logs in klog's text format", c.Logging.Format))
	}
	if c.Mode == ModeIPTables && c.DetectLocalMode == LocalModeClusterCIDR && strings.TrimSpace(c.ClusterCIDR) == "" {
		w = append(w, "detectLocalMode is ClusterCIDR but clusterCIDR is empty: local-traffic detection is off (off-cluster traffic to ClusterIPs is not masqueraded)")
	}
	return w
}
