// Package version reports which kproxy build is running.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the kproxy release, set at link time:
//
//	go build -ldflags "-X github.com/kproxy/kproxy/pkg/version.Version=v0.1.0"
//
// When it is left at "dev", String falls back to the module version recorded
// in the binary (set by `go install module@version`).
var Version = "dev"

// String renders "kproxy VERSION (GOVERSION GOOS/GOARCH)".
func String() string {
	return format(Version, buildInfoVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func format(v string, fromBuildInfo func() string, goVersion, goos, goarch string) string {
	if v == "" || v == "dev" {
		if bi := fromBuildInfo(); bi != "" && bi != "(devel)" {
			v = bi
		} else {
			v = "dev"
		}
	}
	return fmt.Sprintf("kproxy %s (%s %s/%s)", v, goVersion, goos, goarch)
}

func buildInfoVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return ""
}

// Info is the detailed version --version=raw prints.
type Info struct {
	Version   string
	GoVersion string
	Compiler  string
	Platform  string
}

// Raw returns the detailed version.
func Raw() Info {
	v := Version
	if v == "" || v == "dev" {
		if bi := buildInfoVersion(); bi != "" && bi != "(devel)" {
			v = bi
		} else {
			v = "dev"
		}
	}
	return Info{Version: v, GoVersion: runtime.Version(), Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH}
}
