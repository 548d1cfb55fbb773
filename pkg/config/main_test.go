package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// testOptions returns options for goos with a fixed hostname and environment.
func testOptions(goos string, env map[string]string) *Options {
	o := NewOptions()
	o.goos = goos
	o.hostname = func() (string, error) { return " Test-Host ", nil }
	o.getenv = func(k string) string { return env[k] }
	o.Config = o.defaults()
	return o
}

// parse registers the flags of o on a new flag set, parses args, and completes o.
func parse(t *testing.T, o *Options, args ...string) (*pflag.FlagSet, error) {
	t.Helper()
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	return fs, o.Complete(fs)
}

// resetKlogFlags restores klog's -v and --vmodule after a test changed them.
func resetKlogFlags(t *testing.T) {
	t.Cleanup(func() {
		fs := pflag.NewFlagSet("reset", pflag.ContinueOnError)
		addKlogFlags(fs)
		_ = fs.Set("v", "0")
		_ = fs.Set("vmodule", "")
	})
}

// golden compares got with testdata/<name>, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is missing: run go test ./pkg/config -update", path)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
