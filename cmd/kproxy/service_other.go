//go:build !windows

package main

import (
	"context"
	"io"
)

// runMain is run: --windows-service means nothing outside Windows (the
// flag is accepted so that one command line works everywhere).
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, stdout, stderr)
}
