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
	"github.com/kproxy/kproxy/pkg/logging"
	"github.com/kproxy/kproxy/pkg/version"
)

// The command behaves the same whatever its name: images install it as
// both kproxy and kube-proxy (kube-proxy.exe), so that an existing
// kube-proxy DaemonSet can run it unchanged.
func main() {
	tuneGC(os.Getenv)
	tuneLists(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	klog.Flush()
	os.Exit(code)
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := runSubcommand(ctx, args, stdout, stderr); ok {
		return code
	}
	o, code, done := parseArgs(args, stdout, stderr)
	if done {
		return code
	}
	return runOptions(ctx, o, stdout, stderr)
}

// runSubcommand runs the subcommand args[0] names (check-hns, explain, help, idle) and
// returns its exit code; ok is false when args name none (the proxy runs).
// Every entry point calls it before parseArgs, which knows no subcommand.
func runSubcommand(ctx context.Context, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case checkHNSCommand:
		return runCheckHNS(ctx, args[1:], os.Getenv, stdout, stderr), true
	case explainCommand:
		return runExplain(ctx, args[1:], stdout, stderr), true
	case helpCommand:
		return runHelp(ctx, args[1:], stdout, stderr), true
	case idleCommand:
		return runIdle(ctx, args[1:], stderr), true
	}
	return 0, false
}

// parseArgs parses and completes the options. done is set when the command
// must exit with code (help, version, a flag or configuration error).
func parseArgs(args []string, stdout, stderr io.Writer) (o *config.Options, code int, done bool) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // -h and --help: written to stdout below
	o = config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			writeHelp(stdout, fs)
			return nil, 0, true
		}
		flagError(stderr, "kproxy", fs, err)
		_, _ = fmt.Fprintf(stderr, "Run 'kproxy --help' (or 'kube-proxy --help') for usage.\n")
		return nil, 1, true // as upstream: component-base's cli.Run exits 1 on any error
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "kproxy: takes no arguments, got %q\nRun 'kproxy --help' for usage.\n", fs.Args())
		return nil, 1, true
	}
	switch o.Version {
	case "raw":
		_, _ = fmt.Fprintf(stdout, "%#v\n", version.Raw())
		return nil, 0, true
	case "true":
		_, _ = fmt.Fprintln(stdout, version.String())
		return nil, 0, true
	}
	if err := o.Complete(fs); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy: %v\n", err)
		return nil, 1, true
	}
	if err := o.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy: %v\n", err)
		return nil, 1, true
	}
	return o, 0, false
}

// runOptions runs kproxy with completed, valid options.
func runOptions(ctx context.Context, o *config.Options, stdout, stderr io.Writer) int {
	if err := applyLogging(&o.Config.Logging); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy: logging: %v\n", err)
		return 1
	}
	logger := klog.Background()
	for _, w := range o.Warnings() {
		logging.Warning(logger, "Configuration problem", "problem", w)
	}
	if d := o.Config.Logging.FlushFrequency.Duration.Duration; d > 0 {
		klog.StartFlushDaemon(d)
	}
	if o.WriteConfigTo != "" {
		if err := config.WriteFile(o.WriteConfigTo, o.Config); err != nil {
			_, _ = fmt.Fprintf(stderr, "kproxy: %v\n", err)
			return 1
		}
		logger.Info("Wrote configuration", "file", o.WriteConfigTo)
		return 0
	}
	ctx = klog.NewContext(ctx, logger)
	if err := app.RunWith(ctx, o, app.Deps{Modes: modes(), Stdout: stdout, CollectAfterFullSync: true}); err != nil {
		logger.Error(err, "kproxy stopped")
		return 1
	}
	return 0
}
