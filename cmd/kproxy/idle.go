package main

import (
	"context"
	"fmt"
	"io"
)

// idleCommand waits, doing nothing, until the process is asked to stop
// (SIGTERM or SIGINT), then exits 0. The cleanup DaemonSet
// (deploy/cleanup) runs it as its long-running container after its init
// container ran kproxy --cleanup: the image holds no sleep (no coreutils),
// and unlike sleep as PID 1, which ignores SIGTERM and is killed only when
// the grace period ends, it stops at once when the DaemonSet is deleted.
const idleCommand = "idle"

// runIdle blocks until ctx is done (main's ctx ends on SIGTERM and
// SIGINT). It takes no arguments.
func runIdle(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) > 0 {
		_, _ = fmt.Fprintf(stderr, "kproxy %s: takes no arguments, got %q\n", idleCommand, args)
		return 1
	}
	<-ctx.Done()
	return 0
}
