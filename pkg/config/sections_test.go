package config

import (
	"errors"
	"testing"

	"github.com/spf13/pflag"
)

func registered() *pflag.FlagSet {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	return fs
}

// TestFlagSectionsCoverEveryFlag: every flag AddFlags registers is in
// exactly one section of the help, and every name a section lists exists.
func TestFlagSectionsCoverEveryFlag(t *testing.T) {
	fs := registered()
	in := map[string][]string{}
	for _, s := range FlagSections {
		if len(s.Flags) == 0 {
			t.Errorf("section %q is empty", s.Title)
		}
		for _, name := range s.Flags {
			in[name] = append(in[name], s.Title)
			if fs.Lookup(name) == nil {
				t.Errorf("section %q lists --%s, which is not registered", s.Title, name)
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if n := len(in[f.Name]); n != 1 {
			t.Errorf("--%s is in %d sections %v, want exactly one", f.Name, n, in[f.Name])
		}
	})
}

func TestSuggestFlag(t *testing.T) {
	fs := registered()
	for _, tc := range []struct {
		typed, want string
	}{
		{"kubeconfg", "kubeconfig"},
		{"--hostname-overide", "hostname-override"},
		{"proxymode", "proxy-mode"},
		{"proxy_mod", "proxy-mode"},
		{"Dry-Rn", "dry-run"},
		{"masquerade-al", "masquerade-all"},
		{"iptables-sync-perod", "iptables-sync-period"},
		{"conntrack-tcp-timeout-establised", "conntrack-tcp-timeout-established"},
		{"no-such-flag", ""},   // nothing near
		{"xyz", ""},            // three edits from "v": too far
		{"bananas", ""},        //
		{"healthz-prt", ""},    // healthz-port is deprecated: never suggested
		{"vv", "v"},            // one edit, shorter than the name
		{"a", ""},              // a one-letter name is never "close"
		{"versoin", "version"}, // a transposition is two edits
	} {
		got, ok := SuggestFlag(fs, tc.typed)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("SuggestFlag(%q) = %q, %v; want %q", tc.typed, got, ok, tc.want)
		}
	}
}

func TestUnknownFlag(t *testing.T) {
	fs := registered()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfg=x"}, "kubeconfg"},
		{[]string{"--kubeconfg", "x"}, "kubeconfg"},
		{[]string{"-q"}, "q"},
	} {
		err := fs.Parse(tc.args)
		got, ok := UnknownFlag(err)
		if !ok || got != tc.want {
			t.Errorf("Parse(%q): %v: UnknownFlag = %q, %v; want %q", tc.args, err, got, ok, tc.want)
		}
	}
	if _, ok := UnknownFlag(errors.New("invalid argument")); ok {
		t.Error("UnknownFlag of another error: ok")
	}
}
