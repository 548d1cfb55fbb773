//go:build !linux

// Command kproxy-conformance runs make conformance (Linux only: it runs
// make cluster).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kproxy-conformance: make conformance needs Linux (make cluster)")
	os.Exit(1)
}
