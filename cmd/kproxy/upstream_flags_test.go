//go:build !windows

// The upstream-flag tests describe the Linux binary: there the default mode
// is iptables, nftables configurations run the nftables backend and ipvs
// ones the iptables backend. On
// Windows the mode defaults to kernelspace and ipvs is refused (as upstream's
// Windows binary refuses it), so these expectations do not apply there.

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/pkg/config"
)

// upstreamFlags is every flag upstream kube-proxy v1.37 registers
// (cmd/kube-proxy/app/options.go, its Windows-only flags, component-base's
// logging flags), each with a typical value, written from upstream's
// options file. The flags that make the command exit before a dry run
// (--cleanup, --init-only, --write-config-to, --version, --help, --config)
// have tests of their own.
var upstreamFlags = [][]string{
	{"--feature-gates=AllAlpha=false,ServiceTrafficDistribution=true"},
	{"--kubeconfig=/var/lib/kube-proxy/kubeconfig.conf"},
	{"--master=https://10.0.0.1:6443"},
	{"--kube-api-content-type=application/json"},
	{"--kube-api-burst=20"},
	{"--kube-api-qps=10"},
	{"--hostname-override=node1"},
	{"--bind-address=10.0.0.11"},
	{"--healthz-bind-address=0.0.0.0:10256"},
	{"--metrics-bind-address=127.0.0.1:10249"},
	{"--bind-address-hard-fail=true"},
	{"--profiling=true"},
	{"--show-hidden-metrics-for-version=1.36"},
	{"--proxy-mode=iptables"},
	{"--proxy-mode=ipvs"},
	{"--proxy-mode=nftables"},
	{"--iptables-masquerade-bit=14"},
	{"--masquerade-all=true"},
	{"--iptables-localhost-nodeports=false"},
	{"--iptables-sync-period=30s"},
	{"--iptables-min-sync-period=1s"},
	{"--ipvs-sync-period=30s"},
	{"--ipvs-min-sync-period=2s"},
	{"--ipvs-scheduler=rr"},
	{"--ipvs-exclude-cidrs=10.10.0.0/16,10.11.0.0/16"},
	{"--ipvs-strict-arp=true"},
	{"--ipvs-tcp-timeout=900s"},
	{"--ipvs-tcpfin-timeout=120s"},
	{"--ipvs-udp-timeout=300s"},
	{"--detect-local-mode=ClusterCIDR"},
	{"--pod-bridge-interface=cbr0"},
	{"--pod-interface-name-prefix=veth"},
	{"--cluster-cidr=10.244.0.0/16"},
	{"--nodeport-addresses=10.0.0.0/8"},
	{"--oom-score-adj=-999"},
	{"--conntrack-max-per-core=32768"},
	{"--conntrack-min=131072"},
	{"--conntrack-tcp-timeout-established=24h"},
	{"--conntrack-tcp-timeout-close-wait=1h"},
	{"--conntrack-tcp-be-liberal=true"},
	{"--conntrack-udp-timeout=30s"},
	{"--conntrack-udp-timeout-stream=2m"},
	{"--config-sync-period=15m"},
	{"--healthz-port=10256"},
	{"--metrics-port=10249"},
	{"--logging-format=text"},
	{"--log-flush-frequency=5s"},
	{"-v=2"},
	{"--v=2"},
	{"--vmodule=proxier=4"},
	{"--log-text-split-stream=false"},
	{"--log-text-info-buffer-size=0"},
	{"--log-json-split-stream=false"},
	{"--log-json-info-buffer-size=0"},
	// Upstream registers these on Windows only; kproxy everywhere.
	{"--windows-service=false"},
	{"--source-vip=10.244.1.2"},
	{"--network-name=vxlan0"},
	{"--enable-dsr=false"},
	{"--root-hnsendpoint-name=cbr0"},
	{"--forward-healthcheck-vip=false"},
	// Underscore spellings are normalized, as upstream's command does.
	{"--hostname_override=node1"},
	{"--iptables_sync_period=30s"},
	{"--masquerade_all"},
}

// dryRunArgs runs kproxy on docs/examples as node1 in a dry run.
func dryRunArgs(extra ...string) []string {
	return append([]string{"--manifests", filepath.Join("..", "..", "docs", "examples"), "--hostname-override", "node1", "--dry-run"}, extra...)
}

func runQuiet(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Cleanup(resetLogging)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	code = run(ctx, args, &out, &errs)
	return code, out.String(), errs.String()
}

// resetLogging puts klog's -v and --vmodule back after a test set them.
func resetLogging() {
	fs := pflag.NewFlagSet("reset", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	_ = fs.Set("v", "0")
	_ = fs.Set("vmodule", "")
}

// TestEveryUpstreamFlagRuns starts kproxy (dry run) with each of upstream
// kube-proxy's flags: every one is accepted and the rules are printed.
func TestEveryUpstreamFlagRuns(t *testing.T) {
	for _, args := range upstreamFlags {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errs := runQuiet(t, dryRunArgs(args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			want := "*nat"
			if slices.Contains(args, "--proxy-mode=nftables") {
				want = "add table ip kproxy"
			}
			if !strings.Contains(out, want) {
				t.Errorf("no rules printed (want %q):\n%s", want, out)
			}
		})
	}
}

// TestFlagErrorsAreExplained: a bad flag or a stray argument prints the
// error and a usage hint and exits 1, as upstream's command does
// (component-base's cli.Run returns 1 for any error, flag errors included).
// A blank --hostname-override and an unknown --logging-format are errors
// too, as upstream.
func TestFlagErrorsAreExplained(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"--feature-gates=junk"}, {"--iptables-sync-period=soon"}, {"--version=maybe"}, {"stray-argument"}} {
		code, _, errs := runQuiet(t, args...)
		if code != 1 || !strings.Contains(errs, "kproxy: ") || !strings.Contains(errs, "for usage") {
			t.Errorf("%q: exit %d, stderr %q; want 1, the error and a usage hint", args, code, errs)
		}
	}
	for _, tc := range []struct{ arg, says string }{
		{"--hostname-override= ", "empty --hostname-override is invalid"},
		{"--logging-format=xml", `logging.format: Unsupported value: "xml"`},
	} {
		code, _, errs := runQuiet(t, dryRunArgs(tc.arg)...)
		if code != 1 || !strings.Contains(errs, tc.says) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and %q", tc.arg, code, errs, tc.says)
		}
	}
}

// TestConfigFiles runs kproxy (dry run) with the config files an operator
// brings from kube-proxy.
func TestConfigFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		name string
		file string
		// check inspects the completed options.
		check func(t *testing.T, o *config.Options)
	}{
		{"kubeadm's config.conf as is", filepath.Join("testdata", "kubeadm-config.conf"), func(t *testing.T, o *config.Options) {
			if o.ProxyMode() != config.ModeIPTables || o.ClientConnection().Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || len(o.Warnings()) != 0 {
				t.Errorf("mode %q, kubeconfig %q, warnings %q", o.ProxyMode(), o.ClientConnection().Kubeconfig, o.Warnings())
			}
		}},
		{"mode ipvs with scheduler rr", write("ipvs.yaml", head+"mode: ipvs\nipvs:\n  scheduler: rr\n  syncPeriod: 45s\n  minSyncPeriod: 3s\n"), func(t *testing.T, o *config.Options) {
			if o.ProxyMode() != config.ModeIPTables || o.RequestedMode() != config.ModeIPVS || o.IPVSScheduler() != "rr" ||
				o.SyncPeriod() != 45*time.Second || o.MinSyncPeriod() != 3*time.Second || !strings.Contains(o.ModeWarning(), "ipvs") {
				t.Errorf("runs %q (asked %q), scheduler %q, periods %v/%v, warning %q", o.ProxyMode(), o.RequestedMode(), o.IPVSScheduler(), o.SyncPeriod(), o.MinSyncPeriod(), o.ModeWarning())
			}
		}},
		{"mode nftables", write("nft.yaml", head+"mode: nftables\nnftables:\n  syncPeriod: 50s\n"), func(t *testing.T, o *config.Options) {
			if o.ProxyMode() != config.ModeNFTables || o.SyncPeriod() != 50*time.Second || !o.NodePortAddresses().Primary ||
				o.ModeWarning() != "" {
				t.Errorf("runs %q, period %v, nodePortAddresses %+v, warning %q", o.ProxyMode(), o.SyncPeriod(), o.NodePortAddresses(), o.ModeWarning())
			}
		}},
		{"an unknown field", write("unknown.yaml", head+"udpIdleTimeout: 250ms\n"), func(t *testing.T, o *config.Options) {
			if w := strings.Join(o.Warnings(), "\n"); !strings.Contains(w, `unknown field "udpIdleTimeout"`) {
				t.Errorf("warnings %q do not name the unknown field", w)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := dryRunArgs("--config", tc.file)
			code, out, errs := runQuiet(t, args...)
			want := "*nat"
			if strings.HasSuffix(tc.file, "nft.yaml") {
				want = "add table ip kproxy"
			}
			if code != 0 || !strings.Contains(out, want) {
				t.Fatalf("exit %d, stderr %s, stdout %.200s", code, errs, out)
			}
			o, code, done := parseArgs(args, &bytes.Buffer{}, &bytes.Buffer{})
			if done {
				t.Fatalf("parseArgs: exit %d", code)
			}
			tc.check(t, o)
		})
	}
}

// TestWriteConfigTo: --write-config-to writes the effective configuration,
// which kproxy then reads back unchanged.
func TestWriteConfigTo(t *testing.T) {
	out := filepath.Join(t.TempDir(), "written.yaml")
	if code, _, errs := runQuiet(t, "--write-config-to", out, "--proxy-mode=ipvs", "--ipvs-scheduler=sh", "--hostname-override=node1"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	c, err := config.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != config.ModeIPVS || c.IPVS.Scheduler != "sh" || c.IPTables.SyncPeriod.Duration != 30*time.Second {
		t.Errorf("written: mode %q, scheduler %q, iptables.syncPeriod %v", c.Mode, c.IPVS.Scheduler, c.IPTables.SyncPeriod)
	}
}

// TestVersionRaw: --version=raw, as upstream, prints the detailed version.
func TestVersionRaw(t *testing.T) {
	code, out, _ := runQuiet(t, "--version=raw")
	if code != 0 || !strings.Contains(out, "GoVersion") {
		t.Errorf("exit %d, %q", code, out)
	}
}
