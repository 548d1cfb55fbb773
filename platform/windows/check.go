package windows

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"
	"text/tabwriter"

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
	// SourceVIP for overlay networks; default as for Options (Calico_ep,
	// else ReserveSourceVIP with PodCIDRs).
	SourceVIP        netip.Addr
	ReserveSourceVIP func(network string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error)
	PodCIDRs         []netip.Prefix
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
	// read back that is not empty, an object HNS refused, a deletion that
	// failed.
	Problems []string
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
// external IP, and an ingress IP with externalTrafficPolicy Local (DSR) when
// the network has a local endpoint), lists them back, compares every field,
// verifies that reconciling what was read back (as a resync would) plans no
// operation, and deletes everything it created. It touches nothing else:
// other load balancers and endpoints are left out of its record. The error
// is for a check that could not run; differences are in the result.
func CheckHNS(ctx context.Context, o CheckOptions) (*CheckResult, error) {
	if o.HNS == nil {
		return nil, errors.New("check-hns: no HNS")
	}
	fillCheckDefaults(&o)
	res := &CheckResult{}
	v, err := o.HNS.Version()
	if err != nil {
		return nil, fmt.Errorf("check-hns: asking HNS for its version: %w", err)
	}
	res.Version = v
	fams := []v1.IPFamily{v1.IPv4Protocol}
	if o.NodeIPv6.IsValid() && CapabilitiesFor(v).IPv6 {
		fams = append(fams, v1.IPv6Protocol)
	}
	for _, fam := range fams {
		if err := checkFamily(ctx, &o, fam, res); err != nil {
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
}

func checkFamily(ctx context.Context, o *CheckOptions, fam v1.IPFamily, res *CheckResult) error {
	opts := Options{
		HNS: o.HNS, Family: fam, NetworkName: o.NetworkName, SourceVIP: o.SourceVIP, ReserveSourceVIP: o.ReserveSourceVIP,
		EnableDSR: true, NodeIP: o.NodeIP, Interfaces: o.Interfaces, ResyncPeriod: -1, CheckPeriod: -1,
	}
	if fam == v1.IPv6Protocol {
		opts.NodeIP = o.NodeIPv6
	}
	b, err := New(opts)
	if err != nil {
		return fmt.Errorf("check-hns: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.list(b.clock.Now()); err != nil {
		return fmt.Errorf("check-hns: %w", err)
	}
	res.Network = b.network.Name
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
		ip, _, err := findSourceVIP(&b.opts, b.network.Name, listed, o.PodCIDRs)
		if err != nil {
			return fmt.Errorf("check-hns: %w", err)
		}
		b.sourceVIP = ip
	}
	plan := BuildPlan(b.facts(snap), snap.Family(fam))
	if plan.Err != nil {
		return fmt.Errorf("check-hns: planning: %w", plan.Err)
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
			return fmt.Errorf("check-hns: refusing to run: it would %s", op.String())
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
		return fmt.Errorf("check-hns: listing endpoints: %w", err)
	}
	lbs, err := b.hns.ListLoadBalancers()
	if err != nil {
		return fmt.Errorf("check-hns: listing load balancers: %w", err)
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
	return nil
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
	var local netip.Addr
	for ip, ep := range st.Endpoints {
		if !ep.Remote && !strings.EqualFold(ep.Name, CalicoEndpointName) && ip.Is6() == (fam == v1.IPv6Protocol) &&
			(!local.IsValid() || ip.Less(local)) {
			local = ip
		}
	}
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
