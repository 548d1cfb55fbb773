package main

import (
	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
)

// modes returns the proxy modes of this build. Dry runs of every mode work
// on every OS (iptablesDryRun, kernelspaceDryRun); each OS adds the backend
// it can run (modes_linux.go, modes_windows.go).
func modes() app.Modes {
	m := app.Modes{
		string(config.ModeIPTables): {NewDryRun: iptablesDryRun, ClassifyError: classifyIPTablesError, LocalAddrs: linuxAddrs},
		string(config.ModeNFTables): {NewDryRun: nftablesDryRun, ClassifyError: classifyIPTablesError, LocalAddrs: linuxAddrs},
		string(config.ModeKernelspace): {NewDryRun: kernelspaceDryRun, ClassifyError: classifyHNSError,
			PodsAlwaysKnown:     modeconfig.PodsAlwaysKnown(string(config.ModeKernelspace)),
			PreserveDestination: modeconfig.PreservesDestination(string(config.ModeKernelspace))},
	}
	addPlatformModes(m)
	return m
}
