//go:build !linux

// Command kproxy-cluster runs make cluster (network namespaces, cgroups and
// mounts: Linux only).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kproxy-cluster: make cluster needs Linux (network namespaces, cgroups, mounts)")
	os.Exit(1)
}
