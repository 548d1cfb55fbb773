package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/pkg/config"
)

// helpCommand prints the help of kproxy or of one of its subcommands.
const helpCommand = "help"

const helpIntro = `kproxy: a Kubernetes Service proxy for Linux (iptables, nftables) and
Windows (HNS) nodes, in place of kube-proxy. It watches Services,
EndpointSlices and its Node (or reads manifests) and programs the node.
Flags and the configuration file (--config) are kube-proxy's.

Usage:
  kproxy [flags]                 run the proxy (also installed as kube-proxy)
  kproxy explain [flags]         where a new connection goes on a node, and why
  kproxy check-hns [flags]       check that HNS returns what kproxy sends (Windows)
  kproxy idle                    wait until stopped (the cleanup DaemonSet's container)
  kproxy help [explain|check-hns]

Examples:
  # In place of kube-proxy, with the same configuration file:
  kproxy --config /var/lib/kube-proxy/config.conf --hostname-override "$NODE_NAME"

  # What would be programmed for a directory of manifests (any OS, no changes):
  kproxy --manifests docs/examples --hostname-override node1 --dry-run
  kproxy --manifests docs/examples --hostname-override node1 --dry-run --proxy-mode nftables
  kproxy --manifests docs/examples --hostname-override node1 --dry-run --dry-run-output state

  # Where a connection to a Service goes, as planned and as programmed:
  kproxy explain --manifests docs/examples --hostname-override node1 --to 10.96.0.30:53/udp
  kproxy explain --config /var/lib/kproxy/config.conf --node NODE --live --to 10.96.0.10:443
`

// docsLink names the generated reference of every flag, configuration
// field, metric and endpoint.
const docsLink = "Every flag, configuration field, metric and health endpoint is described in docs/reference.md\n(in kproxy's source tree); docs/troubleshooting.md starts from symptoms.\n"

// writeHelp prints kproxy's help: the introduction, then fs's visible
// flags by section (config.FlagSections), then where the reference is.
func writeHelp(w io.Writer, fs *pflag.FlagSet) {
	_, _ = io.WriteString(w, helpIntro)
	for _, s := range config.FlagSections {
		sfs := config.SectionFlags(fs, s)
		if s.Title == "Other" {
			sfs.BoolP("help", "h", false, "Print this help and exit (also: kproxy help).")
		}
		usage := sfs.FlagUsagesWrapped(100)
		if usage == "" {
			continue // only hidden flags
		}
		_, _ = fmt.Fprintf(w, "\n%s:\n%s", s.Title, usage)
	}
	_, _ = io.WriteString(w, "\n"+docsLink)
}

// runHelp is `kproxy help [SUBCOMMAND]`.
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
		config.NewOptions().AddFlags(fs)
		writeHelp(stdout, fs)
		return 0
	}
	switch args[0] {
	case explainCommand, checkHNSCommand:
		code, _ := runSubcommand(ctx, []string{args[0], "--help"}, stdout, stderr)
		return code
	}
	_, _ = fmt.Fprintf(stderr, "kproxy help: no help for %q (subcommands: %s, %s)\n", args[0], explainCommand, checkHNSCommand)
	return 1
}

// flagError reports a flag error of the command (or subcommand) name to
// stderr, with the closest flag when the flag is unknown and a registered
// one is close.
func flagError(stderr io.Writer, name string, fs *pflag.FlagSet, err error) {
	_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
	if typed, ok := config.UnknownFlag(err); ok {
		if s, ok := config.SuggestFlag(fs, typed); ok {
			_, _ = fmt.Fprintf(stderr, "Did you mean --%s?\n", s)
		}
	}
}
