package windows

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"k8s.io/klog/v2"
	"net/netip"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// CheckOptions configure CheckHNS. The addresses and the port must be unused
// on the node: the check creates HNS objects with them and deletes them at
// the end.
type CheckOptions struct {
	HNS HNS
	// NetworkName as for Options (empty: the only L2Bridge/Overlay network).
	NetworkName string
	// NodeIP is this node's IPv4 address (default: the first global unicast
	// IPv4 address of a host interface).
	NodeIP netip.Addr
	// NodeIPv6 (default: the first global unicast IPv6 address of a host
	// interface), when there is one and HNS supports IPv6, adds an IPv6 round.
	NodeIPv6 netip.Addr
	// SourceVIP for overlay networks. Default: the Calico_ep endpoint's
	// address, else the source VIP endpoint kproxy created on the network,
	// else the address ReservedSourceVIP finds (kproxy's reservation in the
	// IPAM store), else one ReserveSourceVIP reserves in PodCIDRs; without
	// PodCIDRs the check says to pass one.
	SourceVIP         netip.Addr
	ReservedSourceVIP func(network string, v6 bool) (netip.Addr, bool, error)
	ReserveSourceVIP  func(network string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error)
	PodCIDRs          []netip.Prefix
	// RootHNSEndpointName is the endpoint forwarded health checks go to
	// (default "cbr0"); when the network has none by that name, the check's
	// health check load balancer uses the local endpoint the check uses.
	RootHNSEndpointName string
	// CallTimeout bounds each HNS call (default DefaultCallTimeout).
	CallTimeout time.Duration
	// ClusterIP, ExternalIP and RemoteIP per family (defaults: 198.18.0.10,
	// 198.18.0.11, and on overlay the last address of the first remote
	// subnet, else 198.18.1.10; fd00:198:18::10, ::11 and fd00:198:19::10).
	// The LoadBalancer Service uses the two addresses after ExternalIP.
	ClusterIP, ExternalIP, RemoteIP       netip.Addr
	ClusterIPv6, ExternalIPv6, RemoteIPv6 netip.Addr
	// NodePort (default 32767).
	NodePort int32
	// Interfaces as for Options.
	Interfaces func() ([]HostInterface, error)
}

// CheckRow is one field of one object: what kproxy sent and what HNS
// returned when listed.
type CheckRow struct {
	Family, Object, Field, Sent, Read string
}

// OK reports whether HNS returned what was sent.
func (r CheckRow) OK() bool { return r.Sent == r.Read }

// CheckResult is the outcome of CheckHNS.
type CheckResult struct {
	Version Version
	Network string
	Rows    []CheckRow
	// Problems are failures of the check itself: a reconcile of what was
	// read back that is not empty, a sync from a fresh backend that would
	// change something, an object HNS refused, a deletion that failed.
	Problems []string
	// Notes say what the check did not do, or did differently, and why.
	Notes []string
}

// OK reports whether every field was returned as sent and nothing went wrong.
func (r *CheckResult) OK() bool {
	if len(r.Problems) > 0 {
		return false
	}
	for _, row := range r.Rows {
		if !row.OK() {
			return false
		}
	}
	return true
}

// Write prints the result as a table, then the problems and a verdict.
func (r *CheckResult) Write(w io.Writer) error {
	var buf bytes.Buffer // writes to it cannot fail; w's error is returned
	tw := tabwriter.NewWriter(&buf, 2, 4, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "HNS %s, network %q\n\n", r.Version, r.Network)
	_, _ = fmt.Fprintln(tw, "FAMILY\tOBJECT\tFIELD\tSENT\tREAD BACK\t")
	for _, row := range r.Rows {
		mark := ""
		if !row.OK() {
			mark = "DIFFERENT"
		}
		read := row.Read
		if read == "" && row.Sent != "" {
			read = "(not returned)"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", row.Family, row.Object, row.Field, row.Sent, read, mark)
	}
	_ = tw.Flush()
	for _, n := range r.Notes {
		_, _ = fmt.Fprintf(&buf, "NOTE: %s\n", n)
	}
	for _, p := range r.Problems {
		_, _ = fmt.Fprintf(&buf, "PROBLEM: %s\n", p)
	}
	verdict := "OK: HNS returned every field kproxy sent"
	if !r.OK() {
		verdict = "DIFFERENCES: send this output to the kproxy maintainers with the Windows build (winver)"
	}
	buf.WriteString(verdict + "\n")
	_, err := w.Write(buf.Bytes())
	return err
}

// CheckHNS creates, on the configured network, one of each kind of object
// kproxy uses (a remote endpoint, on overlay the source VIP endpoint, and
// load balancers for a ClusterIP with DSR and affinity, a NodePort, an
// external IP, and, when the network has a local endpoint, an ingress IP
// with externalTrafficPolicy Local (DSR) and its forwarded health check),
// lists them back, compares every field, verifies that reconciling what was
// read back (as a resync would) plans no operation and that a sync from a
// fresh backend (an empty record, as after a restart) would make no change,
// and deletes everything it created. It touches nothing else: other load
// balancers and endpoints are left out of its record and hidden from the
// fresh backend, which may not change HNS. IPv6 is checked when the node
// has an IPv6 address and HNS supports it, except on overlay networks
// (single-stack for kproxy, as upstream). The error is for a check that
// could not run; differences are in the result.
func CheckHNS(ctx context.Context, o CheckOptions) (*CheckResult, error) {
	if o.HNS == nil {
		return nil, errors.New("check-hns: no HNS")
	}
	fillCheckDefaults(&o)
	if o.CallTimeout > 0 {
		o.HNS = &timeoutHNS{hns: o.HNS, timeout: o.CallTimeout, log: klog.Background()}
	}
	res := &CheckResult{}
	v, err := o.HNS.Version()
	if err != nil {
		return nil, fmt.Errorf("check-hns: asking HNS for its version: %w", err)
	}
	res.Version = v
	network, err := checkFamily(ctx, &o, v1.IPv4Protocol, res)
	if err != nil {
		return res, err
	}
	switch {
	case !o.NodeIPv6.IsValid():
	case !CapabilitiesFor(v).IPv6:
		res.Notes = append(res.Notes, fmt.Sprintf("IPv6 not checked: HNS %s has no IPv6 load balancers (11.10 or later needed)", v))
	case network.IsOverlay():
		res.Notes = append(res.Notes, fmt.Sprintf("IPv6 not checked: network %q is an overlay network, single-stack for kproxy (as upstream)", network.Name))
	default:
		if _, err := checkFamily(ctx, &o, v1.IPv6Protocol, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func fillCheckDefaults(o *CheckOptions) {
	if o.Interfaces == nil {
		o.Interfaces = hostInterfaces
	}
	if !o.NodeIP.IsValid() || !o.NodeIPv6.IsValid() {
		ifaces, _ := o.Interfaces() // best effort: overlay networks then fail to plan, saying why
		for _, i := range ifaces {
			for _, a := range i.Addrs {
				switch {
				case !a.IsGlobalUnicast():
				case a.Is4() && !o.NodeIP.IsValid():
					o.NodeIP = a
				case a.Is6() && !o.NodeIPv6.IsValid():
					o.NodeIPv6 = a
				}
			}
		}
	}
	def := func(a *netip.Addr, s string) {
		if !a.IsValid() {
			*a = netip.MustParseAddr(s)
		}
	}
	def(&o.ClusterIP, "198.18.0.10")
	def(&o.ExternalIP, "198.18.0.11")
	def(&o.ClusterIPv6, "fd00:198:18::10")
	def(&o.ExternalIPv6, "fd00:198:18::11")
	def(&o.RemoteIPv6, "fd00:198:19::10")
	if o.NodePort == 0 {
		o.NodePort = 32767
	}
	if o.RootHNSEndpointName == "" {
		o.RootHNSEndpointName = DefaultRootHNSEndpointName
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
}

// checkFamily runs the check for one family and returns the network.
func checkFamily(ctx context.Context, o *CheckOptions, fam v1.IPFamily, res *CheckResult) (*Network, error) {
	opts := Options{
		HNS: o.HNS, Family: fam, NetworkName: o.NetworkName, SourceVIP: o.SourceVIP, ReserveSourceVIP: o.ReserveSourceVIP,
		EnableDSR: true, NodeIP: o.NodeIP, Interfaces: o.Interfaces, ResyncPeriod: -1, CheckPeriod: -1,
		ForwardHealthCheckVIP: true, RootHNSEndpointName: o.RootHNSEndpointName, CallTimeout: -1, // o.HNS is bounded
	}
	if fam == v1.IPv6Protocol {
		opts.NodeIP = o.NodeIPv6
	}
	b, err := New(opts)
	if err != nil {
		return nil, fmt.Errorf("check-hns: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.list(b.clock.Now()); err != nil {
		return nil, fmt.Errorf("check-hns: %w", err)
	}
	res.Network = b.network.Name
	network := b.network
	listed := b.rec

	// The check's own record: the CNI's endpoints (to use a local one), and
	// none of the load balancers or endpoints kproxy already programmed.
	st := NewState(listed.NetworkID)
	for ip, ep := range listed.Endpoints {
		if !ep.Owned() {
			st.Endpoints[ip] = ep
		}
	}
	b.rec = st
	snap := checkSnapshot(o, fam, b.network, st)
	if b.network.IsOverlay() && !b.opts.SourceVIP.IsValid() {
		ip, from, err := checkSourceVIP(o, b, listed)
		if err != nil {
			return network, fmt.Errorf("check-hns: %w", err)
		}
		res.Notes = append(res.Notes, fmt.Sprintf("%s: source VIP %s (%s)", fam, ip, from))
		b.sourceVIP = ip
	}
	if ip, name := checkLocal(st, fam); ip.IsValid() && !rootEndpointIP(st, b.opts.RootHNSEndpointName).IsValid() {
		// The health check load balancer needs an endpoint to go to.
		if name != "" {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: no endpoint %q on the network: the health check load balancer goes to %s (%s)",
				fam, b.opts.RootHNSEndpointName, ip, name))
			b.opts.RootHNSEndpointName = name
		} else {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: no endpoint %q on the network, and the local endpoint has no name: no health check load balancer",
				fam, b.opts.RootHNSEndpointName))
		}
	}
	plan := BuildPlan(b.facts(snap), snap.Family(fam))
	if plan.Err != nil {
		return network, fmt.Errorf("check-hns: planning: %w", plan.Err)
	}
	// An endpoint the plan wants that kproxy already has (the source VIP
	// endpoint, a pod's remote endpoint) is used as it is, never deleted.
	for _, e := range plan.Endpoints {
		if ep := listed.Endpoints[e.IP]; ep != nil && ep.Owned() {
			st.Endpoints[e.IP] = ep
		}
	}
	r := Reconcile(plan, st, b.caps.ModifyLoadBalancer)
	for _, op := range r.Ops {
		if op.Kind != OpKindCreateEndpoint && op.Kind != OpKindCreateLB {
			return network, fmt.Errorf("check-hns: refusing to run: it would %s", op.String())
		}
	}
	applied := b.apply(ctx, r)
	defer b.checkCleanup(res, fam)
	if err := applied.joined(); err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("%s: creating the objects: %v", fam, err))
	}

	// Read back and compare.
	eps, err := b.hns.ListEndpoints(st.NetworkID)
	if err != nil {
		return network, fmt.Errorf("check-hns: listing endpoints: %w", err)
	}
	lbs, err := b.hns.ListLoadBalancers()
	if err != nil {
		return network, fmt.Errorf("check-hns: listing load balancers: %w", err)
	}
	res.Rows = append(res.Rows, compareObjects(fam, b, eps, lbs)...)

	// What a resync would do with what was read back: only the check's
	// objects, with kproxy's record of what it sent.
	ours := make([]LoadBalancer, 0, len(b.sentLBs))
	for i := range lbs {
		if _, ok := b.sentLBs[strings.ToLower(lbs[i].ID)]; ok {
			ours = append(ours, lbs[i])
		}
	}
	read := Observe(fam, st.NetworkID, eps, ours)
	for ip := range read.Endpoints {
		if st.Endpoints[ip] == nil {
			delete(read.Endpoints, ip) // not the check's
		}
	}
	read.Shadowed = nil
	b.adoptSent(read, false)
	if again := Reconcile(plan, read, b.caps.ModifyLoadBalancer); !again.Empty() {
		res.Problems = append(res.Problems, fmt.Sprintf("%s: a resync would change what was just programmed:\n%s", fam, again))
	}

	// A real sync by a fresh backend (as after a kproxy restart: no record)
	// over what was created: it must want no change.
	if changes, err := b.freshSync(ctx, snap, opts); err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("%s: a sync from a fresh backend failed: %v", fam, err))
	} else if len(changes) > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%s: a sync from a fresh backend (empty record, as after a restart) would change what was just programmed:\n%s",
			fam, strings.Join(changes, "\n")))
	}
	return network, nil
}

// freshSync runs a sync of snap by a new backend with the check's options,
// over an HNS that shows it only the check's objects and the CNI's
// endpoints and refuses every change; it returns the changes the sync
// tried. b.mu is held.
func (b *Backend) freshSync(ctx context.Context, snap *proxy.Snapshot, opts Options) ([]string, error) {
	view := &checkView{hns: b.hns, lbs: make(map[string]bool), eps: make(map[string]bool)}
	for id := range b.sentLBs {
		view.lbs[id] = true
	}
	for _, ep := range b.rec.Endpoints {
		view.eps[ep.ID] = true
	}
	opts.HNS = view
	opts.NetworkName = b.network.Name
	opts.RootHNSEndpointName = b.opts.RootHNSEndpointName
	opts.ReserveSourceVIP = nil
	if b.sourceVIP.IsValid() {
		opts.SourceVIP = b.sourceVIP
	}
	fresh, err := New(opts)
	if err != nil {
		return nil, err
	}
	err = fresh.Sync(ctx, snap, proxy.Changes{Full: true})
	if len(view.changes) > 0 {
		return view.changes, nil // their refusal is what failed the sync, if it failed
	}
	return nil, err
}

// checkView is the HNS a fresh backend sees in CheckHNS: only the listed
// objects, and no change (each call that would change HNS is recorded and
// refused).
type checkView struct {
	hns     HNS
	lbs     map[string]bool // load balancer IDs shown, lower case
	eps     map[string]bool // endpoint IDs shown, lower case
	changes []string
}

var _ HNS = (*checkView)(nil)

var errCheckRefused = errors.New("check-hns: refused, the check only looks")

func (v *checkView) refuse(op, what string) error {
	v.changes = append(v.changes, op+" "+what)
	return NewError(op, CodeInvalidArg, errCheckRefused)
}

func (v *checkView) Version() (Version, error)                { return v.hns.Version() }
func (v *checkView) ListNetworks() ([]Network, error)         { return v.hns.ListNetworks() }
func (v *checkView) GetNetwork(name string) (*Network, error) { return v.hns.GetNetwork(name) }

func (v *checkView) ListEndpoints(networkID string) ([]Endpoint, error) {
	eps, err := v.hns.ListEndpoints(networkID)
	out := eps[:0:0]
	for _, ep := range eps {
		if v.eps[strings.ToLower(ep.ID)] {
			out = append(out, ep)
		}
	}
	return out, err
}

func (v *checkView) ListLoadBalancers() ([]LoadBalancer, error) {
	lbs, err := v.hns.ListLoadBalancers()
	out := lbs[:0:0]
	for _, lb := range lbs {
		if v.lbs[strings.ToLower(lb.ID)] {
			out = append(out, lb)
		}
	}
	return out, err
}

func (v *checkView) CreateEndpoint(_ string, ep *Endpoint) (*Endpoint, error) {
	return nil, v.refuse(OpCreateEndpoint, endpointString(ep))
}

func (v *checkView) DeleteEndpoint(id string) error { return v.refuse(OpDeleteEndpoint, id) }

func (v *checkView) CreateLoadBalancer(lb *LoadBalancer) (*LoadBalancer, error) {
	return nil, v.refuse(OpCreateLoadBalancer, lbString(lb))
}

func (v *checkView) UpdateLoadBalancer(id string, lb *LoadBalancer) (*LoadBalancer, error) {
	return nil, v.refuse(OpUpdateLoadBalancer, id+" to "+lbString(lb))
}

func (v *checkView) DeleteLoadBalancer(id string) error { return v.refuse(OpDeleteLoadBalancer, id) }

func endpointString(ep *Endpoint) string {
	var ips []string
	for _, c := range ep.IPConfigurations {
		ips = append(ips, c.IPAddress)
	}
	s := strings.Join(ips, ",")
	if pa := ep.ProviderAddress(); pa != "" {
		s += " pa=" + pa
	}
	return s
}

func lbString(lb *LoadBalancer) string {
	vips := strings.Join(lb.FrontendVIPs, ",")
	if vips == "" {
		vips = "*"
	}
	var pm PortMapping
	if len(lb.PortMappings) > 0 {
		pm = lb.PortMappings[0]
	}
	return fmt.Sprintf("%s %s:%d -> %d flags=%d pflags=%d dist=%d src=%s", protocolName(pm.Protocol), vips, pm.ExternalPort,
		pm.InternalPort, lb.Flags, pm.Flags, pm.DistributionType, lb.SourceVIP)
}

// checkSourceVIP finds the source VIP of an overlay network for the check
// when none is given: Calico's endpoint, kproxy's source VIP endpoint,
// kproxy's reservation in the IPAM store, else one reserved in the pod CIDR
// given. b.mu is held.
func checkSourceVIP(o *CheckOptions, b *Backend, listed *State) (netip.Addr, string, error) {
	v6 := b.opts.Family == v1.IPv6Protocol
	var calico, ours netip.Addr
	for ip, ep := range listed.Endpoints {
		switch {
		case ep.Remote || ip.Is6() != v6:
		case strings.EqualFold(ep.Name, CalicoEndpointName):
			calico = ip
		case strings.HasPrefix(ep.Name, EndpointNamePrefix+strings.ToLower(string(RoleSourceVIP))+"-"):
			ours = ip
		}
	}
	switch {
	case calico.IsValid():
		return calico, "the " + CalicoEndpointName + " endpoint", nil
	case ours.IsValid():
		return ours, "kproxy's source VIP endpoint on the network", nil
	}
	if o.ReservedSourceVIP != nil {
		ip, ok, err := o.ReservedSourceVIP(b.network.Name, v6)
		if err != nil {
			return netip.Addr{}, "", fmt.Errorf("looking for kproxy's source VIP reservation: %w", err)
		}
		if ok {
			return ip, "kproxy's reservation in the IPAM store", nil
		}
	}
	if len(o.PodCIDRs) == 0 {
		return netip.Addr{}, "", errSourceVIP{fmt.Sprintf("network %q is an overlay network and no source VIP was found (no %s endpoint, no kproxy source VIP endpoint or reservation): pass --source-vip, or --pod-cidr (this node's podCIDR) to reserve one as kproxy does",
			b.network.Name, CalicoEndpointName)}
	}
	ip, from, err := findSourceVIP(&b.opts, b.network.Name, listed, o.PodCIDRs)
	return ip, from, err
}

// checkLocal is the local endpoint the check's Services use (invalid when
// the network has none): the lowest address of a CNI endpoint of the
// family, Calico's host endpoint aside.
func checkLocal(st *State, fam v1.IPFamily) (netip.Addr, string) {
	var local netip.Addr
	var name string
	for ip, ep := range st.Endpoints {
		if !ep.Remote && !strings.EqualFold(ep.Name, CalicoEndpointName) && ip.Is6() == (fam == v1.IPv6Protocol) &&
			(!local.IsValid() || ip.Less(local)) {
			local, name = ip, ep.Name
		}
	}
	return local, name
}

// checkCleanup deletes what the check created: its load balancers, then the
// endpoints it created. b.mu is held.
func (b *Backend) checkCleanup(res *CheckResult, fam v1.IPFamily) {
	for _, slot := range sortedSlots(b.rec.LoadBalancers) {
		if err := b.deleteLB(b.rec.LoadBalancers[slot]); err != nil {
			res.Problems = append(res.Problems, fmt.Sprintf("%s: cleanup: %v", fam, err))
		}
	}
	ids := make([]string, 0, len(b.sentEP))
	for id := range b.sentEP {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := b.hns.DeleteEndpoint(id); err != nil && !IsNotFound(err) {
			res.Problems = append(res.Problems, fmt.Sprintf("%s: cleanup: deleting endpoint %s: %v", fam, id, err))
		}
	}
}

// checkSnapshot is the check's Services: one with a ClusterIP, a NodePort,
// an external IP and ClientIP affinity, backed by a remote endpoint and a
// local one when the network has one; and, with a local endpoint, a
// LoadBalancer with externalTrafficPolicy Local (DSR).
func checkSnapshot(o *CheckOptions, fam v1.IPFamily, n *Network, st *State) *proxy.Snapshot {
	clusterIP, externalIP, remoteIP, nodeIP := o.ClusterIP, o.ExternalIP, o.RemoteIP, o.NodeIP
	if fam == v1.IPv6Protocol {
		clusterIP, externalIP, remoteIP, nodeIP = o.ClusterIPv6, o.ExternalIPv6, o.RemoteIPv6, o.NodeIPv6
	}
	if !remoteIP.IsValid() {
		remoteIP = netip.MustParseAddr("198.18.1.10")
		for _, rs := range n.RemoteSubnets {
			if p, err := netip.ParsePrefix(rs.DestinationPrefix); err == nil && p.Addr().Is4() {
				remoteIP = lastAddr(p.Masked()).Prev()
				break
			}
		}
	}
	local, _ := checkLocal(st, fam)
	name := func(svc string) proxy.ServicePortName {
		return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "kproxy-check-hns", Name: svc}, Port: "http", Protocol: v1.ProtocolTCP}
	}
	eps := []proxy.Endpoint{{IP: remoteIP, Port: 8080, Ready: true, Serving: true, NodeName: "other"}}
	if local.IsValid() {
		eps = append(eps, proxy.Endpoint{IP: local, Port: 8080, Ready: true, Serving: true, NodeName: "this", Local: true})
	}
	proxy.SortEndpoints(eps)
	main := &proxy.ServicePort{
		Name: name("nodeport"), Family: fam, Type: v1.ServiceTypeNodePort, ClusterIP: clusterIP, Port: 80,
		NodePort: o.NodePort, Protocol: v1.ProtocolTCP, ExternalIPs: []netip.Addr{externalIP},
		AffinityTimeoutSeconds: defaultAffinitySeconds, HasAnyEndpoints: true, ClusterEndpoints: eps,
	}
	ports := map[proxy.ServicePortName]*proxy.ServicePort{main.Name: main}
	if local.IsValid() {
		localEP := []proxy.Endpoint{eps[0]}
		for _, e := range eps {
			if e.Local {
				localEP = []proxy.Endpoint{e}
			}
		}
		lb := &proxy.ServicePort{
			Name: name("dsr"), Family: fam, Type: v1.ServiceTypeLoadBalancer, ClusterIP: externalIP.Next(), Port: 81,
			Protocol: v1.ProtocolTCP, LoadBalancerIPs: []netip.Addr{externalIP.Next().Next()}, ExternalPolicyLocal: true,
			HasAnyEndpoints: true, ClusterEndpoints: eps, LocalEndpoints: localEP,
		}
		ports[lb.Name] = lb
	}
	s := &proxy.Snapshot{Generation: 1, Node: proxy.Node{Name: "this", Known: true, Addresses: []netip.Addr{nodeIP}, PodCIDRs: o.PodCIDRs}}
	view := proxy.NewFamilyView(fam, ports)
	if fam == v1.IPv6Protocol {
		s.IPv6 = view
	} else {
		s.IPv4 = view
	}
	return s
}

// compareObjects lists, field by field, what was sent for each object the
// check created and what HNS returned for it.
func compareObjects(fam v1.IPFamily, b *Backend, eps []Endpoint, lbs []LoadBalancer) []CheckRow {
	var rows []CheckRow
	byID := make(map[string]*Endpoint, len(eps))
	for i := range eps {
		byID[strings.ToLower(eps[i].ID)] = &eps[i]
	}
	ids := make([]string, 0, len(b.sentEP))
	for id := range b.sentEP {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return b.sentEP[ids[i]].ip.Less(b.sentEP[ids[j]].ip) })
	for _, id := range ids {
		s := b.sentEP[id]
		obj := "endpoint " + s.ip.String()
		got := byID[id]
		if got == nil {
			rows = append(rows, CheckRow{string(fam), obj, "ID", id, "(missing)"})
			continue
		}
		remote := func(r bool) string { return fmt.Sprint(r) }
		pa := ""
		if s.providerAddress.IsValid() {
			pa = s.providerAddress.String()
		}
		gotIP := ""
		if ips := got.IPs(); len(ips) > 0 {
			gotIP = ips[0].String()
		}
		rows = append(rows,
			CheckRow{string(fam), obj, "IpAddress", s.ip.String(), gotIP},
			CheckRow{string(fam), obj, "Name", s.name, got.Name},
			CheckRow{string(fam), obj, "MacAddress", strings.ToLower(s.mac), strings.ToLower(got.MacAddress)},
			CheckRow{string(fam), obj, "Flags.Remote", remote(s.remote), remote(got.IsRemote())},
			CheckRow{string(fam), obj, "Policies.ProviderAddress", pa, got.ProviderAddress()},
		)
	}
	lbByID := make(map[string]*LoadBalancer, len(lbs))
	for i := range lbs {
		lbByID[strings.ToLower(lbs[i].ID)] = &lbs[i]
	}
	lbIDs := make([]string, 0, len(b.sentLBs))
	for id := range b.sentLBs {
		lbIDs = append(lbIDs, id)
	}
	sort.Slice(lbIDs, func(i, j int) bool { return b.sentLBs[lbIDs[i]].spec.slot < b.sentLBs[lbIDs[j]].spec.slot })
	for _, id := range lbIDs {
		spec := b.sentLBs[id].spec
		obj := "load balancer " + spec.slot
		got := lbByID[id]
		if got == nil {
			rows = append(rows, CheckRow{string(fam), obj, "ID", id, "(missing)"})
			continue
		}
		sent := spec.HNS(nil)
		pm, gpm := sent.PortMappings[0], PortMapping{}
		if len(got.PortMappings) > 0 {
			gpm = got.PortMappings[0]
		}
		num := func(v uint64) string {
			if v == 0 {
				return ""
			}
			return fmt.Sprint(v)
		}
		wantEPs := make([]string, 0, len(spec.Endpoints))
		for _, ip := range spec.Endpoints {
			if ep := b.rec.Endpoints[ip]; ep != nil {
				wantEPs = append(wantEPs, ep.ID)
			}
		}
		rows = append(rows,
			CheckRow{string(fam), obj, "FrontendVIPs", strings.Join(sent.FrontendVIPs, ","), strings.Join(got.FrontendVIPs, ",")},
			CheckRow{string(fam), obj, "SourceVIP", sent.SourceVIP, got.SourceVIP},
			CheckRow{string(fam), obj, "Flags", num(uint64(sent.Flags)), num(uint64(got.Flags))},
			CheckRow{string(fam), obj, "HostComputeEndpoints", strings.Join(sortedCopy(wantEPs), ","), strings.Join(sortedCopy(got.HostComputeEndpoints), ",")},
			CheckRow{string(fam), obj, "PortMappings.Protocol", num(uint64(pm.Protocol)), num(uint64(gpm.Protocol))},
			CheckRow{string(fam), obj, "PortMappings.InternalPort", num(uint64(pm.InternalPort)), num(uint64(gpm.InternalPort))},
			CheckRow{string(fam), obj, "PortMappings.ExternalPort", num(uint64(pm.ExternalPort)), num(uint64(gpm.ExternalPort))},
			CheckRow{string(fam), obj, "PortMappings.DistributionType", num(uint64(pm.DistributionType)), num(uint64(gpm.DistributionType))},
			CheckRow{string(fam), obj, "PortMappings.Flags", num(uint64(pm.Flags)), num(uint64(gpm.Flags))},
		)
	}
	return rows
}
