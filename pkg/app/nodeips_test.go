package app

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// TestHealthCheckIPs checks the addresses health check node ports listen on
// against upstream kube-proxy v1.37's choice (one server per family: the
// unspecified address when nodePortAddresses matches every address of the
// family, else the local addresses in its CIDRs).
func TestHealthCheckIPs(t *testing.T) {
	dual := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	v4only := []v1.IPFamily{v1.IPv4Protocol}
	local := addrs("127.0.0.1", "10.0.0.5", "192.168.1.7", "::1", "fd00::5")
	node := proxy.Node{Known: true, Addresses: addrs("192.168.1.7", "10.0.0.5", "fd00::5")}
	for _, tc := range []struct {
		name  string
		np    []string
		fams  []v1.IPFamily
		node  proxy.Node
		local []netip.Addr
		want  []string
	}{
		{"unset: every address of each family", nil, dual, node, local, []string{"0.0.0.0", "::"}},
		{"unset, single stack", nil, v4only, node, local, []string{"0.0.0.0"}},
		{"zero CIDRs", []string{"0.0.0.0/0", "::/0"}, dual, node, local, []string{"0.0.0.0", "::"}},
		{"IPv4 CIDR: IPv6 matches all", []string{"10.0.0.0/8"}, dual, node, local, []string{"10.0.0.5", "::"}},
		{"CIDR matching nothing: no listener", []string{"172.16.0.0/12"}, v4only, node, local, nil},
		{"loopback CIDR", []string{"127.0.0.0/8", "fd00::/64"}, dual, node, local, []string{"127.0.0.1", "fd00::5"}},
		{"primary: the node's primary IPs", []string{"primary"}, dual, node, local, []string{"192.168.1.7", "fd00::5"}},
		{"primary without an IPv6 node IP: every IPv6 address", []string{"primary"}, dual,
			proxy.Node{Known: true, Addresses: addrs("192.168.1.7")}, local, []string{"192.168.1.7", "::"}},
		{"primary, node unknown", []string{"primary"}, v4only, proxy.Node{}, local, []string{"0.0.0.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := config.NewOptions()
			o.Config.NodePortAddresses = tc.np
			got := healthCheckIPs(o.NodePortAddresses(), tc.fams, tc.node, tc.local)
			if want := addrs(tc.want...); !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

// TestWithBindAddress checks that a specific bindAddress becomes the node's
// primary IP of its family, as upstream's node IP detection does, and that
// 0.0.0.0 and :: change nothing.
func TestWithBindAddress(t *testing.T) {
	snap := &proxy.Snapshot{Generation: 3, Node: proxy.Node{Name: "n", Known: true, Addresses: addrs("192.168.1.7", "10.0.0.5", "fd00::5")}}
	for _, tc := range []struct {
		bind    string
		want    []string
		primary [2]string
	}{
		{"0.0.0.0", []string{"192.168.1.7", "10.0.0.5", "fd00::5"}, [2]string{"192.168.1.7", "fd00::5"}},
		{"::", []string{"192.168.1.7", "10.0.0.5", "fd00::5"}, [2]string{"192.168.1.7", "fd00::5"}},
		{"192.168.1.7", []string{"192.168.1.7", "10.0.0.5", "fd00::5"}, [2]string{"192.168.1.7", "fd00::5"}},
		{"10.0.0.5", []string{"10.0.0.5", "192.168.1.7", "fd00::5"}, [2]string{"10.0.0.5", "fd00::5"}},
		{"172.16.0.9", []string{"172.16.0.9", "192.168.1.7", "10.0.0.5", "fd00::5"}, [2]string{"172.16.0.9", "fd00::5"}},
		{"fd00::9", []string{"fd00::9", "192.168.1.7", "10.0.0.5", "fd00::5"}, [2]string{"192.168.1.7", "fd00::9"}},
	} {
		got := withBindAddress(snap, netip.MustParseAddr(tc.bind))
		if !slices.Equal(got.Node.Addresses, addrs(tc.want...)) || got.Generation != 3 {
			t.Errorf("bind %s: addresses %v generation %d, want %v 3", tc.bind, got.Node.Addresses, got.Generation, tc.want)
		}
		for i, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if p := primaryIP(got.Node, f); p.String() != tc.primary[i] {
				t.Errorf("bind %s: primary %s %v, want %s", tc.bind, f, p, tc.primary[i])
			}
		}
	}
	if !slices.Equal(snap.Node.Addresses, addrs("192.168.1.7", "10.0.0.5", "fd00::5")) {
		t.Errorf("the cache's snapshot was modified: %v", snap.Node.Addresses)
	}
}

// viewRecorder is a dry runner that keeps the View it is given.
type viewRecorder struct{ v *intent.View }

func (r *viewRecorder) DryRun(_ io.Writer, v *intent.View) error { r.v = v; return nil }

// TestBindAddressInDryRunAndSnapshot: --dry-run and Snapshot (kproxy
// explain) see the node's primary IP that bindAddress gives, as the syncs do.
func TestBindAddressInDryRunAndSnapshot(t *testing.T) {
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(30999, "node1")})
	want := addrs("192.0.2.77", "192.168.50.11")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	o := options(t, "--manifests", dir, "--hostname-override", "node1", "--bind-address", "192.0.2.77", "--dry-run")
	rec := &viewRecorder{}
	mode := Mode{NewDryRun: func(*config.Options) (Backends, error) {
		return Backends{{Family: v1.IPv4Protocol, Backend: dryRunOnly{rec}}}, nil
	}}
	if err := RunWith(ctx, o, Deps{Modes: Modes{"iptables": mode}}); err != nil {
		t.Fatal(err)
	}
	if rec.v == nil || !slices.Equal(rec.v.Node.Addresses, want) {
		t.Errorf("dry run: node addresses %v, want %v", rec.v.Node.Addresses, want)
	}

	snap, err := Snapshot(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(snap.Node.Addresses, want) {
		t.Errorf("Snapshot: node addresses %v, want %v", snap.Node.Addresses, want)
	}
}

// TestSnapshotIPVSScheduler: kproxy explain's snapshot in mode ipvs uses
// ipvs.scheduler's node-wide algorithm, as the syncs do.
func TestSnapshotIPVSScheduler(t *testing.T) {
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(30999, "node1")})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	snap, err := Snapshot(ctx, options(t, "--manifests", dir, "--hostname-override", "node1", "--proxy-mode", "ipvs", "--ipvs-scheduler", "sh"))
	if err != nil {
		t.Fatal(err)
	}
	if snap.IPv4.Len() == 0 {
		t.Fatal("no IPv4 service port")
	}
	for sp := range snap.IPv4.All() {
		name := sp.Name
		if sp.Algorithm != proxy.AlgorithmSourceHash {
			t.Errorf("%v: algorithm %q, want source-hash from ipvs.scheduler sh", name, sp.Algorithm)
		}
	}
}

// dryRunOnly is a backend that only renders dry runs.
type dryRunOnly struct{ intent.DryRunner }

func (dryRunOnly) Sync(context.Context, *intent.View) error { return nil }
