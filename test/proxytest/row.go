package proxytest

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Platform names a proxy implementation that runs the table.
type Platform string

// Platforms.
const (
	Linux   Platform = "linux"
	Windows Platform = "windows"
)

// Config is the proxy configuration a row needs. Rows with different Configs
// need separate proxy runs; Table.Configs lists the distinct ones.
type Config struct {
	// ClusterCIDR tells the proxy the topology's cluster CIDRs
	// (--cluster-cidr): off-cluster sources to a ClusterIP are masqueraded and
	// pod traffic to external addresses of an externalTrafficPolicy Local
	// Service short-circuits to the cluster endpoints.
	ClusterCIDR bool
	// MasqueradeAll masquerades all traffic to ClusterIPs (--masquerade-all).
	MasqueradeAll bool
	// NodePortAddresses is the --nodeport-addresses value ("" for the
	// default, every local address; "primary" for the node's primary IPs).
	NodePortAddresses string
}

// String renders the config as a short name (used in row and test names).
func (c Config) String() string {
	var parts []string
	if c.ClusterCIDR {
		parts = append(parts, "cluster-cidr")
	} else {
		parts = append(parts, "no-cluster-cidr")
	}
	if c.MasqueradeAll {
		parts = append(parts, "masquerade-all")
	}
	if c.NodePortAddresses != "" {
		parts = append(parts, "nodeport-addresses="+c.NodePortAddresses)
	}
	return strings.Join(parts, ",")
}

// Target is the kind of Service address a row sends to.
type Target string

// Targets.
const (
	// TargetClusterIP is the Service's ClusterIP of the row's family, on ServicePort.
	TargetClusterIP Target = "clusterip"
	// TargetNodePort is the proxy node's node IP of the row's family, on the NodePort.
	TargetNodePort Target = "nodeport"
	// TargetLocalhostNodePort is 127.0.0.1 on the NodePort (IPv4 only), from the proxy node.
	TargetLocalhostNodePort Target = "localhost-nodeport"
	// TargetSecondaryNodePort is the proxy node's other local address (its
	// pod gateway address, not its primary node IP) on the NodePort.
	TargetSecondaryNodePort Target = "secondary-nodeport"
	// TargetExternalIP is the Service's externalIP of the row's family, on ServicePort.
	TargetExternalIP Target = "externalip"
	// TargetLoadBalancerIP is the Service's LoadBalancer ingress IP of the row's family, on ServicePort.
	TargetLoadBalancerIP Target = "lbip"
)

// Outcome is what a client experiences.
type Outcome string

// Outcomes.
const (
	// Answer: an echo server answered.
	Answer Outcome = "answer"
	// Rejected: the connection was refused at once (TCP RST or ICMP unreachable).
	Rejected Outcome = "rejected"
	// Dropped: nothing came back before the client's timeout.
	Dropped Outcome = "dropped"
)

// Source says which source address the answering backend must have seen.
type Source string

// Sources.
const (
	// SourceAny does not check the source.
	SourceAny Source = ""
	// SourceClient: the backend saw the client's own address (no
	// masquerade). For a client on the proxy node, any of that node's
	// addresses counts as its own.
	SourceClient Source = "client"
	// SourceNode: the backend saw one of the proxy node's addresses
	// (masqueraded).
	SourceNode Source = "node"
)

// Expect is what a row must observe.
type Expect struct {
	Outcome Outcome
	// Backends lists the pods that may answer (Answer only). Every attempt
	// must be answered by one of them.
	Backends []string
	// Source is checked on every answer.
	Source Source
	// Sticky requires every attempt to be answered by the same backend
	// (session affinity).
	Sticky bool
}

// Case is one Service scenario: the objects of one semantic, shared by the
// rows that probe it. Objects are values to read: do not modify them.
type Case struct {
	// Name is the case's unique name (also its Service's name).
	Name string
	// Semantic says, in words, what the case shows.
	Semantic string
	Config   Config
	Services []*v1.Service
	Slices   []*discovery.EndpointSlice
	// Contenders name the case's Services that claim a frontend another
	// of its Services owns: a proxy reports them (FrontendConflict) and
	// programs that frontend for the owner only.
	Contenders []string
}

// Contender reports whether the Service namespace/name is a contender of
// one of tb's cases (see Case.Contenders).
func (tb *Table) Contender(namespace, name string) bool {
	if namespace != Namespace {
		return false
	}
	for _, c := range tb.Cases {
		for _, n := range c.Contenders {
			if n == name {
				return true
			}
		}
	}
	return false
}

// Service returns the case's Service by name.
func (c *Case) Service(name string) (*v1.Service, bool) {
	for _, s := range c.Services {
		if s.Name == name {
			return s, true
		}
	}
	return nil, false
}

// Row is one probe: a client sends to a Service address and observes the outcome.
type Row struct {
	// Name is unique in the table: "<case>/<from>-><target>/<protocol>/<family>".
	Name string
	Case *Case
	// From names the client host (a pod, a node or the outside client).
	From     string
	Protocol v1.Protocol
	Family   v1.IPFamily
	Target   Target
	// Service names the Service (in Namespace) the target belongs to.
	Service string
	// Attempts is the number of new connections to make (each from a new
	// source port); at least 1.
	Attempts int
	Expect   Expect
	// Unsupported maps a platform to the reason it cannot honour this row;
	// runners for that platform skip the row and report the reason.
	Unsupported map[Platform]string
}

// Config returns the proxy configuration the row needs.
func (r Row) Config() Config { return r.Case.Config }

// Skip returns the reason platform p cannot run this row ("" when it can).
func (r Row) Skip(p Platform) string { return r.Unsupported[p] }

// Address returns the address:port the row's client sends to.
func (r Row) Address(t *Topology) (netip.AddrPort, error) {
	svc, ok := r.Case.Service(r.Service)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("row %s: no service %q in case %s", r.Name, r.Service, r.Case.Name)
	}
	var port *v1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Protocol == r.Protocol {
			port = &svc.Spec.Ports[i]
			break
		}
	}
	if port == nil {
		return netip.AddrPort{}, fmt.Errorf("row %s: service %s has no %s port", r.Name, svc.Name, r.Protocol)
	}
	pick := func(field string, addrs []string) (netip.Addr, error) {
		for _, s := range addrs {
			a, err := netip.ParseAddr(s)
			if err == nil && familyOf(a) == r.Family {
				return a, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("row %s: service %s has no %s %s", r.Name, svc.Name, r.Family, field)
	}
	switch r.Target {
	case TargetClusterIP:
		a, err := pick("clusterIP", svc.Spec.ClusterIPs)
		return netip.AddrPortFrom(a, uint16(port.Port)), err
	case TargetExternalIP:
		a, err := pick("externalIP", svc.Spec.ExternalIPs)
		return netip.AddrPortFrom(a, uint16(port.Port)), err
	case TargetLoadBalancerIP:
		var ips []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		a, err := pick("LoadBalancer IP", ips)
		return netip.AddrPortFrom(a, uint16(port.Port)), err
	case TargetNodePort, TargetLocalhostNodePort, TargetSecondaryNodePort:
		if port.NodePort == 0 {
			return netip.AddrPort{}, fmt.Errorf("row %s: service %s port %s has no NodePort", r.Name, svc.Name, port.Name)
		}
		if r.Target == TargetLocalhostNodePort {
			if r.Family != v1.IPv4Protocol {
				return netip.AddrPort{}, fmt.Errorf("row %s: localhost NodePorts exist for IPv4 only", r.Name)
			}
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port.NodePort)), nil
		}
		node, ok := t.Node(t.ProxyNode)
		if !ok {
			return netip.AddrPort{}, fmt.Errorf("row %s: topology has no proxy node %q", r.Name, t.ProxyNode)
		}
		if r.Target == TargetSecondaryNodePort {
			return netip.AddrPortFrom(node.Gateway(r.Family), uint16(port.NodePort)), nil
		}
		return netip.AddrPortFrom(node.Addr(r.Family), uint16(port.NodePort)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("row %s: unknown target %q", r.Name, r.Target)
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// Observation is what one attempt of a row saw.
type Observation struct {
	Outcome Outcome
	// Backend is the name the answering echo server reported (Answer only).
	Backend string
	// Source is the client address the backend saw (Answer only).
	Source netip.Addr
	// Detail is free text for failure messages (an error, a raw reply).
	Detail string
}

// String renders an observation for failure messages.
func (o Observation) String() string {
	s := string(o.Outcome)
	if o.Outcome == Answer {
		s += fmt.Sprintf(" from %s (saw source %s)", o.Backend, o.Source)
	}
	if o.Detail != "" {
		s += ": " + o.Detail
	}
	return s
}

// Check compares the observations of a row's attempts with its expectation
// and returns every mismatch joined (nil when the row holds).
func (r Row) Check(t *Topology, obs []Observation) error {
	if len(obs) == 0 {
		return fmt.Errorf("row %s: no observations", r.Name)
	}
	from, ok := t.Host(r.From)
	if !ok {
		return fmt.Errorf("row %s: unknown client %q", r.Name, r.From)
	}
	var errs []error
	seen := map[string]int{}
	for i, o := range obs {
		if o.Outcome != r.Expect.Outcome {
			errs = append(errs, fmt.Errorf("attempt %d: want %s, got %s", i+1, r.Expect.Outcome, o))
			continue
		}
		if o.Outcome != Answer {
			continue
		}
		seen[o.Backend]++
		if !contains(r.Expect.Backends, o.Backend) {
			errs = append(errs, fmt.Errorf("attempt %d: answered by %s, want one of %v", i+1, o.Backend, r.Expect.Backends))
		}
		if err := r.checkSource(t, from, o.Source); err != nil {
			errs = append(errs, fmt.Errorf("attempt %d (backend %s): %w", i+1, o.Backend, err))
		}
	}
	if r.Expect.Sticky && len(seen) > 1 {
		errs = append(errs, fmt.Errorf("session affinity: answered by %d backends %v, want one", len(seen), sortedKeys(seen)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("row %s: %w", r.Name, errors.Join(errs...))
	}
	return nil
}

func (r Row) checkSource(t *Topology, from Host, src netip.Addr) error {
	src = src.Unmap()
	switch r.Expect.Source {
	case SourceClient:
		if from.Role == RoleNode {
			if !t.IsNodeAddr(from.Name, src) {
				return fmt.Errorf("source %s is not an address of client node %s", src, from.Name)
			}
			return nil
		}
		if src != from.Addr(r.Family) {
			return fmt.Errorf("source %s (%s), want the client's own %s (not masqueraded)", src, orNone(t.HostByAddr(src)), from.Addr(r.Family))
		}
	case SourceNode:
		if !t.IsNodeAddr(t.ProxyNode, src) {
			return fmt.Errorf("source %s (%s), want an address of %s (masqueraded)", src, orNone(t.HostByAddr(src)), t.ProxyNode)
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "unknown host"
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
