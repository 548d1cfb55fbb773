// Command build pre-builds the control-plane binaries (etcd, kube-apiserver,
// and upstream kube-proxy for the drop-in tests) into the cache directory so
// that later test runs start in seconds:
//
//	go run ./test/controlplane/build
//
// It prints where the binaries are and how long each build took. Run it from
// anywhere inside the kproxy repository; KPROXY_CONTROLPLANE_CACHE moves the
// cache (see the controlplane package).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/kproxy/kproxy/test/controlplane"
)

func main() {
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
	for _, r := range bins.Results {
		state := "cached"
		if r.Built {
			state = "built in " + r.Duration.Round(100*time.Millisecond).String()
		}
		fmt.Printf("%-15s %-30s %6.1f MB  %s\n", r.Name, state, float64(r.Size)/1e6, r.Path)
	}
	fmt.Printf("total %s\n", time.Since(start).Round(100*time.Millisecond))
}
