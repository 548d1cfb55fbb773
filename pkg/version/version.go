// Package version reports which kproxy build is running.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the kproxy release and Commit the Git commit it was built
// from, both set at link time (make build does it, from git describe and
// git rev-parse):
//
//	go build -ldflags "-X github.com/kproxy/kproxy/pkg/version.Version=v0.1.0 -X github.com/kproxy/kproxy/pkg/version.Commit=$(git rev-parse HEAD)"
//
// When Version is left at "dev", the module version recorded in the binary
// (set by `go install module@version`) is used; when Commit is left empty,
// the revision the go command recorded (vcs.revision, with "-dirty" when
// vcs.modified says the tree had uncommitted changes), else "unknown".
var (
	Version = "dev"
	Commit  = ""
)

// build is what the go command recorded in the binary.
type build struct {
	version  string // main module version; "(devel)" for a local build
	revision string // vcs.revision
	modified bool   // vcs.modified
}

func readBuild() build {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return build{}
	}
	b := build{version: bi.Main.Version}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// resolve returns the version and commit to report from the stamped
// values and what the binary recorded.
func resolve(v, commit string, b build) (string, string) {
	if v == "" || v == "dev" {
		if b.version != "" && b.version != "(devel)" {
			v = b.version
		} else {
			v = "dev"
		}
	}
	if commit == "" {
		switch {
		case b.revision != "" && b.modified:
			commit = b.revision + "-dirty"
		case b.revision != "":
			commit = b.revision
		default:
			commit = "unknown"
		}
	}
	return v, commit
}

// String renders "kproxy VERSION (commit COMMIT, GOVERSION GOOS/GOARCH)".
func String() string {
	return format(Version, Commit, readBuild(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func format(v, commit string, b build, goVersion, goos, goarch string) string {
	v, commit = resolve(v, commit, b)
	return fmt.Sprintf("kproxy %s (commit %s, %s %s/%s)", v, commit, goVersion, goos, goarch)
}

// Info is the detailed version --version=raw prints.
type Info struct {
	Version   string
	Commit    string
	GoVersion string
	Compiler  string
	Platform  string
}

// Raw returns the detailed version.
func Raw() Info {
	return raw(Version, Commit, readBuild())
}

func raw(v, commit string, b build) Info {
	v, commit = resolve(v, commit, b)
	return Info{Version: v, Commit: commit, GoVersion: runtime.Version(), Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH}
}
