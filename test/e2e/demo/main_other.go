//go:build !linux

// Command demo shows kproxy routing Service traffic in network namespaces
// (make demo). It needs Linux.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "demo: kproxy's demo builds Linux network namespaces; run it on Linux as root (make demo)")
	os.Exit(1)
}
