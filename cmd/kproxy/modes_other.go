//go:build !linux && !windows

package main

import (
	"net/netip"

	"github.com/kproxy/kproxy/pkg/app"
)

func addPlatformModes(app.Modes) {}

// linuxAddrs: a dry run of a Linux mode on another OS knows no address.
func linuxAddrs() ([]netip.Addr, error) { return nil, nil }
