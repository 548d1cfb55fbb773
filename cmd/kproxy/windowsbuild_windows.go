package main

import (
	"fmt"

	"golang.org/x/sys/windows"
)

// windowsBuild names this Windows build ("10.0.17763"): the echoes HNS
// returns are learned per build.
func windowsBuild() string {
	v := windows.RtlGetVersion()
	return fmt.Sprintf("%d.%d.%d", v.MajorVersion, v.MinorVersion, v.BuildNumber)
}
