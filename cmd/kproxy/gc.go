package main

import "runtime/debug"

// defaultGCPercent is kproxy's garbage-collection target when the GOGC
// environment variable is not set: collect when the heap has grown by half
// of what survived the last collection, not by all of it (Go's default).
// kproxy's live heap is mostly the cache, and a full sync allocates, at
// 10,000 Services, about as much again in short-lived rule text: at 100 the
// resident memory settles near twice the live heap. At 50 it stays about a
// quarter lower, for a little more collection work (measured in
// docs/benchmarks.md). GOGC, and GOMEMLIMIT, keep their usual meaning.
const defaultGCPercent = 50

// tuneGC applies defaultGCPercent unless getenv("GOGC") is set. It returns
// the percentage in force.
func tuneGC(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		return gcPercent()
	}
	debug.SetGCPercent(defaultGCPercent)
	return defaultGCPercent
}

// gcPercent reads the garbage-collection percentage in force.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}
