// Command kproxy is a Kubernetes Service proxy for Linux (iptables) and
// Windows (HNS, "kernelspace") nodes; a replacement for kube-proxy.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/version"
)

func main() {
	tuneGC(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	klog.Flush()
	os.Exit(code)
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == checkHNSCommand {
		return runCheckHNS(ctx, args[1:], os.Getenv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "explain" {
		return runExplain(ctx, args[1:], stdout, stderr)
	}
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	o := config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.Version {
		_, _ = fmt.Fprintln(stdout, version.String())
		return 0
	}
	if err := o.Complete(fs); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy: %v\n", err)
		return 1
	}
	if err := o.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy: %v\n", err)
		return 1
	}
	logger := klog.Background()
	for _, w := range o.Warnings() {
		logger.Info("Warning: configuration", "problem", w)
	}
	ctx = klog.NewContext(ctx, logger)
	if err := app.Run(ctx, o, modes(), stdout); err != nil {
		logger.Error(err, "kproxy stopped")
		return 1
	}
	return 0
}
