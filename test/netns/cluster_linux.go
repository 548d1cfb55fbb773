package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// LAN is the host name of the namespace holding the node network's bridge.
const LAN = "lan"

// Options configure Setup.
type Options struct {
	// Topology to build (default proxytest.Default()).
	Topology *proxytest.Topology
	// EchoBinary is the path of kpt-echo (see BuildEcho). When set, every pod
	// runs an echo server on proxytest.EchoPort.
	EchoBinary string
	// Pods limits the pods created (by name); empty means every pod of the topology.
	Pods []string
	// Logf receives progress messages (optional).
	Logf func(format string, args ...any)
}

// Cluster is a topology of network namespaces: the node network (a bridge in
// the "lan" namespace), one namespace per node, pod and the outside client.
// Nothing is created in the machine's own namespace.
type Cluster struct {
	Topology *proxytest.Topology
	// ID prefixes every namespace name: "kpt-<pid>-<random>".
	ID string

	mu      sync.Mutex
	hosts   map[string]*NS // by host name, plus LAN
	order   []*NS          // creation order, for teardown
	procs   []*Process
	spawner *spawner
	logf    func(string, ...any)
	closed  bool
}

// Setup sweeps leftovers of dead runs, then builds the topology:
//
//   - lan: bridge br0 (192.168.50.254, fd00:50::254: a router that forwards
//     nothing and answers nothing: blackhole default routes), one port per
//     node and the outside client;
//   - each node: eth0 on the node network, default route to the lan router,
//     routes to the other node's pod CIDRs via that node, forwarding on; one
//     veth per pod ("v-<pod>") carrying the node's pod gateway address and a
//     host route to the pod;
//   - each pod: eth0 with its /32 and /128, default routes via the gateway;
//   - outside: eth0 on the node network, routes to the Service, externalIP
//     and LoadBalancer ranges via node1 (node2 routes the last two via node1 too).
//
// Every namespace gets rp_filter off and IPv6 DAD off; nodes get forwarding
// on and no ICMP error rate limit (bursts of rejected probes must each be
// answered). On error everything
// created so far is removed.
func Setup(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Topology == nil {
		opts.Topology = proxytest.Default()
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if removed, err := Sweep(ctx); err != nil {
		logf("netns: sweeping leftovers: %v", err)
	} else if len(removed) > 0 {
		logf("netns: removed %d leftover namespaces of dead runs: %v", len(removed), removed)
	}
	var rnd [2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("netns setup: %w", err)
	}
	c := &Cluster{
		Topology: opts.Topology,
		ID:       fmt.Sprintf("%s%d-%s", Prefix, os.Getpid(), hex.EncodeToString(rnd[:])),
		hosts:    map[string]*NS{},
		spawner:  newSpawner(),
		logf:     logf,
	}
	if err := c.build(ctx, opts); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) add(ctx context.Context, host string) (*NS, error) {
	n, err := create(ctx, c.ID+"-"+host)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.hosts[host] = n
	c.order = append(c.order, n)
	c.mu.Unlock()
	// Before any interface exists, so "default" applies to all of them.
	return n, n.Sysctl(map[string]string{
		"net.ipv4.conf.all.rp_filter":      "0",
		"net.ipv4.conf.default.rp_filter":  "0",
		"net.ipv6.conf.all.accept_dad":     "0",
		"net.ipv6.conf.default.accept_dad": "0",
		"net.ipv6.conf.all.accept_ra":      "0",
		"net.ipv6.conf.default.accept_ra":  "0",
	})
}

func (c *Cluster) build(ctx context.Context, opts Options) error {
	t := c.Topology
	lan, err := c.add(ctx, LAN)
	if err != nil {
		return err
	}
	router4, router6 := lastHost(t.NodeNetwork4), lastHost(t.NodeNetwork6)
	if err := lan.IP(ctx,
		"link set lo up",
		"link add br0 type bridge mcast_snooping 0",
		"link set br0 up",
		fmt.Sprintf("addr add %s/%d dev br0", router4, t.NodeNetwork4.Bits()),
		fmt.Sprintf("addr add %s/%d dev br0 nodad", router6, t.NodeNetwork6.Bits()),
		// The router forwards nothing, silently. Without a route, IPv6
		// answers a packet it cannot route with "no route" (ICMPv6, rate
		// limited per peer), so a probe to an unhandled address was
		// either dropped or refused depending on which probe came first.
		"route add blackhole 0.0.0.0/0",
		"route add blackhole ::/0",
	); err != nil {
		return err
	}
	// Nodes and the outside client on the node network.
	netHosts := []proxytest.Host{}
	for _, n := range t.Nodes {
		netHosts = append(netHosts, n.Host)
	}
	netHosts = append(netHosts, t.OutsideHost)
	for _, h := range netHosts {
		ns, err := c.add(ctx, h.Name)
		if err != nil {
			return err
		}
		port := "p-" + h.Name
		if err := lan.IP(ctx,
			fmt.Sprintf("link add %s type veth peer name eth0 netns %s", port, ns.Name),
			fmt.Sprintf("link set %s master br0 up", port),
		); err != nil {
			return err
		}
		lines := []string{
			"link set lo up",
			"link set eth0 up",
			fmt.Sprintf("addr add %s/%d dev eth0", h.IPv4, t.NodeNetwork4.Bits()),
			fmt.Sprintf("addr add %s/%d dev eth0 nodad", h.IPv6, t.NodeNetwork6.Bits()),
			fmt.Sprintf("route add default via %s dev eth0", router4),
			fmt.Sprintf("route add default via %s dev eth0", router6),
		}
		proxy, _ := t.Node(t.ProxyNode)
		switch h.Role {
		case proxytest.RoleNode:
			for _, other := range t.Nodes {
				if other.Name == h.Name {
					continue
				}
				lines = append(lines,
					fmt.Sprintf("route add %s via %s", other.PodCIDR4, other.IPv4),
					fmt.Sprintf("route add %s via %s", other.PodCIDR6, other.IPv6))
			}
			if h.Name != t.ProxyNode {
				lines = append(lines, viaRoutes(proxy, t.ExternalCIDR4, t.ExternalCIDR6, t.LoadBalancerCIDR4, t.LoadBalancerCIDR6)...)
			}
			if err := ns.Sysctl(map[string]string{
				"net.ipv4.ip_forward":              "1",
				"net.ipv6.conf.all.forwarding":     "1",
				"net.ipv6.conf.default.forwarding": "1",
				// Tests send bursts of probes that a node rejects; the
				// kernel's per-peer ICMP error rate limit, and its
				// per-namespace one (1,000 a second in bursts of 50, for
				// ICMP and ICMPv6 alike), would turn some of those
				// rejections into silence.
				"net.ipv4.icmp_ratelimit":    "0",
				"net.ipv6.icmp.ratelimit":    "0",
				"net.ipv4.icmp_msgs_per_sec": "1000000",
				"net.ipv4.icmp_msgs_burst":   "1000000",
			}); err != nil {
				return err
			}
		case proxytest.RoleOutside:
			lines = append(lines, viaRoutes(proxy, t.ServiceCIDR4, t.ServiceCIDR6,
				t.ExternalCIDR4, t.ExternalCIDR6, t.LoadBalancerCIDR4, t.LoadBalancerCIDR6)...)
		}
		if err := ns.IP(ctx, lines...); err != nil {
			return err
		}
	}
	// Pods, each on a veth from its node.
	want := map[string]bool{}
	for _, p := range opts.Pods {
		want[p] = true
	}
	for _, pod := range t.Pods {
		if len(want) > 0 && !want[pod.Name] {
			continue
		}
		if err := c.addPod(ctx, pod); err != nil {
			return err
		}
	}
	if opts.EchoBinary != "" {
		if err := c.startEchoServers(ctx, opts.EchoBinary); err != nil {
			return err
		}
	}
	c.logf("netns: topology %s ready (%d namespaces)", c.ID, len(c.order))
	return nil
}

func viaRoutes(via proxytest.Node, prefixes ...netip.Prefix) []string {
	var out []string
	for _, p := range prefixes {
		out = append(out, fmt.Sprintf("route add %s via %s", p, via.Addr(familyOf(p.Addr()))))
	}
	return out
}

func (c *Cluster) addPod(ctx context.Context, pod proxytest.Host) error {
	t := c.Topology
	node, ok := t.Node(pod.Node)
	if !ok {
		return fmt.Errorf("netns setup: pod %s on unknown node %q", pod.Name, pod.Node)
	}
	nodeNS := c.NS(node.Name)
	ns, err := c.add(ctx, pod.Name)
	if err != nil {
		return err
	}
	veth := "v-" + pod.Name
	if len(veth) > 15 {
		return fmt.Errorf("netns setup: pod name %q too long for an interface name", pod.Name)
	}
	if err := nodeNS.IP(ctx,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", veth, ns.Name),
		fmt.Sprintf("addr add %s/32 dev %s", node.Gateway4, veth),
		fmt.Sprintf("addr add %s/128 dev %s nodad", node.Gateway6, veth),
		fmt.Sprintf("link set %s up", veth),
		fmt.Sprintf("route add %s/32 dev %s", pod.IPv4, veth),
		fmt.Sprintf("route add %s/128 dev %s", pod.IPv6, veth),
	); err != nil {
		return err
	}
	return ns.IP(ctx,
		"link set lo up",
		"link set eth0 up",
		fmt.Sprintf("addr add %s/32 dev eth0", pod.IPv4),
		fmt.Sprintf("addr add %s/128 dev eth0 nodad", pod.IPv6),
		fmt.Sprintf("route add %s dev eth0 scope link", node.Gateway4),
		fmt.Sprintf("route add default via %s dev eth0", node.Gateway4),
		fmt.Sprintf("route add %s dev eth0", node.Gateway6),
		fmt.Sprintf("route add default via %s dev eth0", node.Gateway6),
	)
}

func (c *Cluster) startEchoServers(ctx context.Context, bin string) error {
	var procs []*Process
	for _, pod := range c.Topology.Pods {
		if c.NS(pod.Name) == nil {
			continue
		}
		p, err := c.Start(pod.Name, "echo-"+pod.Name, "", bin, "serve", "-name", pod.Name, "-port", strconv.Itoa(proxytest.EchoPort))
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, p := range procs {
		if err := p.WaitOutput(ctx, "ready"); err != nil {
			return fmt.Errorf("echo server: %w", err)
		}
	}
	return nil
}

// lastHost returns the last usable address of a prefix with a short host part
// (.254 for a /24, ::254 for a /64).
func lastHost(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	if len(b) == 4 {
		b[3] = 254
	} else {
		b[14], b[15] = 0x02, 0x54
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// NS returns the namespace of a host (a node, pod, "outside" or LAN), nil if
// there is none.
func (c *Cluster) NS(host string) *NS {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hosts[host]
}

// MustNS is NS that reports an unknown host as an error.
func (c *Cluster) MustNS(host string) (*NS, error) {
	if n := c.NS(host); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("netns: no namespace for host %q in %s", host, c.ID)
}

// Hosts returns the names of the hosts that have a namespace, sorted.
func (c *Cluster) Hosts() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for h := range c.hosts {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// Start runs argv as a long-lived process inside a host's namespace. Its
// output is kept (Process.Output) and, when logPath is set, written there.
// Close stops every process still running.
func (c *Cluster) Start(host, name, logPath string, argv ...string) (*Process, error) {
	ns, err := c.MustNS(host)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("netns: cluster closed")
	}
	c.mu.Unlock()
	p, err := startProcess(c.spawner, ns, name, logPath, argv...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// StartShared runs argv as a long-lived process in a host's network
// namespace only ("nsenter --net"), unlike Start, whose "ip netns exec" also
// gives the process a mount namespace of its own with /sys remounted: a
// program that must see the machine's cgroup tree, or share mounts with
// another (a kubelet and its container runtime), runs here. With mountNS set
// (the bind mount of a mount namespace) it enters that one too. Close stops
// it like the others.
func (c *Cluster) StartShared(host, name, logPath, mountNS string, argv ...string) (*Process, error) {
	ns, err := c.MustNS(host)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errors.New("netns: cluster closed")
	}
	c.mu.Unlock()
	prefix := []string{"nsenter", "--net=" + ns.Path}
	if mountNS != "" {
		prefix = append(prefix, "--mount="+mountNS)
	}
	p, err := startPrefixed(c.spawner, ns, name, logPath, append(prefix, "--"), argv...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// Exec runs a short command inside a host's namespace and returns its output.
func (c *Cluster) Exec(ctx context.Context, host string, argv ...string) ([]byte, error) {
	ns, err := c.MustNS(host)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, errors.New("netns: Exec without a command")
	}
	return ns.Exec(ctx, argv[0], argv[1:]...)
}

// Probe makes one echo request from a host's namespace (see echo.Probe).
func (c *Cluster) Probe(ctx context.Context, from, proto string, addr netip.AddrPort, opts echo.ProbeOptions) echo.Result {
	ns, err := c.MustNS(from)
	if err != nil {
		return echo.Result{Outcome: echo.Failed, Err: err}
	}
	var r echo.Result
	if err := ns.Do(func() error {
		r = echo.Probe(ctx, proto, addr, opts)
		return nil
	}); err != nil {
		return echo.Result{Outcome: echo.Failed, Err: err}
	}
	return r
}

// Close stops every process (SIGTERM, then SIGKILL after 3 s) and deletes
// every namespace of the cluster. It is safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	procs, order := c.procs, c.order
	c.mu.Unlock()

	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Stop(3 * time.Second); err != nil {
				emu.Lock()
				errs = append(errs, fmt.Errorf("stop %s: %w", p.Name, err))
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	c.spawner.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := len(order) - 1; i >= 0; i-- {
		if err := order[i].remove(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
