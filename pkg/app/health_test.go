package app

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/kproxy/kproxy/pkg/config"
)

// TestHealthBeforeFirstSync checks upstream's start-up contract: the healthz
// port answers before the first sync (here while the backends are still
// being created); /livez is 200 with no family judged yet; /healthz is 503
// with nodeEligible false as long as the Node has not been seen, even after
// syncs succeed, and 200 once it has.
func TestHealthBeforeFirstSync(t *testing.T) {
	dir := manifests(t, map[string]string{"web.yaml": lbYAML(freePort(t), "node1")})
	release := make(chan struct{})
	h := start(t, dir, run{tweak: func(_ *config.Options, d *Deps) {
		mode := d.Modes["iptables"]
		newBackend := mode.NewBackend
		mode.NewBackend = func(ctx context.Context, o *config.Options, env Env) (Backends, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return newBackend(ctx, o, env)
		}
		d.Modes = Modes{"iptables": mode}
	}})
	h.waitServers("healthz")
	healthz, livez := "http://"+h.servers["healthz"]+"/healthz", "http://"+h.servers["healthz"]+"/livez"
	check := func(stage string, hzCode, lzCode int, eligible bool, families int) {
		t.Helper()
		hz, lz := fetch(t, healthz), fetch(t, livez)
		if hz.code != hzCode || lz.code != lzCode {
			t.Errorf("%s: /healthz %d /livez %d, want %d %d", stage, hz.code, lz.code, hzCode, lzCode)
		}
		hb, lb := hz.json(t), lz.json(t)
		if hb["nodeEligible"] != eligible {
			t.Errorf("%s: nodeEligible %v, want %v (%s)", stage, hb["nodeEligible"], eligible, hz.body)
		}
		if _, ok := lb["nodeEligible"]; ok {
			t.Errorf("%s: /livez reports nodeEligible: %s", stage, lz.body)
		}
		for _, b := range []map[string]any{hb, lb} {
			status, _ := b["status"].(map[string]any)
			if len(status) != families {
				t.Errorf("%s: status %v, want %d families", stage, b["status"], families)
			}
			for _, k := range []string{"lastUpdated", "currentTime", "healthy"} {
				if _, ok := b[k]; !ok {
					t.Errorf("%s: field %q missing: %v", stage, k, b)
				}
			}
		}
	}
	check("backends not created yet", 503, 200, false, 0)
	close(release)
	gen := h.waitSync("first sync", succeeded).gen
	check("synced, node unknown", 503, 200, false, 2)
	h.write("node.yaml", fmt.Sprintf(nodeYAML, ""))
	h.changed("node seen", gen)
	check("node seen", 200, 200, true, 2)
}

// TestHealthCheckPortAddresses checks that with nodePortAddresses set the
// health check node ports listen only on the local addresses in it, as
// upstream: here 127.0.0.2 answers and 127.0.0.1 refuses the connection.
func TestHealthCheckPortAddresses(t *testing.T) {
	hc := freePort(t)
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(hc, "node1")})
	h := start(t, dir, run{tweak: func(o *config.Options, d *Deps) {
		o.Config.NodePortAddresses = []string{"127.0.0.2/32"}
		d.HealthCheckIPs = nil
		d.InterfaceAddrs = func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("::1")}, nil
		}
	}})
	h.waitSync("first sync", succeeded)
	if r := fetch(t, fmt.Sprintf("http://127.0.0.2:%d/", hc)); r.code != 200 {
		t.Errorf("127.0.0.2: %d %s, want 200", r.code, r.body)
	}
	if _, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d/", hc)); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("127.0.0.1 (not in nodePortAddresses): %v, want connection refused", err)
	}
}
