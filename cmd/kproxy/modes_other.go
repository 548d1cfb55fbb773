//go:build !linux && !windows

package main

import (
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/platform/linux"
)

func addPlatformModes(app.Modes) {}

func dryRunHost() linux.Host { return &linux.FakeHost{} }
