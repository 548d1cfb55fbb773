//go:build !linux

// Command kproxy-nscluster runs make netns-cluster (network namespaces: Linux only).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kproxy-nscluster: make netns-cluster needs Linux (network namespaces)")
	os.Exit(1)
}
