// Command demo shows kproxy routing Service traffic on a real kernel (make
// demo): it builds kproxy and an echo server, creates a throwaway topology of
// network namespaces (two nodes, three backend pods, a client pod and an
// outside client), starts kproxy in node1 on a copy of a manifest directory
// (docs/examples/demo), sends requests to the ClusterIP and the NodePort,
// shows which pod answered and the spread, removes an endpoint and shows
// traffic moving, then tears everything down. It needs root.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

func main() {
	src := flag.String("manifests", "docs/examples/demo", "manifest directory to copy and serve (web.yaml holds the demo Service and its EndpointSlices)")
	service := flag.String("service", "web", "name of the demo Service in the manifests")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *src, *service); err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo failed:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func run(ctx context.Context, src, service string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo creates network namespaces: run it as root (sudo make demo)")
	}
	tmp, err := os.MkdirTemp("", "kproxy-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()

	say("== kproxy demo: Service traffic through a real kernel, in throwaway network namespaces ==\n")
	say("Building kproxy and the echo server...")
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	kproxyBin, err := netns.GoBuild(bctx, tmp, e2e.KProxyPackage)
	if err == nil {
		_, err = netns.BuildEcho(bctx, tmp)
	}
	cancel()
	if err != nil {
		return err
	}
	echoBin := filepath.Join(tmp, "kpt-echo")

	dir := filepath.Join(tmp, "manifests")
	svc, slices, err := copyManifests(src, dir, service)
	if err != nil {
		return err
	}
	vip4, nodePort, err := frontends(svc)
	if err != nil {
		return err
	}

	top := proxytest.Default()
	pods := []string{proxytest.Client1}
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			if ep.TargetRef != nil && !contains(pods, ep.TargetRef.Name) {
				pods = append(pods, ep.TargetRef.Name)
			}
		}
	}
	say("Creating namespaces: a node network with node1, node2 and an outside client; pods %s...", strings.Join(pods, ", "))
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	c, err := netns.Setup(sctx, netns.Options{Topology: top, EchoBinary: echoBin, Pods: pods})
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		say("\nTearing down: stopping kproxy and the echo servers, deleting %s-* namespaces...", c.ID)
		if cerr := c.Close(); cerr != nil {
			err = errors.Join(err, cerr)
			return
		}
		say("Done: nothing is left behind.")
	}()

	p := &e2e.Proxy{Cluster: c, Binary: kproxyBin, ManifestDir: dir, LogDir: tmp, Config: proxytest.DefaultConfig()}
	say("Starting kproxy inside node1:\n  kproxy %s", strings.Join(p.Argv(), " "))
	start := time.Now()
	if err := p.Start(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = e2e.WaitReady(wctx, c, proxytest.Client1, vip4)
	cancel()
	if err != nil {
		return fmt.Errorf("%w\nkproxy output:\n%s", err, p.Process().Output())
	}
	say("kproxy programmed the kernel in %v: %s", time.Since(start).Round(time.Millisecond), ruleSummary(ctx, c))

	node1, _ := top.Node(proxytest.Node1)
	nodeAddr := netip.AddrPortFrom(node1.IPv4, uint16(nodePort))

	say("\n1. ClusterIP %s from pod client-1 (%s), 8 new connections:", vip4, mustHost(top, proxytest.Client1).IPv4)
	show(ctx, c, top, proxytest.Client1, vip4, 8)
	say("\n2. NodePort %s from the outside client (%s), 8 new connections:", nodeAddr, top.OutsideHost.IPv4)
	show(ctx, c, top, proxytest.Outside, nodeAddr, 8)

	const n = 300
	say("\n3. Spread of %d new connections to the ClusterIP:", n)
	counts := spread(ctx, c, vip4, n)
	bars(counts, pods[1:], n)

	victim := pods[len(pods)-1]
	say("\n4. Removing %s from the EndpointSlices (editing web.yaml in kproxy's manifest directory)...", victim)
	for _, s := range slices {
		s.Endpoints = dropEndpoint(s.Endpoints, victim)
	}
	objs := []any{svc}
	for _, s := range slices {
		objs = append(objs, s)
	}
	if err := e2e.WriteObjects(dir, "web.yaml", objs...); err != nil {
		return err
	}
	changed := time.Now()
	moved := waitMoved(ctx, c, vip4, victim, 20, 10*time.Second)
	if moved.IsZero() {
		return fmt.Errorf("traffic still reaches %s 10s after the change", victim)
	}
	say("   Traffic moved %v after the edit (20 connections in a row avoided %s).", moved.Sub(changed).Round(10*time.Millisecond), victim)
	say("   Spread of %d new connections now:", n)
	bars(spread(ctx, c, vip4, n), pods[1:], n)
	return nil
}

// copyManifests copies every manifest of src into dir and returns the demo
// Service and its EndpointSlices (from web.yaml).
func copyManifests(src, dir, service string) (*v1.Service, []*discovery.EndpointSlice, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	files, err := filepath.Glob(filepath.Join(src, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, nil, fmt.Errorf("no manifests in %s (run the demo from the repository root)", src)
	}
	var svc *v1.Service
	var slices []*discovery.EndpointSlice
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		if err := e2e.WriteManifest(dir, filepath.Base(f), data); err != nil {
			return nil, nil, err
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var meta struct {
				Kind     string
				Metadata struct{ Name string }
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
			switch meta.Kind {
			case "Service":
				if meta.Metadata.Name == service {
					svc = &v1.Service{}
					if err := yaml.Unmarshal(doc, svc); err != nil {
						return nil, nil, fmt.Errorf("%s: %w", f, err)
					}
				}
			case "EndpointSlice":
				s := &discovery.EndpointSlice{}
				if err := yaml.Unmarshal(doc, s); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", f, err)
				}
				if s.Labels[discovery.LabelServiceName] == service {
					slices = append(slices, s)
				}
			}
		}
	}
	if svc == nil || len(slices) == 0 {
		return nil, nil, fmt.Errorf("%s: no Service %q with EndpointSlices", src, service)
	}
	return svc, slices, nil
}

func frontends(svc *v1.Service) (netip.AddrPort, int32, error) {
	var vip netip.Addr
	for _, s := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			vip = a
		}
	}
	if !vip.IsValid() || len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].NodePort == 0 {
		return netip.AddrPort{}, 0, fmt.Errorf("service %s: need an IPv4 ClusterIP and a NodePort", svc.Name)
	}
	return netip.AddrPortFrom(vip, uint16(svc.Spec.Ports[0].Port)), svc.Spec.Ports[0].NodePort, nil
}

func show(ctx context.Context, c *netns.Cluster, top *proxytest.Topology, from string, addr netip.AddrPort, n int) {
	for i := 1; i <= n; i++ {
		r := c.Probe(ctx, from, "tcp", addr, echo.ProbeOptions{})
		if r.Outcome != echo.Answer {
			say("   #%d  %v", i, r)
			continue
		}
		seen := r.Source.Addr()
		how := "the client's own address: not masqueraded"
		if top.IsNodeAddr(proxytest.Node1, seen) {
			how = "a node1 address: masqueraded"
		}
		say("   #%d  answered by %-7s it saw the client as %s (%s)", i, r.Reply.Name, seen, how)
	}
}

func spread(ctx context.Context, c *netns.Cluster, addr netip.AddrPort, n int) map[string]int {
	counts := map[string]int{}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		r := c.Probe(ctx, proxytest.Client1, "tcp", addr, echo.ProbeOptions{})
		if r.Outcome == echo.Answer {
			counts[r.Reply.Name]++
		} else {
			counts["("+string(r.Outcome)+")"]++
		}
	}
	return counts
}

func bars(counts map[string]int, pods []string, n int) {
	names := append([]string{}, pods...)
	for k := range counts {
		if !contains(names, k) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		share := float64(counts[name]) / float64(n)
		say("   %-8s %-40s %5.1f%% (%d)", name, strings.Repeat("█", int(share*40+0.5)), 100*share, counts[name])
	}
}

// waitMoved probes until run consecutive connections avoided victim and
// returns when the first of them was made (zero on timeout).
func waitMoved(ctx context.Context, c *netns.Cluster, addr netip.AddrPort, victim string, run int, limit time.Duration) time.Time {
	deadline := time.Now().Add(limit)
	var first time.Time
	streak := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		at := time.Now()
		r := c.Probe(ctx, proxytest.Client1, "tcp", addr, echo.ProbeOptions{})
		if r.Outcome != echo.Answer || r.Reply.Name == victim {
			streak = 0
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if streak == 0 {
			first = at
		}
		if streak++; streak >= run {
			return first
		}
	}
	return time.Time{}
}

func dropEndpoint(eps []discovery.Endpoint, pod string) []discovery.Endpoint {
	var out []discovery.Endpoint
	for _, ep := range eps {
		if ep.TargetRef == nil || ep.TargetRef.Name != pod {
			out = append(out, ep)
		}
	}
	return out
}

func ruleSummary(ctx context.Context, c *netns.Cluster) string {
	var parts []string
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := c.Exec(ctx, proxytest.Node1, cmd)
		if err != nil {
			continue
		}
		chains, rules := 0, 0
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, ":KPROXY-"):
				chains++
			case strings.HasPrefix(l, "-A ") && strings.Contains(l, "KPROXY-"):
				rules++
			}
		}
		parts = append(parts, fmt.Sprintf("%s shows %d KPROXY chains, %d rules", cmd, chains, rules))
	}
	return strings.Join(parts, "; ")
}

func mustHost(top *proxytest.Topology, name string) proxytest.Host {
	h, _ := top.Host(name)
	return h
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
