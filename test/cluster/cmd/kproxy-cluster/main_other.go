//go:build !linux

// Command kproxy-cluster runs make cluster (network namespaces: Linux only).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kproxy-cluster: make cluster needs Linux (network namespaces)")
	os.Exit(1)
}
