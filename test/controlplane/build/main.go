// Command build pre-builds the control-plane binaries (etcd, kube-apiserver,
// upstream kube-proxy for the drop-in tests, kubectl) into the cache
// directory so that later test runs start in seconds:
//
//	go run ./test/controlplane/build            # make controlplane
//	go run ./test/controlplane/build -cluster   # make cluster-binaries: also kubelet,
//	                                            # the controllers, containerd, CoreDNS and
//	                                            # the test images' programs
//	go run ./test/controlplane/build -conformance  # make conformance-binaries: e2e.test, ginkgo
//
// It prints where the binaries are and how long each build took. Run it from
// anywhere inside the kproxy repository; KPROXY_CONTROLPLANE_CACHE and
// KPROXY_CLUSTER_CACHE move the caches (see the controlplane package).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/kproxy/kproxy/test/controlplane"
)

func main() {
	cluster := flag.Bool("cluster", false, "also build the binaries of make cluster")
	conformance := flag.Bool("conformance", false, "also build those of make conformance (e2e.test, ginkgo)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "controlplane: "+format+"\n", args...)
	}
	bins, err := controlplane.EnsureBinaries(ctx, logf)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		os.Exit(1)
	}
	results := bins.Results
	if *cluster {
		cb, err := controlplane.EnsureCluster(ctx, controlplane.BuildOptions{Logf: logf})
		if err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
			os.Exit(1)
		}
		results = append(results, cb.Results...)
	}
	if *conformance {
		cb, err := controlplane.EnsureConformance(ctx, controlplane.BuildOptions{Logf: logf})
		if err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
			os.Exit(1)
		}
		results = append(results, cb.Results...)
	}
	for _, r := range results {
		state := "cached"
		if r.Built {
			state = "built in " + r.Duration.Round(100*time.Millisecond).String()
		}
		fmt.Printf("%-24s %-22s %6.1f MB  %s\n", r.Name, state, float64(r.Size)/1e6, r.Path)
	}
	fmt.Printf("total %s\n", time.Since(start).Round(100*time.Millisecond))
}
