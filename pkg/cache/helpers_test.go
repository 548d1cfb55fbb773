package cache

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kproxy/kproxy/pkg/proxy"
)

const thisNode = "node1"

func ptr[T any](v T) *T { return &v }

// svc builds a ClusterIP Service ns/name with the given cluster IPs and
// ports written "name:port/proto" (name and proto optional), then applies mods.
func svc(name string, clusterIPs []string, ports []string, mods ...func(*v1.Service)) *v1.Service {
	ns, n, _ := strings.Cut(name, "/")
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIPs: clusterIPs},
	}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, p := range ports {
		var sp v1.ServicePort
		if pn, rest, ok := strings.Cut(p, ":"); ok {
			sp.Name, p = pn, rest
		}
		num, proto, _ := strings.Cut(p, "/")
		if _, err := fmt.Sscan(num, &sp.Port); err != nil {
			panic(fmt.Sprintf("test Service port %q: %v", p, err))
		}
		sp.Protocol = v1.Protocol(proto)
		sp.TargetPort = intstr.FromInt32(sp.Port)
		s.Spec.Ports = append(s.Spec.Ports, sp)
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func nodePort(portIndex int, np int32) func(*v1.Service) {
	return func(s *v1.Service) {
		if s.Spec.Type == v1.ServiceTypeClusterIP {
			s.Spec.Type = v1.ServiceTypeNodePort
		}
		s.Spec.Ports[portIndex].NodePort = np
	}
}

func lb(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
	}
}

func etpLocal(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }

func itpLocal(s *v1.Service) {
	s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
}

// ep describes one slice endpoint: "ip[@node][/zone][!notready][~terminating][^notserving][#hz=zone1+zone2][#hn=node1]".
type ep string

func (e ep) build() discovery.Endpoint {
	s := string(e)
	out := discovery.Endpoint{}
	parts := strings.Split(s, "#")
	s = parts[0]
	for _, h := range parts[1:] {
		if out.Hints == nil {
			out.Hints = &discovery.EndpointHints{}
		}
		k, v, _ := strings.Cut(h, "=")
		for _, x := range strings.Split(v, "+") {
			switch k {
			case "hz":
				out.Hints.ForZones = append(out.Hints.ForZones, discovery.ForZone{Name: x})
			case "hn":
				out.Hints.ForNodes = append(out.Hints.ForNodes, discovery.ForNode{Name: x})
			}
		}
	}
	if strings.Contains(s, "!") {
		out.Conditions.Ready = ptr(false)
		s = strings.ReplaceAll(s, "!", "")
	}
	if strings.Contains(s, "~") {
		out.Conditions.Terminating = ptr(true)
		s = strings.ReplaceAll(s, "~", "")
	}
	if strings.Contains(s, "^") {
		out.Conditions.Serving = ptr(false)
		s = strings.ReplaceAll(s, "^", "")
	}
	if a, z, ok := strings.Cut(s, "/"); ok {
		out.Zone = ptr(z)
		s = a
	}
	if a, n, ok := strings.Cut(s, "@"); ok {
		out.NodeName = ptr(n)
		s = a
	}
	out.Addresses = []string{s}
	return out
}

// slice builds an EndpointSlice ns/name of Service svcName; ports "name:port/proto".
func slice(name, svcName string, at discovery.AddressType, ports []string, eps ...ep) *discovery.EndpointSlice {
	ns, n, _ := strings.Cut(name, "/")
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: n, Labels: map[string]string{discovery.LabelServiceName: svcName}},
		AddressType: at,
	}
	for _, p := range ports {
		var name string
		if pn, rest, ok := strings.Cut(p, ":"); ok {
			name, p = pn, rest
		}
		num, proto, _ := strings.Cut(p, "/")
		var port int32
		if _, err := fmt.Sscan(num, &port); err != nil {
			panic(fmt.Sprintf("test slice port %q: %v", p, err))
		}
		sp := discovery.EndpointPort{Name: ptr(name), Port: ptr(port)}
		if proto != "" {
			sp.Protocol = ptr(v1.Protocol(proto))
		}
		es.Ports = append(es.Ports, sp)
	}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, e.build())
	}
	return es
}

func node(name string, labels map[string]string, addrs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

// epList renders endpoints compactly: "ip:port" plus "(L)" when local.
func epList(eps []proxy.Endpoint) string {
	var parts []string
	for _, e := range eps {
		s := e.String()
		if e.Local {
			s += "(L)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func spn(name, port string, proto v1.Protocol) proxy.ServicePortName {
	ns, n, _ := strings.Cut(name, "/")
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	return proxy.ServicePortName{NamespacedName: nsName(ns, n), Port: port, Protocol: proto}
}

func mustPort(t *testing.T, snap *proxy.Snapshot, fam v1.IPFamily, name proxy.ServicePortName) *proxy.ServicePort {
	t.Helper()
	p := snap.Family(fam).Get(name)
	if p == nil {
		t.Fatalf("%s port %s missing; have %v", fam, name, portNames(snap.Family(fam)))
	}
	return p
}

func portNames(v *proxy.FamilyView) []string {
	var out []string
	for _, p := range v.Sorted() {
		out = append(out, p.Name.String()+"/"+string(p.Protocol))
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func nsName(ns, n string) (out types.NamespacedName) {
	out.Namespace, out.Name = ns, n
	return out
}

func discardLogger() logr.Logger { return logr.Discard() }
