package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestRestartWithoutNodeKeepsNodePorts: with --nodeport-addresses primary,
// NodePorts answer on the node's primary address, which only the Node
// object tells. kproxy is restarted while its Node object cannot be read
// (here: gone from the manifest directory; with an API server, kproxy
// syncs after a bounded wait): the rules of the previous run are not
// replaced by a plan without NodePorts. A client reaching the NodePort
// from outside, and one reaching the ClusterIP from a pod, never fail,
// before, during and after the restart, and after the Node comes back.
func TestRestartWithoutNodeKeepsNodePorts(t *testing.T) {
	top := proxytest.Default()
	svc := top.Service("nodeless", 106, proxytest.WithNodePort())
	slices, err := top.Slices(svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxytest.DefaultConfig()
	cfg.NodePortAddresses = "primary"
	e := newEnv(t, envOptions{config: cfg, objects: []any{svc, slices[0], slices[1]},
		extra: []string{"--iptables-sync-period", "2s"}})
	ctx := e.ctx(3 * time.Minute)
	node1, _ := e.top.Node(proxytest.Node1)
	nodePorts := func(stage string) {
		t.Helper()
		for _, fam := range families() {
			addr := netip.AddrPortFrom(node1.Addr(fam), uint16(svc.Spec.Ports[0].NodePort))
			if r := e.c.Probe(ctx, proxytest.Outside, "tcp", addr, echo.ProbeOptions{Timeout: time.Second}); r.Outcome != echo.Answer {
				t.Errorf("%s: NodePort %s from outside: %v", stage, addr, r)
			}
		}
	}
	nodePorts("with the Node")

	connecting := e.connectAllAlong(ctx, svc)
	if err := e.p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	nodes := filepath.Join(e.dir, "00-nodes.yaml")
	saved, err := os.ReadFile(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(nodes); err != nil {
		t.Fatal(err)
	}
	e.start()
	// Several syncs without the Node: the first full one, periodic ones.
	time.Sleep(5 * time.Second)
	nodePorts("restarted without the Node")
	if out := e.p.Process().Output(); !strings.Contains(out, "NodePorts stay on the primary address the rules already use") {
		t.Errorf("kproxy did not say it kept the NodePort address:\n%s", LastLines(WithoutDumps(out), 30))
	}

	if err := WriteManifest(e.dir, "00-nodes.yaml", saved); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	nodePorts("after the Node came back")
	count, failures := connecting()
	t.Logf("%d new connections across a restart without the Node, %d failed", count, len(failures))
	for _, f := range failures {
		t.Errorf("new connection failed: %s", f)
	}
}
