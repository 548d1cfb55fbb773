// Command kproxy-conformance runs make conformance and make
// conformance-all (see package conformance):
//
//	kproxy-conformance [flags] run       one PROXY and MODE: the cluster, the suite, the reports
//	kproxy-conformance [flags] all       kproxy and kube-proxy, iptables and nftables, each on a new
//	                                     cluster, then compare.md side by side
//	kproxy-conformance compare DIR...    compare.md of report directories already written
//
// Needs root (make cluster's).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/cluster"
	"github.com/kproxy/kproxy/test/conformance"
	"github.com/kproxy/kproxy/test/controlplane"
)

func main() {
	var o conformance.Options
	flag.StringVar(&o.Root, "root", "", "kproxy repository root (default: found from the working directory)")
	flag.StringVar(&o.ClusterDir, "dir", "", "make cluster's state directory (default <repository>/.build/cluster)")
	flag.StringVar(&o.Proxy, "proxy", cluster.ProxyKproxy, "kproxy or kube-proxy")
	flag.StringVar(&o.Mode, "mode", "iptables", "iptables or nftables")
	flag.StringVar(&o.Focus, "focus", "", "ginkgo focus (default "+conformance.DefaultFocus+")")
	flag.IntVar(&o.Nodes, "nodes", 4, "parallel ginkgo processes")
	flag.StringVar(&o.ReportDir, "report-dir", "", "where the reports go (default <repository>/.build/conformance/PROXY-MODE)")
	flag.BoolVar(&o.Fresh, "fresh", false, "start a new cluster even if one with this proxy and mode runs")
	flag.DurationVar(&o.Timeout, "timeout", 6*time.Hour, "bound on the suite")
	flag.StringVar(&o.KproxyImage, "kproxy-image", "", "kproxy's image archive (default: make images')")
	flag.StringVar(&o.ClusterTool, "cluster-tool", "", "the kproxy-cluster binary (default <repository>/.build/kproxy-cluster, make cluster-tool's)")
	flag.BoolVar(&o.Down, "down", false, "take the cluster down when the run ends, whatever its result (make test-cluster)")
	flag.BoolVar(&o.RequirePassed, "require-passed", false, "fail a run in which no test passed")
	flag.BoolVar(&expectFailures, "expect-failures", false, "succeed only if tests fail (make conformance-fault: a broken kproxy must be caught)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: kproxy-conformance [flags] run|all|compare DIR...")
		flag.PrintDefaults()
		os.Exit(2)
	}
	if err := run(o, flag.Arg(0), flag.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-conformance:", err)
		os.Exit(1)
	}
}

// expectFailures inverts run's verdict (make conformance-fault).
var expectFailures bool

func run(o conformance.Options, cmd string, args []string) error {
	if o.Root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if o.Root, err = controlplane.RepoRoot(wd); err != nil {
			return err
		}
	}
	if err := os.Chdir(o.Root); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o.Command = "kproxy-conformance " + strings.Join(os.Args[1:], " ")
	switch cmd {
	case "run":
		res, err := conformance.Execute(ctx, o)
		if !expectFailures {
			return err
		}
		if errors.Is(err, conformance.ErrEvidence) {
			return err
		}
		if !errors.Is(err, conformance.ErrFailures) {
			return fmt.Errorf("the suite caught no failure with -expect-failures (%d tests passed): %v", res.Counts()["passed"], err)
		}
		fmt.Printf("kproxy-conformance: as expected, the suite caught the fault: %v\n", err)
		return nil
	case "all":
		var dirs []string
		var errs []error
		for _, proxy := range []string{cluster.ProxyKproxy, cluster.ProxyKubeProxy} {
			for _, mode := range cluster.Modes {
				run := o
				run.Proxy, run.Mode, run.Fresh = proxy, mode, true
				run.ReportDir = filepath.Join(o.Root, ".build", "conformance", proxy+"-"+mode)
				if _, err := conformance.Execute(ctx, run); err != nil {
					errs = append(errs, err)
					if !errors.Is(err, conformance.ErrFailures) {
						fmt.Fprintf(os.Stderr, "kproxy-conformance: %s %s: %v\n", proxy, mode, err)
					}
				}
				dirs = append(dirs, run.ReportDir)
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
		if err := compare(o.Root, dirs); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	case "compare":
		return compare(o.Root, args)
	}
	return fmt.Errorf("unknown command %q (want run, all or compare)", cmd)
}

// compare writes <root>/.build/conformance/compare.md from report directories
// named PROXY-MODE.
func compare(root string, dirs []string) error {
	var cols []conformance.Column
	for _, d := range dirs {
		f, err := os.Open(filepath.Join(d, "junit_01.xml"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "kproxy-conformance: %s: %v (left out)\n", d, err)
			continue
		}
		res, err := conformance.ReadJUnit(f)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		cols = append(cols, conformance.Column{Title: filepath.Base(d), Results: res})
	}
	out := filepath.Join(root, ".build", "conformance", "compare.md")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, []byte(conformance.Compare(cols)), 0o644); err != nil {
		return err
	}
	fmt.Println("kproxy-conformance: " + out)
	return nil
}
