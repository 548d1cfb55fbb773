package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/cmd/internal/explaincmd"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
)

// explainCommand is the subcommand that tells where a connection goes.
const explainCommand = "explain"

// explainFlags are the flags of `kproxy explain` on top of kproxy's own.
type explainFlags struct {
	to, from, node, output string
	fromNode, fromOutside  bool
	live                   bool
}

const explainUsage = `Usage: kproxy explain --to ADDRESS:PORT[/tcp|udp|sctp] [--from ADDRESS] [--from-node|--from-outside]
       [--node NAME] [--live] [-o text|json] [--manifests DIR | --kubeconfig FILE] [--proxy-mode MODE] [kproxy flags]

Tells where a new connection to a Service address goes on one node, and why:
the frontend matched, the verdict (DNAT to endpoints with their chances,
REJECT, DROP, not handled), masquerade and the policies that decided, and the
path through the rules (iptables), chains, maps and elements (nftables) or
HNS load balancers (kernelspace).
Planned (default): from kproxy's own plan, on any OS for any mode.
--live: from the node's iptables or kproxy's nftables table (Linux) or HNS
(Windows), with every drift from the plan.

The client: a pod on the node (default; its address from the node's pod
CIDR, else --cluster-cidr, else a placeholder), the node itself
(--from-node), or a host elsewhere (--from-outside; default client
203.0.113.10 or 2001:db8::10, documentation addresses). --from sets the
address.

Examples (the first needs no root and no cluster):
  kproxy explain --manifests docs/examples --hostname-override node1 --to 10.96.0.30:53/udp
  kproxy explain --manifests docs/examples --hostname-override node1 --from-outside --proxy-mode nftables --to 10.96.0.30:53/udp
  kproxy explain --kubeconfig ~/.kube/config --node NODE --from 10.244.1.7 --to 10.96.0.10:53/udp -o json
  kproxy explain --config /var/lib/kproxy/config.conf --live --to 10.96.0.10:443     (on the node, as root)

Explain's own flags:
`

// runExplain is `kproxy explain`: it returns the exit code.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kproxy explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	own := pflag.NewFlagSet("kproxy explain", pflag.ContinueOnError)
	fs.Usage = func() {
		_, _ = io.WriteString(stdout, explainUsage)
		_, _ = io.WriteString(stdout, own.FlagUsages())
		_, _ = io.WriteString(stdout, "\nkproxy's flags (the node's configuration: --config, --kubeconfig, --manifests, --proxy-mode, --cluster-cidr...):\n")
		_, _ = io.WriteString(stdout, "  see 'kproxy --help'; every one is accepted here.\n")
	}
	o := config.NewOptions()
	o.AddFlags(fs)
	var f explaincmd.Flags
	f.AddFlags(own, true)
	fs.AddFlagSet(own)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		flagError(stderr, "kproxy explain", fs, err)
		return 1 // as kproxy's own flag errors (and upstream's)
	}
	if err := explainMain(ctx, fs, o, f, stdout); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy explain: %v\n", err)
		return 1
	}
	return 0
}

func explainMain(ctx context.Context, fs *pflag.FlagSet, o *config.Options, f explaincmd.Flags, stdout io.Writer) error {
	if _, _, err := f.Check(); err != nil {
		return err
	}
	if err := o.Complete(fs); err != nil {
		return err
	}
	if f.Node != "" {
		o.NodeName = strings.ToLower(f.Node)
	}
	// A planned explanation changes nothing, like a dry run: every mode is
	// valid on every OS.
	o.DryRun = !f.Live
	if err := o.Validate(); err != nil {
		return err
	}
	named := ""
	if f.Node != "" {
		named = fmt.Sprintf("--node %q", f.Node)
	}
	return explaincmd.Run(ctx, o, f, named, app.Snapshot, stdout)
}
