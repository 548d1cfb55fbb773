//go:build !windows

package main

// windowsBuild names this Windows build; there is none on other systems.
func windowsBuild() string { return "" }
