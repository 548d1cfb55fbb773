package config

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// ValidationError lists every invalid setting, each with the path of its
// field in KubeProxyConfiguration ("iptables.masqueradeBit") or, for kproxy's
// own options, its flag.
type ValidationError struct {
	Errors field.ErrorList
	// setBy maps field paths to the flag that set them, for the message.
	setBy map[string]string
}

// Error renders one line per invalid setting, naming the flag that set it
// when it came from the command line.
func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		lines[i] = fe.Error()
		if flag := e.flagFor(fe.Field); flag != "" {
			lines[i] += " (set by --" + flag + ")"
		}
	}
	if len(lines) == 1 {
		return "invalid configuration: " + lines[0]
	}
	return fmt.Sprintf("invalid configuration (%d errors):\n  %s", len(lines), strings.Join(lines, "\n  "))
}

// Unwrap returns the individual *field.Error values.
func (e *ValidationError) Unwrap() []error {
	out := make([]error, len(e.Errors))
	for i, fe := range e.Errors {
		out[i] = fe
	}
	return out
}

func (e *ValidationError) flagFor(path string) string {
	for f := path; f != ""; {
		if flag, ok := e.setBy[f]; ok {
			return flag
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	return ""
}

// Validate checks the completed options and returns a *ValidationError
// listing every invalid setting, or nil.
func (o *Options) Validate() error {
	errs := validateConfig(o.Config, o.goos, o.DryRun)
	errs = append(errs, validateNodeName(o.NodeName, field.NewPath("hostnameOverride"))...)
	if o.DryRunOutput != DryRunRules && o.DryRunOutput != DryRunState {
		errs = append(errs, field.NotSupported(field.NewPath("--dry-run-output"), o.DryRunOutput, []string{DryRunRules, DryRunState}))
	}
	if o.Config.EnableProfiling && !o.ProfilingAllowRemote && o.Config.MetricsBindAddress != "" {
		if ap, err := netip.ParseAddrPort(o.Config.MetricsBindAddress); err == nil && !ap.Addr().IsLoopback() {
			errs = append(errs, field.Forbidden(field.NewPath("enableProfiling"),
				fmt.Sprintf("profiling would be served to the network on metricsBindAddress %s: use a loopback metrics address, or allow it with --profiling-allow-remote", o.Config.MetricsBindAddress)))
		}
	}
	if o.FullSyncPeriod <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("--full-sync-period"), o.FullSyncPeriod.String(), "must be greater than 0"))
	}
	if len(errs) == 0 {
		return nil
	}
	return &ValidationError{Errors: errs, setBy: o.setBy}
}

// validateConfig checks the fields of a defaulted configuration that kproxy
// uses. goos is the platform kproxy runs on; dryRun allows either proxy mode
// on any platform.
func validateConfig(c *v1alpha1.KubeProxyConfiguration, goos string, dryRun bool) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateMode(c.Mode, field.NewPath("mode"), goos, dryRun)...)

	if _, err := netip.ParseAddr(c.BindAddress); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("bindAddress"), c.BindAddress, "must be an IP address"))
	}
	if c.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(c.HealthzBindAddress, field.NewPath("healthzBindAddress"))...)
	}
	if c.MetricsBindAddress != "" {
		errs = append(errs, validateHostPort(c.MetricsBindAddress, field.NewPath("metricsBindAddress"))...)
	}

	errs = append(errs, validateClusterCIDR(c.ClusterCIDR, field.NewPath("clusterCIDR"))...)
	errs = append(errs, validateNodePortAddresses(c.NodePortAddresses, field.NewPath("nodePortAddresses"))...)

	ipt := field.NewPath("iptables")
	if b := c.IPTables.MasqueradeBit; b != nil && (*b < 0 || *b > maxMasqueradeBit) {
		errs = append(errs, field.Invalid(ipt.Child("masqueradeBit"), *b, fmt.Sprintf("must be in the range [0, %d]", maxMasqueradeBit)))
	}
	// The sync periods of the mode's own section, as upstream.
	section := modeSection(c)
	sp := field.NewPath(section)
	p := modePeriods(c)
	sync, minSync := p.SyncPeriod.Duration, p.MinSyncPeriod.Duration
	if sync <= 0 {
		errs = append(errs, field.Invalid(sp.Child("syncPeriod"), sync.String(), "must be greater than 0"))
	}
	if minSync < 0 {
		errs = append(errs, field.Invalid(sp.Child("minSyncPeriod"), minSync.String(), "must be greater than or equal to 0"))
	} else if sync > 0 && minSync > sync {
		errs = append(errs, field.Invalid(sp.Child("minSyncPeriod"), minSync.String(), fmt.Sprintf("must not be greater than %s.syncPeriod (%s)", section, sync)))
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("configSyncPeriod"), c.ConfigSyncPeriod.Duration.String(), "must be greater than 0"))
	}
	if v := c.OOMScoreAdj; v != nil && (*v < minOOMScoreAdj || *v > maxOOMScoreAdj) {
		errs = append(errs, field.Invalid(field.NewPath("oomScoreAdj"), *v, fmt.Sprintf("must be in the range [%d, %d]", minOOMScoreAdj, maxOOMScoreAdj)))
	}
	if c.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("clientConnection", "burst"), c.ClientConnection.Burst, "must be greater than or equal to 0"))
	}

	errs = append(errs, validateConntrack(c.Conntrack, field.NewPath("conntrack"))...)
	errs = append(errs, validateDetectLocal(c, field.NewPath("detectLocalMode"), field.NewPath("detectLocal"))...)

	// As upstream (component-base's logging validation): a format that is
	// not registered is an error. kproxy registers text and json, as
	// kube-proxy does.
	switch c.Logging.Format {
	case "", "text", "json":
	default:
		errs = append(errs, field.NotSupported(field.NewPath("logging", "format"), c.Logging.Format, []string{"text", "json"}))
	}

	if c.Mode == ModeKernelspace && c.Winkernel.SourceVip != "" {
		if _, err := netip.ParseAddr(c.Winkernel.SourceVip); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("winkernel", "sourceVip"), c.Winkernel.SourceVip, "must be an IP address"))
		}
	}
	return errs
}

func validateMode(mode v1alpha1.ProxyMode, path *field.Path, goos string, dryRun bool) field.ErrorList {
	switch mode {
	case ModeIPTables:
		if goos != "linux" && !dryRun {
			return field.ErrorList{field.Invalid(path, string(mode), "iptables mode runs only on Linux (use kernelspace on Windows, or --dry-run to print the iptables rules)")}
		}
	case ModeKernelspace:
		if goos != windowsGOOS && !dryRun {
			return field.ErrorList{field.Invalid(path, string(mode), "kernelspace mode runs only on Windows (use iptables on Linux, or --dry-run to print the HNS plan)")}
		}
	case ModeIPVS, ModeNFTables:
		// Linux only: nftables runs kproxy's nftables backend, ipvs its
		// iptables backend (warned).
		if goos != "linux" && !dryRun {
			return field.ErrorList{field.Invalid(path, string(mode), "runs only on Linux (use kernelspace on Windows)")}
		}
	case "":
		return field.ErrorList{field.Required(path, "")}
	default:
		return field.ErrorList{field.NotSupported(path, string(mode), []v1alpha1.ProxyMode{ModeIPTables, ModeKernelspace, ModeIPVS, ModeNFTables})}
	}
	return nil
}

func validateHostPort(s string, path *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return field.ErrorList{field.Invalid(path, s, "must be IP:port")}
	}
	var errs field.ErrorList
	if _, err := netip.ParseAddr(host); err != nil {
		errs = append(errs, field.Invalid(path, s, fmt.Sprintf("%q is not an IP address", host)))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, field.Invalid(path, s, fmt.Sprintf("port %q must be a number in [1, 65535]", port)))
	}
	return errs
}

func validateClusterCIDR(s string, path *field.Path) field.ErrorList {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return field.ErrorList{field.Invalid(path, s, "must be one CIDR or a dual-stack pair such as 10.244.0.0/16,fd00:10:244::/56")}
	}
	var errs field.ErrorList
	var prefixes []netip.Prefix
	for _, part := range parts {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			errs = append(errs, field.Invalid(path, s, fmt.Sprintf("%q is not a CIDR such as 10.244.0.0/16", strings.TrimSpace(part))))
			continue
		}
		prefixes = append(prefixes, p)
	}
	if len(prefixes) == 2 && prefixes[0].Addr().Is4() == prefixes[1].Addr().Is4() {
		errs = append(errs, field.Invalid(path, s, "two CIDRs must be one IPv4 and one IPv6 (dual-stack)"))
	}
	return errs
}

func validateNodePortAddresses(addrs []string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, a := range addrs {
		a = strings.TrimSpace(a)
		if a == NodePortAddressesPrimary {
			if len(addrs) > 1 {
				errs = append(errs, field.Invalid(path.Index(i), a, "\"primary\" cannot be combined with CIDRs"))
			}
			continue
		}
		if _, err := netip.ParsePrefix(a); err != nil {
			errs = append(errs, field.Invalid(path.Index(i), a, "must be a CIDR such as 10.0.0.0/8, or the single value \"primary\""))
		}
	}
	return errs
}

func validateConntrack(c v1alpha1.KubeProxyConntrackConfiguration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, n := range []struct {
		name string
		v    *int32
	}{{"maxPerCore", c.MaxPerCore}, {"min", c.Min}} {
		if n.v != nil && *n.v < 0 {
			errs = append(errs, field.Invalid(path.Child(n.name), *n.v, "must be greater than or equal to 0"))
		}
	}
	for _, d := range []struct {
		name string
		v    *metav1.Duration
	}{
		{"tcpEstablishedTimeout", c.TCPEstablishedTimeout},
		{"tcpCloseWaitTimeout", c.TCPCloseWaitTimeout},
		{"udpTimeout", &c.UDPTimeout},
		{"udpStreamTimeout", &c.UDPStreamTimeout},
	} {
		if d.v != nil && d.v.Duration < 0 {
			errs = append(errs, field.Invalid(path.Child(d.name), d.v.Duration.String(), "must be greater than or equal to 0"))
		}
	}
	return errs
}

func validateDetectLocal(c *v1alpha1.KubeProxyConfiguration, modePath, cfgPath *field.Path) field.ErrorList {
	switch c.DetectLocalMode {
	case LocalModeClusterCIDR, LocalModeNodeCIDR:
	case LocalModeBridgeInterface:
		if strings.TrimSpace(c.DetectLocal.BridgeInterface) == "" {
			return field.ErrorList{field.Required(cfgPath.Child("bridgeInterface"), "must be set when detectLocalMode is BridgeInterface")}
		}
	case LocalModeInterfaceNamePrefix:
		if strings.TrimSpace(c.DetectLocal.InterfaceNamePrefix) == "" {
			return field.ErrorList{field.Required(cfgPath.Child("interfaceNamePrefix"), "must be set when detectLocalMode is InterfaceNamePrefix")}
		}
	default:
		return field.ErrorList{field.NotSupported(modePath, string(c.DetectLocalMode), []v1alpha1.LocalMode{
			LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix})}
	}
	return nil
}

func validateNodeName(name string, path *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(path, "the node name is unknown: call Complete, or set --hostname-override")}
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(path, name, "node name "+strings.Join(msgs, "; "))}
	}
	return nil
}
