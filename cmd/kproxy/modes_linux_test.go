package main

import (
	"context"
	"errors"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/platform/linux"
)

// failingHost is a linux.Host whose sysctl writes fail.
type failingHost struct{ *linux.FakeHost }

func (failingHost) SetSysctl(name, _ string) error { return errors.New("read-only " + name) }

func initOptions(t *testing.T, args ...string) *config.Options {
	t.Helper()
	// --conntrack-max-per-core=0: nf_conntrack_max is left alone, so that
	// nothing tries the host's global conntrack hash size.
	o, code, done := parseArgs(append([]string{"--init-only", "--hostname-override=node1", "--conntrack-max-per-core=0"}, args...), io.Discard, io.Discard)
	if done {
		t.Fatalf("parseArgs %q: exit %d", args, code)
	}
	return o
}

// TestInitOnly: --init-only sets the OOM score and the conntrack sysctls
// the configuration asks for, and route_localnet when IPv4 localhost
// NodePorts are served, through the host it is given.
func TestInitOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want map[string]string
	}{
		{"defaults and a few conntrack settings", []string{"--oom-score-adj=-500", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s"}, map[string]string{
			"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
			"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
			"net/netfilter/nf_conntrack_tcp_be_liberal":          "1",
			"net/netfilter/nf_conntrack_udp_timeout":             "30",
			"net/ipv4/conf/all/route_localnet":                   "1",
		}},
		{"no localhost NodePorts, kernel's timeouts", []string{"--oom-score-adj=-500", "--iptables-localhost-nodeports=false",
			"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}, map[string]string{}},
		{"NodePorts only on other addresses", []string{"--oom-score-adj=-500", "--nodeport-addresses=10.0.0.0/8",
			"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := initOptions(t, tc.args...)
			var oom []int
			host := &linux.FakeHost{}
			if err := initNodeWith(context.Background(), o, func(v int) error { oom = append(oom, v); return nil }, host); err != nil {
				t.Fatal(err)
			}
			if len(oom) != 1 || oom[0] != -500 {
				t.Errorf("OOM score adjustments %v, want [-500]", oom)
			}
			got := host.Sysctls
			if got == nil {
				got = map[string]string{}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("sysctls %v, want %v", got, tc.want)
			}
		})
	}
}

// TestInitOnlyFails: unlike a normal start, --init-only fails when a write
// fails, naming each one.
func TestInitOnlyFails(t *testing.T) {
	o := initOptions(t)
	err := initNodeWith(context.Background(), o, func(int) error { return errors.New("oom_score_adj denied") }, failingHost{&linux.FakeHost{}})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--init-only", "oom_score_adj denied", "read-only net/netfilter/nf_conntrack_tcp_timeout_established", "read-only net/ipv4/conf/all/route_localnet"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
