package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/pkg/config"
)

// TestHelp: --help, -h and `kproxy help` print the grouped help to stdout
// and exit 0 (kproxy help used to be refused as an argument); every visible
// flag is in it, hidden (deprecated) ones are not.
func TestHelp(t *testing.T) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"--proxy-mode", "iptables", "--help"}} {
		var out, errs bytes.Buffer
		code := runMain(context.Background(), args, &out, &errs)
		if code != 0 || errs.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q; want 0 and nothing on stderr", args, code, errs.String())
		}
		help := out.String()
		for _, want := range []string{"Usage:", "Examples:", "--dry-run", "kproxy explain", "docs/reference.md"} {
			if !strings.Contains(help, want) {
				t.Errorf("%q: help lacks %q", args, want)
			}
		}
		last := -1
		for _, s := range config.FlagSections {
			i := strings.Index(help, "\n"+s.Title+":\n")
			if i < 0 {
				t.Errorf("%q: help lacks the section %q", args, s.Title)
			} else if i < last {
				t.Errorf("%q: section %q out of order", args, s.Title)
			}
			last = i
		}
		fs.VisitAll(func(f *pflag.Flag) {
			shown := strings.Contains(help, "--"+f.Name+" ") || strings.Contains(help, "--"+f.Name+"[")
			if f.Hidden && shown {
				t.Errorf("%q: hidden flag --%s is in the help", args, f.Name)
			}
			if !f.Hidden && !shown {
				t.Errorf("%q: --%s is not in the help", args, f.Name)
			}
		})
	}
}

// TestHelpSubcommands: `kproxy help SUBCOMMAND` and `SUBCOMMAND --help`
// print that subcommand's help to stdout; an unknown one is an error.
func TestHelpSubcommands(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help", "explain"}, "Usage: kproxy explain"},
		{[]string{"explain", "--help"}, "Usage: kproxy explain"},
		{[]string{"help", "check-hns"}, "Usage: kproxy check-hns"},
		{[]string{"check-hns", "-h"}, "Usage: kproxy check-hns"},
	} {
		var out, errs bytes.Buffer
		code := runMain(context.Background(), tc.args, &out, &errs)
		if code != 0 || errs.Len() != 0 || !strings.HasPrefix(out.String(), tc.want) {
			t.Errorf("%q: exit %d, stdout %.80q, stderr %q; want 0 and stdout starting %q", tc.args, code, out.String(), errs.String(), tc.want)
		}
		if !strings.Contains(out.String(), "--manifests") && tc.want == "Usage: kproxy explain" {
			t.Errorf("%q: explain's help lacks kproxy's flags", tc.args)
		}
	}
	var out, errs bytes.Buffer
	if code := runMain(context.Background(), []string{"help", "bogus"}, &out, &errs); code != 1 || out.Len() != 0 || !strings.Contains(errs.String(), `"bogus"`) {
		t.Errorf("help bogus: exit %d, stdout %q, stderr %q; want 1 and an error on stderr", code, out.String(), errs.String())
	}
}

// TestDidYouMean: a mistyped flag's error on stderr names the closest
// flag, only when it is close; the exit codes stay (1, as kproxy's own
// for explain too; 2 for check-hns).
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string // "" : no suggestion
	}{
		{[]string{"--kubeconfg", "/x"}, 1, "Did you mean --kubeconfig?"},
		{[]string{"--hostname-overide=n1"}, 1, "Did you mean --hostname-override?"},
		{[]string{"--dryrun"}, 1, "Did you mean --dry-run?"},
		{[]string{"--no-such-flag"}, 1, ""},
		{[]string{"explain", "--too", "10.0.0.1:80"}, 1, "Did you mean --to?"},
		{[]string{"explain", "--manifest", "."}, 1, "Did you mean --manifests?"},
		{[]string{"check-hns", "--fak=exact"}, 2, "Did you mean --fake?"},
	} {
		var out, errs bytes.Buffer
		code := runMain(context.Background(), tc.args, &out, &errs)
		if code != tc.code || out.Len() != 0 || !strings.Contains(errs.String(), "unknown flag") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d and the error on stderr", tc.args, code, out.String(), errs.String(), tc.code)
		}
		if got := strings.Contains(errs.String(), "Did you mean"); tc.want == "" && got {
			t.Errorf("%q: suggested something for a flag nothing is near: %q", tc.args, errs.String())
		} else if tc.want != "" && !strings.Contains(errs.String(), tc.want) {
			t.Errorf("%q: stderr %q lacks %q", tc.args, errs.String(), tc.want)
		}
	}
}
