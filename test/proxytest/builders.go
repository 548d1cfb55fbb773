package proxytest

import (
	"fmt"
	"net/netip"
	"sort"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Namespace is the namespace of every object the builders create.
const Namespace = "default"

// Port names of every table Service: one TCP and one UDP port, both ServicePort,
// both targeting EchoPort.
const (
	PortTCP = "tcp"
	PortUDP = "udp"
)

// PortName returns the Service port name used for a protocol.
func PortName(proto v1.Protocol) string {
	if proto == v1.ProtocolUDP {
		return PortUDP
	}
	return PortTCP
}

// ServiceOption adjusts a Service being built. index is the Service's index,
// from which every address and port of the Service is derived.
type ServiceOption func(t *Topology, svc *v1.Service, index int)

// Service builds a dual-stack ClusterIP Service with a TCP and a UDP port
// (ServicePort → EchoPort). Its addresses derive from index (1..4000), so
// Services with distinct indexes never collide:
//
//	ClusterIPs        10.96.<index/256>.<index%256>, fd00:10:96::<index in decimal digits>
//	NodePort          NodePortBase+index (same number for TCP and UDP)
//	externalIPs       192.168.60.<index>, fd00:60::<index>
//	LoadBalancer IPs  192.168.70.<index>, fd00:70::<index>
func (t *Topology) Service(name string, index int, opts ...ServiceOption) *v1.Service {
	family := v1.IPFamilyPolicyRequireDualStack
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeClusterIP,
			Selector:       map[string]string{"app": name},
			IPFamilyPolicy: &family,
			IPFamilies:     []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			ClusterIPs: []string{
				host(t.ServiceCIDR4, index).String(),
				host(t.ServiceCIDR6, index).String(),
			},
			Ports: []v1.ServicePort{
				{Name: PortTCP, Protocol: v1.ProtocolTCP, Port: ServicePort, TargetPort: intstr.FromInt32(EchoPort)},
				{Name: PortUDP, Protocol: v1.ProtocolUDP, Port: ServicePort, TargetPort: intstr.FromInt32(EchoPort)},
			},
			SessionAffinity: v1.ServiceAffinityNone,
		},
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	for _, o := range opts {
		o(t, svc, index)
	}
	return svc
}

// setType raises the Service type to at least typ, filling NodePorts and the
// default external traffic policy the way the API server would.
func setType(svc *v1.Service, index int, typ v1.ServiceType) {
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		return
	}
	svc.Spec.Type = typ
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].NodePort == 0 {
			svc.Spec.Ports[i].NodePort = int32(NodePortBase + index)
		}
	}
	if svc.Spec.ExternalTrafficPolicy == "" {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	}
}

// WithNodePort makes the Service a NodePort Service.
func WithNodePort() ServiceOption {
	return func(_ *Topology, svc *v1.Service, index int) { setType(svc, index, v1.ServiceTypeNodePort) }
}

// WithLoadBalancer makes the Service a LoadBalancer Service (with NodePorts)
// whose status carries one ingress IP per family.
func WithLoadBalancer() ServiceOption {
	return func(t *Topology, svc *v1.Service, index int) {
		setType(svc, index, v1.ServiceTypeLoadBalancer)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Status.LoadBalancer.Ingress = nil
		for _, p := range []netip.Prefix{t.LoadBalancerCIDR4, t.LoadBalancerCIDR6} {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress,
				v1.LoadBalancerIngress{IP: host(p, index).String()})
		}
	}
}

// WithIPModeProxy marks the LoadBalancer ingress IPs ipMode Proxy: the load
// balancer delivers to the node with its own address as destination, so the
// node must not capture the ingress IPs. Apply after WithLoadBalancer.
func WithIPModeProxy() ServiceOption {
	return func(_ *Topology, svc *v1.Service, _ int) {
		for i := range svc.Status.LoadBalancer.Ingress {
			mode := v1.LoadBalancerIPModeProxy
			svc.Status.LoadBalancer.Ingress[i].IPMode = &mode
		}
	}
}

// WithExternalIPs gives the Service one externalIP per family.
func WithExternalIPs() ServiceOption {
	return func(t *Topology, svc *v1.Service, index int) {
		svc.Spec.ExternalIPs = []string{
			host(t.ExternalCIDR4, index).String(),
			host(t.ExternalCIDR6, index).String(),
		}
	}
}

// WithExternalIPsOf gives the Service the externalIPs of the Service with
// index owner: two Services then claim one frontend.
func WithExternalIPsOf(owner int) ServiceOption {
	return func(t *Topology, svc *v1.Service, _ int) {
		WithExternalIPs()(t, svc, owner)
	}
}

// WithSourceRanges sets loadBalancerSourceRanges.
func WithSourceRanges(cidrs ...string) ServiceOption {
	return func(_ *Topology, svc *v1.Service, _ int) { svc.Spec.LoadBalancerSourceRanges = cidrs }
}

// WithAffinity sets sessionAffinity ClientIP with a timeout (0: the default, 10800 s).
func WithAffinity(timeoutSeconds int32) ServiceOption {
	return func(_ *Topology, svc *v1.Service, _ int) {
		if timeoutSeconds == 0 {
			timeoutSeconds = v1.DefaultClientIPServiceAffinitySeconds
		}
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{
			ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeoutSeconds},
		}
	}
}

// WithExternalLocal sets externalTrafficPolicy Local (and a healthCheckNodePort
// for LoadBalancer Services, as the API server would).
func WithExternalLocal() ServiceOption {
	return func(_ *Topology, svc *v1.Service, index int) {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			svc.Spec.HealthCheckNodePort = int32(NodePortBase + 1000 + index)
		}
	}
}

// WithInternalLocal sets internalTrafficPolicy Local.
func WithInternalLocal() ServiceOption {
	return func(_ *Topology, svc *v1.Service, _ int) {
		local := v1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
}

// WithPreferClose sets trafficDistribution PreferClose and the topology-mode
// annotation, so hints in the EndpointSlices are honoured whichever signal a
// proxy reads.
func WithPreferClose() ServiceOption {
	return func(_ *Topology, svc *v1.Service, _ int) {
		d := v1.ServiceTrafficDistributionPreferClose
		svc.Spec.TrafficDistribution = &d
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[v1.AnnotationTopologyMode] = "Auto"
	}
}

// EP describes one endpoint of a Service: a pod of the topology and its
// conditions. The zero value is ready, serving and not terminating.
type EP struct {
	Pod string
	// NotReady makes the endpoint not ready and, unless Terminating, not
	// serving either (a running pod failing its readiness probe).
	NotReady bool
	// Terminating marks the endpoint terminating: never ready, serving
	// unless NotServing.
	Terminating bool
	// NotServing makes the endpoint neither ready nor serving.
	NotServing bool
	// ZoneHint, when set, gives the endpoint a forZones hint.
	ZoneHint string
}

// conditions returns the EndpointSlice conditions of ep.
func (ep EP) conditions() discovery.EndpointConditions {
	ready := !ep.NotReady && !ep.Terminating && !ep.NotServing
	serving := !ep.NotServing && (ep.Terminating || !ep.NotReady)
	terminating := ep.Terminating
	return discovery.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
}

// Ready returns ready endpoints for the named pods.
func Ready(pods ...string) []EP {
	out := make([]EP, 0, len(pods))
	for _, p := range pods {
		out = append(out, EP{Pod: p})
	}
	return out
}

// Slices builds the EndpointSlices of svc: one per IP family of the Service
// (named "<svc>-ipv4" / "<svc>-ipv6"), each listing eps with their pod's
// address of that family, the pod's node and zone, and one port per Service
// port (EchoPort). With no eps the slices exist but are empty.
func (t *Topology) Slices(svc *v1.Service, eps ...EP) ([]*discovery.EndpointSlice, error) {
	var out []*discovery.EndpointSlice
	for _, fam := range svc.Spec.IPFamilies {
		addrType := discovery.AddressTypeIPv4
		if fam == v1.IPv6Protocol {
			addrType = discovery.AddressTypeIPv6
		}
		slice := &discovery.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name:      fmt.Sprintf("%s-%s", svc.Name, map[v1.IPFamily]string{v1.IPv4Protocol: "ipv4", v1.IPv6Protocol: "ipv6"}[fam]),
				Namespace: svc.Namespace,
				Labels: map[string]string{
					discovery.LabelServiceName: svc.Name,
					discovery.LabelManagedBy:   "proxytest",
				},
			},
			AddressType: addrType,
		}
		for _, sp := range svc.Spec.Ports {
			name, proto, port := sp.Name, sp.Protocol, int32(EchoPort)
			slice.Ports = append(slice.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for _, ep := range eps {
			pod, ok := t.Host(ep.Pod)
			if !ok || pod.Role != RolePod {
				return nil, fmt.Errorf("proxytest: service %s: endpoint %q is not a pod of the topology", svc.Name, ep.Pod)
			}
			node, _ := t.Node(pod.Node)
			nodeName, zone := node.Name, node.Zone
			e := discovery.Endpoint{
				Addresses:  []string{pod.Addr(fam).String()},
				Conditions: ep.conditions(),
				NodeName:   &nodeName,
				Zone:       &zone,
				TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: pod.Name},
			}
			if ep.ZoneHint != "" {
				e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: ep.ZoneHint}}}
			}
			slice.Endpoints = append(slice.Endpoints, e)
		}
		out = append(out, slice)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
