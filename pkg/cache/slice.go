package cache

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// annotationTriggerTime is set by the EndpointSlice controller to the time of
// the change (Pod, Service) that caused the slice update.
const annotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"

// sliceInfo is the part of an EndpointSlice the proxy needs.
type sliceInfo struct {
	name    string
	service types.NamespacedName
	fam     int // family index
	ports   []slicePort
	eps     []sliceEndpoint
	// trigger is the last-change-trigger-time annotation (zero when absent).
	trigger time.Time
}

type slicePort struct {
	name     string
	port     int32
	protocol v1.Protocol
}

type sliceEndpoint struct {
	ip                          netip.Addr
	ready, serving, terminating bool
	nodeName, zone              string
	hints                       *hints // nil when the endpoint has none
}

// hints are an endpoint's topology hints, sorted.
type hints struct {
	zones, nodes []string
}

// parseSlice reads an EndpointSlice. It returns nil for slices the proxy
// ignores (FQDN address type, no owning Service label), with the problems
// found. A junk endpoint or port is dropped; the rest of the slice is kept.
func parseSlice(es *discovery.EndpointSlice) (*sliceInfo, []Problem) {
	name := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
	var problems []Problem
	bad := func(field, format string, args ...any) {
		problems = append(problems, Problem{Kind: "EndpointSlice", Object: name, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if p := nameProblem("EndpointSlice", name,
		nameCheck{"metadata.namespace", es.Namespace, dnsLabel},
		nameCheck{"metadata.name", es.Name, dnsSubdomain}); p != nil {
		return nil, []Problem{*p}
	}
	svcName := es.Labels[discovery.LabelServiceName]
	if svcName == "" {
		bad("metadata.labels["+discovery.LabelServiceName+"]", "missing: the slice belongs to no Service")
		return nil, problems
	}
	if p := nameProblem("EndpointSlice", name,
		nameCheck{"metadata.labels[" + discovery.LabelServiceName + "]", svcName, dnsLabel}); p != nil {
		return nil, []Problem{*p}
	}
	info := &sliceInfo{name: es.Name, service: types.NamespacedName{Namespace: es.Namespace, Name: svcName}}
	switch es.AddressType {
	case discovery.AddressTypeIPv4:
		info.fam = 0
	case discovery.AddressTypeIPv6:
		info.fam = 1
	case discovery.AddressTypeFQDN:
		return nil, nil // not proxied, as upstream
	default:
		bad("addressType", "unknown address type %q", es.AddressType)
		return nil, problems
	}
	if s := es.Annotations[annotationTriggerTime]; s != "" {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			info.trigger = t
		} else {
			bad("metadata.annotations["+annotationTriggerTime+"]", "not an RFC 3339 time: %q", s)
		}
	}
	for i, p := range es.Ports {
		f := func(sub string) string { return fmt.Sprintf("ports[%d].%s", i, sub) }
		if p.Port == nil {
			continue // "all ports": not meaningful for Services
		}
		sp := slicePort{port: *p.Port, protocol: v1.ProtocolTCP}
		if p.Name != nil {
			sp.name = *p.Name
		}
		if sp.name != "" {
			if msgs := dnsLabel(sp.name); len(msgs) > 0 {
				bad(f("name"), "invalid port name %q: %s", sp.name, strings.Join(msgs, "; "))
				continue
			}
		}
		if p.Protocol != nil {
			sp.protocol = *p.Protocol
		}
		if !validPort(sp.port) {
			bad(f("port"), "port %d out of range 1-65535", sp.port)
			continue
		}
		if !validProtocol(sp.protocol) {
			bad(f("protocol"), "unsupported protocol %q", sp.protocol)
			continue
		}
		info.ports = append(info.ports, sp)
	}
	info.eps = make([]sliceEndpoint, 0, len(es.Endpoints))
	for i, ep := range es.Endpoints {
		f := func(sub string) string { return fmt.Sprintf("endpoints[%d].%s", i, sub) }
		if len(ep.Addresses) == 0 {
			bad(f("addresses"), "no address")
			continue
		}
		// Like upstream, only the first address of an endpoint is used.
		a, err := parseIP(ep.Addresses[0])
		if err == nil && familyIndex(a) != info.fam {
			err = fmt.Errorf("address %s is not of the slice's address type %s", a, es.AddressType)
		}
		if err != nil {
			bad(f("addresses[0]"), "%v", err)
			continue
		}
		se := sliceEndpoint{
			ip:          a,
			ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
			serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
			terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
		}
		if ep.NodeName != nil {
			se.nodeName = *ep.NodeName
		}
		if ep.Zone != nil {
			se.zone = *ep.Zone
		}
		if ep.Hints != nil && len(ep.Hints.ForZones)+len(ep.Hints.ForNodes) > 0 {
			h := &hints{}
			for _, z := range ep.Hints.ForZones {
				h.zones = append(h.zones, z.Name)
			}
			for _, n := range ep.Hints.ForNodes {
				h.nodes = append(h.nodes, n.Name)
			}
			slices.Sort(h.zones)
			slices.Sort(h.nodes)
			se.hints = h
		}
		info.eps = append(info.eps, se)
	}
	return info, problems
}
