package proxy

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
)

// yamlState is the printed form of a Snapshot: the node-local desired state.
type yamlState struct {
	Node yamlNode          `yaml:"node"`
	IPv4 []yamlServicePort `yaml:"ipv4"`
	IPv6 []yamlServicePort `yaml:"ipv6"`
}

type yamlNode struct {
	Name      string   `yaml:"name"`
	Zone      string   `yaml:"zone,omitempty"`
	Addresses []string `yaml:"addresses,omitempty"`
	Known     bool     `yaml:"known"`
	Deleting  bool     `yaml:"deleting,omitempty"`
}

type yamlServicePort struct {
	Service                string   `yaml:"service"`
	Protocol               string   `yaml:"protocol"`
	Type                   string   `yaml:"type"`
	ClusterIP              string   `yaml:"clusterIP"`
	Port                   int32    `yaml:"port"`
	NodePort               int32    `yaml:"nodePort,omitempty"`
	ExternalIPs            []string `yaml:"externalIPs,omitempty"`
	LoadBalancerIPs        []string `yaml:"loadBalancerIPs,omitempty"`
	SourceRanges           []string `yaml:"loadBalancerSourceRanges,omitempty"`
	AffinityTimeoutSeconds int32    `yaml:"sessionAffinityTimeoutSeconds,omitempty"`
	ExternalTrafficPolicy  string   `yaml:"externalTrafficPolicy,omitempty"`
	InternalTrafficPolicy  string   `yaml:"internalTrafficPolicy"`
	HealthCheckNodePort    int32    `yaml:"healthCheckNodePort,omitempty"`
	TrafficDistribution    string   `yaml:"trafficDistribution,omitempty"`
	// Algorithm is the effective load-balancing algorithm (session affinity
	// wins over the annotation).
	Algorithm       string `yaml:"algorithm"`
	HasAnyEndpoints bool   `yaml:"hasAnyEndpoints"`
	// Endpoint lists are printed as "ip:port node=… zone=… ready|serving|terminating local".
	ClusterEndpoints []string `yaml:"clusterEndpoints,omitempty"`
	LocalEndpoints   []string `yaml:"localEndpoints,omitempty"`
}

// WriteYAML prints the snapshot as YAML, deterministically ordered: the node,
// then every service port of each family with its frontends and its cluster
// and local endpoints.
func WriteYAML(w io.Writer, snap *Snapshot) error {
	st := yamlState{
		Node: yamlNode{Name: snap.Node.Name, Zone: snap.Node.Zone, Addresses: addrStrings(snap.Node.Addresses),
			Known: snap.Node.Known, Deleting: snap.Node.Deleting},
		IPv4: yamlPorts(snap.IPv4),
		IPv6: yamlPorts(snap.IPv6),
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(st); err != nil {
		return fmt.Errorf("rendering desired state: %w", err)
	}
	return enc.Close()
}

// PortYAML prints one service port the way WriteYAML does, for logs.
func PortYAML(p *ServicePort) string {
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(yamlPort(p)); err != nil {
		return p.String()
	}
	return b.String()
}

func yamlPorts(v *FamilyView) []yamlServicePort {
	out := []yamlServicePort{}
	if v == nil {
		return out
	}
	for _, p := range v.Sorted() {
		out = append(out, yamlPort(p))
	}
	return out
}

func yamlPort(p *ServicePort) yamlServicePort {
	y := yamlServicePort{
		Service:                p.Name.String(),
		Protocol:               string(p.Protocol),
		Type:                   string(p.Type),
		ClusterIP:              p.ClusterIP.String(),
		Port:                   p.Port,
		NodePort:               p.NodePort,
		ExternalIPs:            addrStrings(p.ExternalIPs),
		LoadBalancerIPs:        addrStrings(p.LoadBalancerIPs),
		AffinityTimeoutSeconds: p.AffinityTimeoutSeconds,
		InternalTrafficPolicy:  string(v1.ServiceInternalTrafficPolicyCluster),
		HealthCheckNodePort:    p.HealthCheckNodePort,
		TrafficDistribution:    p.TrafficDistribution,
		Algorithm:              string(p.EffectiveAlgorithm()),
		HasAnyEndpoints:        p.HasAnyEndpoints,
		ClusterEndpoints:       endpointStrings(p.ClusterEndpoints),
		LocalEndpoints:         endpointStrings(p.LocalEndpoints),
	}
	for _, r := range p.LoadBalancerSourceRanges {
		y.SourceRanges = append(y.SourceRanges, r.String())
	}
	if p.ExternallyAccessible() {
		y.ExternalTrafficPolicy = string(v1.ServiceExternalTrafficPolicyCluster)
		if p.ExternalPolicyLocal {
			y.ExternalTrafficPolicy = string(v1.ServiceExternalTrafficPolicyLocal)
		}
	}
	if p.InternalPolicyLocal {
		y.InternalTrafficPolicy = string(v1.ServiceInternalTrafficPolicyLocal)
	}
	return y
}

func addrStrings(as []netip.Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

func endpointStrings(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, EndpointSummary(e))
	}
	return out
}

// EndpointSummary renders an endpoint with its placement and conditions, e.g.
// "10.0.1.5:8080 node=node1 zone=a ready local".
func EndpointSummary(e Endpoint) string {
	var b strings.Builder
	b.WriteString(e.String())
	t := e.Topology()
	if t.NodeName != "" {
		b.WriteString(" node=" + t.NodeName)
	}
	if t.Zone != "" {
		b.WriteString(" zone=" + t.Zone)
	}
	switch {
	case e.Ready:
		b.WriteString(" ready")
	case e.Serving && e.Terminating:
		b.WriteString(" serving terminating")
	case e.Terminating:
		b.WriteString(" terminating")
	default:
		b.WriteString(" not-ready")
	}
	if e.Local {
		b.WriteString(" local")
	}
	return b.String()
}
