//go:build !linux

// Command kpt-pause is the pod sandbox of make cluster's Linux nodes.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kpt-pause: Linux only (the pod sandbox of make cluster's nodes)")
	os.Exit(1)
}
