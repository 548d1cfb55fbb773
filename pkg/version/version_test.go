package version

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name, version, commit string
		build                 build
		want                  string
	}{
		{"linker flags win", "v1.2.3", "abc", build{version: "v9.9.9", revision: rev}, "kproxy v1.2.3 (commit abc, go1.99 linux/amd64)"},
		{"dev falls back to module version", "dev", "abc", build{version: "v0.4.0"}, "kproxy v0.4.0 (commit abc, go1.99 linux/amd64)"},
		{"empty falls back to module version", "", "abc", build{version: "v0.4.0"}, "kproxy v0.4.0 (commit abc, go1.99 linux/amd64)"},
		{"local build stays dev", "dev", "abc", build{version: "(devel)"}, "kproxy dev (commit abc, go1.99 linux/amd64)"},
		{"no build info stays dev", "dev", "abc", build{}, "kproxy dev (commit abc, go1.99 linux/amd64)"},
		{"unstamped commit from vcs.revision", "v1.2.3", "", build{revision: rev}, "kproxy v1.2.3 (commit " + rev + ", go1.99 linux/amd64)"},
		{"vcs.modified marks it dirty", "v1.2.3", "", build{revision: rev, modified: true}, "kproxy v1.2.3 (commit " + rev + "-dirty, go1.99 linux/amd64)"},
		{"no commit anywhere", "v1.2.3", "", build{}, "kproxy v1.2.3 (commit unknown, go1.99 linux/amd64)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := format(tc.version, tc.commit, tc.build, "go1.99", "linux", "amd64")
			if got != tc.want {
				t.Errorf("format() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRawHasCommit(t *testing.T) {
	got := raw("v1.2.3", "", build{revision: "abc", modified: true})
	if got.Version != "v1.2.3" || got.Commit != "abc-dirty" {
		t.Errorf("raw() = %+v, want version v1.2.3, commit abc-dirty", got)
	}
	// --version=raw prints it with %#v: the commit must be in that line.
	if s := fmt.Sprintf("%#v", got); !strings.Contains(s, `Commit:"abc-dirty"`) {
		t.Errorf("%%#v of Info = %s, lacks the commit", s)
	}
}

func TestStringNamesThisBuild(t *testing.T) {
	oldV, oldC := Version, Commit
	t.Cleanup(func() { Version, Commit = oldV, oldC })
	Version, Commit = "v0.0.1-test", "feedface"
	s := String()
	for _, want := range []string{"v0.0.1-test", "commit feedface", runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH} {
		if !strings.Contains(s, want) {
			t.Errorf("String() = %q, missing %q", s, want)
		}
	}
	if r := Raw(); r.Version != "v0.0.1-test" || r.Commit != "feedface" {
		t.Errorf("Raw() = %+v, want the stamped version and commit", r)
	}
}
