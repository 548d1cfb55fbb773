package config

import (
	"strings"

	"github.com/spf13/pflag"
)

// FlagSection is one group of flags in kproxy --help.
type FlagSection struct {
	Title string
	Flags []string
}

// FlagSections groups every flag AddFlags registers, in the order
// kproxy --help shows them; each flag is in exactly one section (a test
// checks it). Hidden flags (deprecated ones) are listed too, so that the
// check covers them; the help leaves them out.
var FlagSections = []FlagSection{
	{"Configuration and source (API server or manifests)", []string{
		"config", "write-config-to", "kubeconfig", "master", "kube-api-content-type", "kube-api-qps", "kube-api-burst",
		"config-sync-period", "manifests", "hostname-override"}},
	{"Proxy", []string{
		"proxy-mode", "cluster-cidr", "nodeport-addresses", "masquerade-all", "detect-local-mode", "pod-bridge-interface",
		"pod-interface-name-prefix", "bind-address", "full-sync-period", "take-over-kube-proxy", "dry-run", "dry-run-output",
		"cleanup", "init-only", "oom-score-adj"}},
	// The nftables mode has no flag of its own: these periods and the
	// masquerade bit apply to it too, as upstream.
	{"iptables and nftables modes (Linux)", []string{
		"iptables-masquerade-bit", "iptables-localhost-nodeports", "iptables-sync-period", "iptables-min-sync-period",
		"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established", "conntrack-tcp-timeout-close-wait",
		"conntrack-tcp-be-liberal", "conntrack-udp-timeout", "conntrack-udp-timeout-stream"}},
	{"Windows (kernelspace mode)", []string{
		"network-name", "source-vip", "enable-dsr", "root-hnsendpoint-name", "forward-healthcheck-vip", "windows-service"}},
	{"Health and metrics", []string{
		"healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail", "profiling", "profiling-allow-remote",
		"healthz-port", "metrics-port"}},
	{"Logging", []string{
		"v", "vmodule", "logging-format", "log-flush-frequency", "log-text-split-stream", "log-text-info-buffer-size",
		"log-json-split-stream", "log-json-info-buffer-size"}},
	{"Compatibility with kube-proxy (ipvs mode, accepted options)", []string{
		"ipvs-sync-period", "ipvs-min-sync-period", "ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp",
		"ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout", "feature-gates", "show-hidden-metrics-for-version"}},
	{"Other", []string{"version"}},
}

// SectionFlags returns a flag set with the flags of fs that section lists
// (for its usage text); names fs lacks are skipped.
func SectionFlags(fs *pflag.FlagSet, section FlagSection) *pflag.FlagSet {
	out := pflag.NewFlagSet(section.Title, pflag.ContinueOnError)
	out.SortFlags = false
	for _, name := range section.Flags {
		if f := fs.Lookup(name); f != nil {
			out.AddFlag(f)
		}
	}
	return out
}

// SuggestFlag returns the visible flag of fs closest to the unknown flag
// name (as typed, without dashes), when it is close enough to be a typo:
// at most 2 edits away (3 for names of 12 characters or more), nearer than
// the name's own length, and nearer than any other flag (the first in
// name order wins a tie).
func SuggestFlag(fs *pflag.FlagSet, name string) (string, bool) {
	name = strings.ToLower(strings.ReplaceAll(strings.TrimLeft(name, "-"), "_", "-"))
	if name == "" {
		return "", false
	}
	limit := 2
	if len(name) >= 12 {
		limit = 3
	}
	if limit >= len(name) {
		limit = len(name) - 1
	}
	best, bestD := "", limit+1
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" {
			return
		}
		if d := editDistance(name, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best, best != ""
}

// UnknownFlag returns the flag name of pflag's "unknown flag" error
// message ("unknown flag: --name", "unknown shorthand flag: 'x' in -x").
func UnknownFlag(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		return rest, true
	}
	if rest, ok := strings.CutPrefix(msg, "unknown shorthand flag: '"); ok {
		if i := strings.Index(rest, "' in -"); i >= 0 {
			return rest[i+len("' in -"):], true
		}
	}
	return "", false
}

// editDistance is the Levenshtein distance between a and b (bytes: flag
// names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
