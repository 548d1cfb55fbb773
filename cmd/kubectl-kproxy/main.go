// Command kubectl-kproxy is kproxy's kubectl plugin: installed on the PATH
// as kubectl-kproxy, it runs as `kubectl kproxy SUBCOMMAND`.
//
//	kubectl kproxy status [-n NAMESPACE] [-o text|json]
//
// status lists every node's kproxy (mode, version, last sync, quarantined
// service ports, health), read through the API server's pod proxy from
// each kproxy pod's health and metrics ports. It is a binary of its own,
// not a mode of kproxy: kubectl finds plugins by file name, and an operator
// installs it on a workstation, where kproxy's backends and the node's
// flags mean nothing.
//
//	kubectl kproxy explain NODE --to ADDRESS:PORT[/proto] [--from ADDRESS | --from-node | --from-outside] [-o text|json]
//
// explain is kproxy explain for NODE without a shell on it: the node's mode
// and configuration are its kproxy pod's (the container's flags, the
// ConfigMap the pod mounts), the Services and EndpointSlices the API
// server's; the plan is computed here, by the same code as kproxy's.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/pkg/version"
)

// subcommand runs one `kubectl kproxy NAME`, with its own arguments and the
// connection to the cluster; it returns the exit code.
type subcommand struct {
	summary string
	run     func(ctx context.Context, args []string, conn *connection, stdout, stderr io.Writer) int
}

// subcommands are the plugin's subcommands by name.
var subcommands = map[string]subcommand{
	"status":  {summary: "every node's kproxy: mode, version, last sync, quarantined ports, health", run: runStatus},
	"explain": {summary: "where a connection goes on a node, and why (planned from the API server)", run: runExplain},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func usage(w io.Writer) {
	_, _ = fmt.Fprintf(w, "kubectl kproxy: kproxy's kubectl plugin (%s)\n\nUsage:\n", version.String())
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		_, _ = fmt.Fprintf(w, "  kubectl kproxy %-8s %s\n", n, subcommands[n].summary)
	}
	_, _ = fmt.Fprintf(w, "\nConnection flags (every subcommand): --kubeconfig, --context, -n/--namespace (kproxy's, default kube-system).\nRun 'kubectl kproxy SUBCOMMAND --help' for a subcommand's flags.\n")
}

// run is main without the process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "version" {
		_, _ = fmt.Fprintln(stdout, version.String())
		return 0
	}
	sc, ok := subcommands[args[0]]
	if !ok {
		_, _ = fmt.Fprintf(stderr, "kubectl kproxy: unknown subcommand %q\n", args[0])
		usage(stderr)
		return 1
	}
	return sc.run(ctx, args[1:], &connection{}, stdout, stderr)
}

// connection holds kubectl's connection flags and makes the client.
type connection struct {
	kubeconfig, context, namespace string
	// config, when set, is used instead of the flags (tests).
	config *rest.Config
	// clientset, when set, is the client (tests with a fake clientset).
	clientset kubernetes.Interface
	// host is the API server's address, once client was called.
	host string
}

func (c *connection) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config), as kubectl.")
	fs.StringVar(&c.context, "context", "", "The kubeconfig context to use, as kubectl.")
	fs.StringVarP(&c.namespace, "namespace", "n", "kube-system", "The namespace kproxy's DaemonSets run in.")
}

func (c *connection) client() (kubernetes.Interface, error) {
	if c.clientset != nil {
		c.host = "the test's API server"
		return c.clientset, nil
	}
	cfg := c.config
	if cfg == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if c.kubeconfig != "" {
			rules.ExplicitPath = c.kubeconfig
		}
		var err error
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.context}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("loading the kubeconfig: %w", err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	c.host = cfg.Host
	cfg.UserAgent = "kubectl-kproxy/" + strings.TrimPrefix(version.Version, "v")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return cs, nil
}
