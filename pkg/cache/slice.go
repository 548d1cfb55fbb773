package cache

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
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
	// addrs holds the endpoints' addresses, in the order of eps: 4 bytes
	// each in an IPv4 slice, 16 in an IPv6 one (addr reads them).
	addrs []byte
	// trigger is the last-change-trigger-time annotation (zero when absent).
	trigger time.Time
}

type slicePort struct {
	name     string
	port     int32
	protocol v1.Protocol
}

// sliceEndpoint is one endpoint of a slice in 16 bytes, its address
// apart (sliceInfo.addrs): a cluster has millions of them, so what
// endpoints repeat (node, zone, hints) is one shared handle.
type sliceEndpoint struct {
	where unique.Handle[location]
	flags epFlags
}

// epFlags are an endpoint's normalized conditions.
type epFlags uint8

const (
	epReady epFlags = 1 << iota
	epServing
	epTerminating
)

func (e *sliceEndpoint) ready() bool       { return e.flags&epReady != 0 }
func (e *sliceEndpoint) serving() bool     { return e.flags&epServing != 0 }
func (e *sliceEndpoint) terminating() bool { return e.flags&epTerminating != 0 }

// addr is the address of the slice's i-th endpoint.
func (s *sliceInfo) addr(i int) netip.Addr {
	if s.fam == 0 {
		return netip.AddrFrom4([4]byte(s.addrs[4*i:]))
	}
	return netip.AddrFrom16([16]byte(s.addrs[16*i:]))
}

// location is where an endpoint runs and the topology hints it carries.
type location struct {
	topo unique.Handle[proxy.Topology]
	// zoneHints and nodeHints are the hints' names, sorted and joined by
	// commas ("" when none): zone and node names are DNS labels and
	// subdomains, which have no comma.
	zoneHints, nodeHints string
}

// addrLen is the length of an address of family fam.
func addrLen(fam int) int {
	if fam == 0 {
		return 4
	}
	return 16
}

// hasName reports whether the comma-joined list holds name.
func hasName(list, name string) bool {
	for list != "" {
		var n string
		n, list, _ = strings.Cut(list, ",")
		if n == name {
			return true
		}
	}
	return false
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
	info.addrs = make([]byte, 0, len(es.Endpoints)*addrLen(info.fam))
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
		var se sliceEndpoint
		if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
			se.flags |= epReady
		}
		if ep.Conditions.Serving == nil || *ep.Conditions.Serving {
			se.flags |= epServing
		}
		if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
			se.flags |= epTerminating
		}
		var node, zone string
		if ep.NodeName != nil {
			node = *ep.NodeName
		}
		if ep.Zone != nil {
			zone = *ep.Zone
		}
		loc := location{topo: proxy.At(node, zone)}
		if ep.Hints != nil && len(ep.Hints.ForZones)+len(ep.Hints.ForNodes) > 0 {
			zones := make([]string, 0, len(ep.Hints.ForZones))
			for _, z := range ep.Hints.ForZones {
				zones = append(zones, z.Name)
			}
			nodes := make([]string, 0, len(ep.Hints.ForNodes))
			for _, n := range ep.Hints.ForNodes {
				nodes = append(nodes, n.Name)
			}
			slices.Sort(zones)
			slices.Sort(nodes)
			loc.zoneHints, loc.nodeHints = strings.Join(zones, ","), strings.Join(nodes, ",")
		}
		se.where = unique.Make(loc)
		info.eps = append(info.eps, se)
		if a.Is4() {
			b := a.As4()
			info.addrs = append(info.addrs, b[:]...)
		} else {
			b := a.As16()
			info.addrs = append(info.addrs, b[:]...)
		}
	}
	return info, problems
}
