package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// KProxyPackage is the import path of the kproxy command.
const KProxyPackage = "github.com/kproxy/kproxy/cmd/kproxy"

// Proxy runs kproxy as a real process inside one host's namespace.
type Proxy struct {
	Cluster *netns.Cluster
	// Binary is the kproxy executable.
	Binary string
	// Host is where kproxy runs (the topology's proxy node by default).
	Host string
	// ManifestDir is passed as --manifests. Leave it empty to have kproxy
	// watch an API server instead (pass --kubeconfig in Extra).
	ManifestDir string
	// LogDir receives one log file per run ("kproxy-<n>.log"), if set.
	LogDir string
	// Config selects --cluster-cidr, --masquerade-all and --nodeport-addresses.
	Config proxytest.Config
	// Extra flags appended to every run.
	Extra []string
	// Mode is --proxy-mode ("" is iptables).
	Mode string
	// Wrapper, when set, is the command line that runs the binary (it is
	// followed by the binary and its arguments), e.g. setpriv to bound the
	// capabilities. It must exec the binary, so that the process the
	// harness started is kproxy.
	Wrapper []string
	// Launch, when set, replaces Wrapper and Binary: it gets the arguments
	// of a run (Argv) and returns the command line that starts it, e.g.
	// runc running kproxy from an image (the image test). The process it
	// starts must end when it gets SIGTERM, after kproxy has.
	Launch func(args []string) ([]string, error)

	proc *netns.Process
	runs int
}

// Argv returns the command line of a run, without the binary.
func (p *Proxy) Argv() []string {
	t := p.Cluster.Topology
	host := p.Host
	if host == "" {
		host = t.ProxyNode
	}
	var args []string
	if p.ManifestDir != "" {
		args = append(args, "--manifests", p.ManifestDir)
	}
	mode := p.Mode
	if mode == "" {
		mode = "iptables"
	}
	args = append(args,
		"--hostname-override", host,
		"--proxy-mode", mode,
		// Never touch the machine-wide conntrack table size from a test.
		"--conntrack-max-per-core", "0",
		"-v", "2",
	)
	if p.Config.ClusterCIDR {
		var cidrs []string
		for _, c := range t.ClusterCIDRs() {
			cidrs = append(cidrs, c.String())
		}
		args = append(args, "--cluster-cidr", strings.Join(cidrs, ","))
	}
	if p.Config.MasqueradeAll {
		args = append(args, "--masquerade-all")
	}
	switch {
	case p.Config.NodePortAddresses != "":
		args = append(args, "--nodeport-addresses", p.Config.NodePortAddresses)
	case mode == "nftables":
		// The nftables mode defaults to the primary node IPs (as
		// upstream's); the table's default is every local address.
		args = append(args, "--nodeport-addresses", "0.0.0.0/0,::/0")
	}
	return append(args, p.Extra...)
}

func (p *Proxy) host() string {
	if p.Host != "" {
		return p.Host
	}
	return p.Cluster.Topology.ProxyNode
}

// Start starts a new kproxy run. It fails if one is still running.
func (p *Proxy) Start() error {
	if p.proc != nil {
		select {
		case <-p.proc.Done():
		default:
			return errors.New("kproxy is already running")
		}
	}
	p.runs++
	log := ""
	if p.LogDir != "" {
		log = filepath.Join(p.LogDir, fmt.Sprintf("kproxy-%d.log", p.runs))
	}
	argv := append(append(append([]string{}, p.Wrapper...), p.Binary), p.Argv()...)
	if p.Launch != nil {
		var err error
		if argv, err = p.Launch(p.Argv()); err != nil {
			return fmt.Errorf("kproxy#%d: %w", p.runs, err)
		}
	}
	proc, err := p.Cluster.Start(p.host(), fmt.Sprintf("kproxy#%d", p.runs), log, argv...)
	if err != nil {
		return err
	}
	p.proc = proc
	return nil
}

// Process returns the current (or last) run, nil before the first Start.
func (p *Proxy) Process() *netns.Process { return p.proc }

// Stop ends the current run with SIGTERM (SIGKILL after grace).
func (p *Proxy) Stop(grace time.Duration) error {
	if p.proc == nil {
		return nil
	}
	return p.proc.Stop(grace)
}

// Kill ends the current run with SIGKILL to kproxy alone (as the OOM
// killer does): a child it started, an iptables-restore, survives it.
func (p *Proxy) Kill() error {
	if p.proc == nil {
		return nil
	}
	return p.proc.Kill()
}

// KillGroup ends the current run with SIGKILL to its process group (kproxy
// and its iptables-restore or conntrack children), as a container
// runtime's kill of the kproxy container does, and waits until none of
// them is left.
func (p *Proxy) KillGroup() error {
	if p.proc == nil {
		return nil
	}
	return p.proc.KillGroup()
}

// Running reports whether a run is in progress.
func (p *Proxy) Running() bool {
	if p.proc == nil {
		return false
	}
	select {
	case <-p.proc.Done():
		return false
	default:
		return true
	}
}

// Cleanup runs "kproxy --cleanup" in the proxy's namespace and returns its output.
func (p *Proxy) Cleanup(ctx context.Context) ([]byte, error) {
	return p.Cluster.Exec(ctx, p.host(), p.Binary, "--cleanup", "--hostname-override", p.host(), "-v", "2")
}

// WriteManifest writes data to dir/name atomically (temporary file, then
// rename), so the manifest source never reads half a file.
func WriteManifest(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write manifest %s: %w", name, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write manifest %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write manifest %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("write manifest %s: %w", name, err)
	}
	return nil
}

// WriteObjects renders objects (Services, EndpointSlices, Nodes) into dir/name.
func WriteObjects(dir, name string, objs ...any) error {
	data, err := proxytest.Manifest(objs...)
	if err != nil {
		return err
	}
	return WriteManifest(dir, name, data)
}

// SentinelIndex is the Service index of the readiness sentinel; the table
// uses small indexes, scenarios use 100 and up.
const SentinelIndex = 99

// Sentinel returns the readiness Service "kpt-ready" (ClusterIP, one local
// endpoint: pod-a2) and its slices. When it answers through its ClusterIP
// in both families, kproxy has programmed the kernel.
func Sentinel(t *proxytest.Topology) (*v1.Service, []*discovery.EndpointSlice, error) {
	svc := t.Service("kpt-ready", SentinelIndex)
	slices, err := t.Slices(svc, proxytest.Ready(proxytest.PodA2)...)
	return svc, slices, err
}

// ServiceAddrs returns a Service's ClusterIPs on ServicePort.
func ServiceAddrs(svc *v1.Service) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, netip.AddrPortFrom(a, proxytest.ServicePort))
		}
	}
	return out
}

// WaitReady polls TCP addrs from a host until each has answered once, or ctx ends.
func WaitReady(ctx context.Context, c *netns.Cluster, from string, addrs ...netip.AddrPort) error {
	for _, a := range addrs {
		var last echo.Result
		for {
			last = c.Probe(ctx, from, "tcp", a, echo.ProbeOptions{Timeout: 500 * time.Millisecond})
			if last.Outcome == echo.Answer {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s never answered from %s: last %v: %w", a, from, last, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// WithoutDumps drops the multi-line desired-state dumps kproxy logs at -v=2.
func WithoutDumps(out string) string {
	var keep []string
	skipping := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(l, `"Desired state"`):
			skipping = true
			continue
		case skipping && (strings.HasPrefix(l, "\t") || strings.HasPrefix(l, " >") || strings.TrimSpace(l) == ">"):
			continue
		}
		skipping = false
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// LastLines keeps the last n lines of s, saying how many it left out.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines omitted)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
