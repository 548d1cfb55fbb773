package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		name, version, buildInfo, want string
	}{
		{"linker flag wins", "v1.2.3", "v9.9.9", "kproxy v1.2.3 (go1.99 linux/amd64)"},
		{"dev falls back to module version", "dev", "v0.4.0", "kproxy v0.4.0 (go1.99 linux/amd64)"},
		{"empty falls back to module version", "", "v0.4.0", "kproxy v0.4.0 (go1.99 linux/amd64)"},
		{"local build stays dev", "dev", "(devel)", "kproxy dev (go1.99 linux/amd64)"},
		{"no build info stays dev", "dev", "", "kproxy dev (go1.99 linux/amd64)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := format(tc.version, func() string { return tc.buildInfo }, "go1.99", "linux", "amd64")
			if got != tc.want {
				t.Errorf("format() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStringNamesThisBuild(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v0.0.1-test"
	s := String()
	for _, want := range []string{"v0.0.1-test", runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH} {
		if !strings.Contains(s, want) {
			t.Errorf("String() = %q, missing %q", s, want)
		}
	}
}
