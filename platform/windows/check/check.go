// Package check is `kproxy check-hns`: on a Windows node, it programs one
// of each HNS object kproxy uses, the way the backend does, reads them back
// and reports any field HNS did not return as sent (Run); and it sends real
// connections from the host through Service frontends (Traffic). It uses
// the backend's exported layers only: the HNS seam (hns), the planner
// (plan), the reconciler and applier (reconcile), and a Backend for the
// fresh sync.
package check

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
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// Options configure Run. The addresses and the port must be unused on the
// node: the check creates HNS objects with them and deletes them at the end.
type Options struct {
	HNS hns.HNS
	// NetworkName as for windows.Options (empty: the network the CNI
	// configuration names, else the only L2Bridge/Overlay network).
	NetworkName string
	// CNIConfig as for windows.Options (nil: none is read).
	CNIConfig func() (*windows.CNIConfig, error)
	// NodeIP is this node's IPv4 address (default: the first global unicast
	// IPv4 address of a host interface).
	NodeIP netip.Addr
	// NodeIPv6 (default: the first global unicast IPv6 address of a host
	// interface), when there is one and HNS supports IPv6, adds an IPv6 round.
	NodeIPv6 netip.Addr
	// SourceVIP for overlay networks. Default: the Calico_ep endpoint's
	// address, else the source VIP endpoint kproxy created on the network,
	// else the address ReservedSourceVIP finds in the host-local store
	// (kproxy's reservation), else one ReserveSourceVIP reserves there in
	// PodCIDRs; without PodCIDRs the check says to pass one.
	SourceVIP         netip.Addr
	ReservedSourceVIP func(store string, v6 bool) (netip.Addr, bool, error)
	ReserveSourceVIP  func(store string, subnet netip.Prefix, avoid func(netip.Addr) bool) (netip.Addr, error)
	// IPAMDataDir as for windows.Options.
	IPAMDataDir string
	PodCIDRs    []netip.Prefix
	// RootHNSEndpointName is the endpoint forwarded health checks go to
	// (default "cbr0"); when the network has none by that name, the check's
	// health check load balancer uses the local endpoint the check uses.
	RootHNSEndpointName string
	// CallTimeout bounds each HNS call (default hns.DefaultCallTimeout).
	CallTimeout time.Duration
	// ClusterIP, ExternalIP and RemoteIP per family (defaults: 198.18.0.10,
	// 198.18.0.11, and on overlay the last address of the first remote
	// subnet, else 198.18.1.10; fd00:198:18::10, ::11 and fd00:198:19::10).
	// The LoadBalancer Service uses the two addresses after ExternalIP.
	ClusterIP, ExternalIP, RemoteIP       netip.Addr
	ClusterIPv6, ExternalIPv6, RemoteIPv6 netip.Addr
	// NodePort (default 32767).
	NodePort int32
	// Interfaces as for windows.Options.
	Interfaces func() ([]windows.HostInterface, error)
}

// Row is one field of one object: what kproxy sent and what HNS
// returned when listed.
type Row struct {
	Family, Object, Field, Sent, Read string
}

// OK reports whether HNS returned what was sent.
func (r Row) OK() bool { return r.Sent == r.Read }

// Result is the outcome of Run.
type Result struct {
	Version hns.Version
	Network string
	Rows    []Row
	// Problems are failures of the check itself: a reconcile of what was
	// read back that is not empty, a sync from a fresh backend that would
	// change something, an object HNS refused, a deletion that failed.
	Problems []string
	// Notes say what the check did not do, or did differently, and why.
	Notes []string
}

// OK reports whether every field was returned as sent and nothing went wrong.
func (r *Result) OK() bool {
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
func (r *Result) Write(w io.Writer) error {
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

// Run creates, on the configured network, one of each kind of object kproxy
// uses (a remote endpoint, on overlay the source VIP endpoint, and load
// balancers for a ClusterIP with DSR and affinity, a NodePort, an external
// IP, and, when the network has a local endpoint, an ingress IP with
// externalTrafficPolicy Local (DSR) and its forwarded health check), lists
// them back, compares every field, verifies that reconciling what was read
// back (as a resync would) plans no operation and that a sync from a fresh
// backend (an empty record, as after a restart) would make no change, and
// deletes everything it created. It touches nothing else: other load
// balancers and endpoints are left out of its record and hidden from the
// fresh backend, which may not change HNS. IPv6 is checked when the node
// has an IPv6 address and HNS supports it, except on overlay networks
// (single-stack for kproxy, as upstream). The error is for a check that
// could not run; differences are in the result.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.HNS == nil {
		return nil, errors.New("check-hns: no HNS")
	}
	fillDefaults(&o)
	if o.CallTimeout > 0 {
		o.HNS = hns.WithTimeout(o.HNS, o.CallTimeout, klog.Background())
	}
	res := &Result{}
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
	case !hns.CapabilitiesFor(v).IPv6:
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

func fillDefaults(o *Options) {
	if o.Interfaces == nil {
		o.Interfaces = windows.HostInterfaces
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
		o.RootHNSEndpointName = windows.DefaultRootHNSEndpointName
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = hns.DefaultCallTimeout
	}
}

// round is the check of one family.
type round struct {
	o       *Options
	fam     v1.IPFamily
	res     *Result
	h       hns.HNS
	caps    hns.Capabilities
	network *hns.Network
	cni     *windows.CNIConfig
	// opts are the backend options the check plans with (and the fresh
	// backend runs with).
	opts windows.Options
}

func (c *round) problem(format string, args ...any) {
	c.res.Problems = append(c.res.Problems, string(c.fam)+": "+fmt.Sprintf(format, args...))
}

// checkFamily runs the check for one family and returns the network.
func checkFamily(ctx context.Context, o *Options, fam v1.IPFamily, res *Result) (*hns.Network, error) {
	c := &round{o: o, fam: fam, res: res, h: o.HNS}
	v, err := c.h.Version()
	if err != nil {
		return nil, fmt.Errorf("check-hns: asking HNS for its version: %w", err)
	}
	c.caps = hns.CapabilitiesFor(v)
	if o.CNIConfig != nil {
		c.cni, _ = o.CNIConfig() // none: the network must be named or be the only one
	}
	name := o.NetworkName
	if name == "" {
		if name, _, err = windows.FindNetwork(c.h, c.cni); err != nil {
			return nil, fmt.Errorf("check-hns: %w", err)
		}
	}
	n, err := c.h.GetNetwork(name)
	if err != nil {
		return nil, fmt.Errorf("check-hns: getting HNS network %q: %w", name, err)
	}
	c.network = n
	res.Network = n.Name
	eps, err := c.h.ListEndpoints(n.ID)
	if err != nil {
		return n, fmt.Errorf("check-hns: listing endpoints of %q: %w", n.Name, err)
	}
	lbs, err := c.h.ListLoadBalancers()
	if err != nil {
		return n, fmt.Errorf("check-hns: listing load balancers: %w", err)
	}
	listed := reconcile.Observe(fam, n.ID, eps, lbs)
	nodeIP := o.NodeIP
	if fam == v1.IPv6Protocol {
		nodeIP = o.NodeIPv6
	}
	c.opts = windows.Options{
		HNS: c.h, Family: fam, NetworkName: n.Name, SourceVIP: o.SourceVIP, EnableDSR: true, NodeIP: nodeIP,
		Interfaces: o.Interfaces, ResyncPeriod: -1, CheckPeriod: -1, ForwardHealthCheckVIP: true,
		RootHNSEndpointName: o.RootHNSEndpointName, CallTimeout: -1, // o.HNS is bounded
		HealthzPort: windows.DefaultHealthzPort,
	}
	if c.opts.SourceVIP.IsValid() && c.opts.SourceVIP.Is6() != (fam == v1.IPv6Protocol) {
		c.opts.SourceVIP = netip.Addr{}
	}

	// The check's own state: the CNI's endpoints (to use a local one), and
	// none of the load balancers or endpoints kproxy already programmed.
	st := reconcile.NewState(listed.NetworkID)
	for ip, ep := range listed.Endpoints {
		if !ep.Owned() {
			st.Endpoints[ip] = ep
		}
	}
	snap := checkSnapshot(o, fam, n, st)
	if n.IsOverlay() && !c.opts.SourceVIP.IsValid() {
		ip, from, err := c.sourceVIP(listed)
		if err != nil {
			return n, fmt.Errorf("check-hns: %w", err)
		}
		res.Notes = append(res.Notes, fmt.Sprintf("%s: source VIP %s (%s)", fam, ip, from))
		c.opts.SourceVIP = ip
	}
	if ip, local := checkLocal(st, fam); ip.IsValid() && !windows.RootEndpointIP(st, c.opts.RootHNSEndpointName).IsValid() {
		// The health check load balancer needs an endpoint to go to.
		if local != "" {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: no endpoint %q on the network: the health check load balancer goes to %s (%s)",
				fam, c.opts.RootHNSEndpointName, ip, local))
			c.opts.RootHNSEndpointName = local
		} else {
			res.Notes = append(res.Notes, fmt.Sprintf("%s: no endpoint %q on the network, and the local endpoint has no name: no health check load balancer",
				fam, c.opts.RootHNSEndpointName))
		}
	}
	ifaces, _ := o.Interfaces() // best effort, as the backend does
	facts := windows.GatherFacts(&c.opts, c.caps, n, ifaces, st, snap.Node)
	p := plan.Build(facts, windows.FullView(fam, snap), nil)
	if p.Err != nil {
		return n, fmt.Errorf("check-hns: planning: %w", p.Err)
	}
	// An endpoint the plan wants that kproxy already has (the source VIP
	// endpoint, a pod's remote endpoint) is used as it is, never deleted.
	for _, e := range p.Endpoints {
		if ep := listed.Endpoints[e.IP]; ep != nil && ep.Owned() {
			st.Endpoints[e.IP] = ep
		}
	}
	r := reconcile.Reconcile(p, st, c.caps.ModifyLoadBalancer)
	for _, op := range r.Ops {
		if op.Kind != reconcile.OpKindCreateEndpoint && op.Kind != reconcile.OpKindCreateLB {
			return n, fmt.Errorf("check-hns: refusing to run: it would %s", op.String())
		}
	}
	ap := reconcile.Applier{HNS: c.h, Log: klog.Background(), Family: fam, Modify: c.caps.ModifyLoadBalancer}
	rec, applied := ap.Apply(ctx, r, reconcile.NewRecord(st))
	defer c.cleanup(rec)
	if err := applied.Joined(); err != nil {
		c.problem("creating the objects: %v", err)
	}

	// Read back and compare.
	eps, err = c.h.ListEndpoints(st.NetworkID)
	if err != nil {
		return n, fmt.Errorf("check-hns: listing endpoints: %w", err)
	}
	lbs, err = c.h.ListLoadBalancers()
	if err != nil {
		return n, fmt.Errorf("check-hns: listing load balancers: %w", err)
	}
	res.Rows = append(res.Rows, compareObjects(fam, rec, eps, lbs)...)

	// What a resync would do with what was read back: only the check's
	// objects, with kproxy's record of what it sent.
	ours := make([]hns.LoadBalancer, 0, len(rec.Sent.LBs))
	for i := range lbs {
		if _, ok := rec.Sent.LBs[strings.ToLower(lbs[i].ID)]; ok {
			ours = append(ours, lbs[i])
		}
	}
	read := reconcile.Observe(fam, st.NetworkID, eps, ours)
	for ip := range read.Endpoints {
		if rec.State.Endpoints[ip] == nil {
			delete(read.Endpoints, ip) // not the check's
		}
	}
	read.Shadowed = nil
	adopted := reconcile.Adopt(read, 0, rec, nil).Record
	if again := reconcile.Reconcile(p, adopted.State, c.caps.ModifyLoadBalancer); !again.Empty() {
		c.problem("a resync would change what was just programmed:\n%s", again)
	}

	// A real sync by a fresh backend (as after a kproxy restart: no record)
	// over what was created: it must want no change.
	if changes, err := c.freshSync(ctx, snap, rec); err != nil {
		c.problem("a sync from a fresh backend failed: %v", err)
	} else if len(changes) > 0 {
		c.problem("a sync from a fresh backend (empty record, as after a restart) would change what was just programmed:\n%s",
			strings.Join(changes, "\n"))
	}
	return n, nil
}

// freshSync runs a sync of snap by a new backend with the check's options,
// over an HNS that shows it only the check's objects and the CNI's
// endpoints and refuses every change; it returns the changes the sync
// tried.
func (c *round) freshSync(ctx context.Context, snap *proxy.Snapshot, rec *reconcile.Record) ([]string, error) {
	view := &checkView{hns: c.h, lbs: make(map[string]bool), eps: make(map[string]bool)}
	for id := range rec.Sent.LBs {
		view.lbs[id] = true
	}
	for _, ep := range rec.State.Endpoints {
		view.eps[strings.ToLower(ep.ID)] = true
	}
	opts := c.opts
	opts.HNS = view
	opts.ReserveSourceVIP = nil
	fresh, err := windows.New(opts)
	if err != nil {
		return nil, err
	}
	err = fresh.Sync(ctx, windows.FullView(c.opts.Family, snap))
	if len(view.changes) > 0 {
		return view.changes, nil // their refusal is what failed the sync, if it failed
	}
	return nil, err
}

// checkView is the HNS a fresh backend sees in CheckHNS: only the listed
// objects, and no change (each call that would change HNS is recorded and
// refused).
type checkView struct {
	hns     hns.HNS
	lbs     map[string]bool // load balancer IDs shown, lower case
	eps     map[string]bool // endpoint IDs shown, lower case
	changes []string
}

var _ hns.HNS = (*checkView)(nil)

var errCheckRefused = errors.New("check-hns: refused, the check only looks")

func (v *checkView) refuse(op, what string) error {
	v.changes = append(v.changes, op+" "+what)
	return hns.NewError(op, hns.CodeInvalidArg, errCheckRefused)
}

func (v *checkView) Version() (hns.Version, error)                { return v.hns.Version() }
func (v *checkView) ListNetworks() ([]hns.Network, error)         { return v.hns.ListNetworks() }
func (v *checkView) GetNetwork(name string) (*hns.Network, error) { return v.hns.GetNetwork(name) }

func (v *checkView) ListEndpoints(networkID string) ([]hns.Endpoint, error) {
	eps, err := v.hns.ListEndpoints(networkID)
	out := eps[:0:0]
	for _, ep := range eps {
		if v.eps[strings.ToLower(ep.ID)] {
			out = append(out, ep)
		}
	}
	return out, err
}

func (v *checkView) ListLoadBalancers() ([]hns.LoadBalancer, error) {
	lbs, err := v.hns.ListLoadBalancers()
	out := lbs[:0:0]
	for _, lb := range lbs {
		if v.lbs[strings.ToLower(lb.ID)] {
			out = append(out, lb)
		}
	}
	return out, err
}

func (v *checkView) CreateEndpoint(_ string, ep *hns.Endpoint) (*hns.Endpoint, error) {
	return nil, v.refuse(hns.OpCreateEndpoint, endpointString(ep))
}

func (v *checkView) DeleteEndpoint(id string) error { return v.refuse(hns.OpDeleteEndpoint, id) }

func (v *checkView) CreateLoadBalancer(lb *hns.LoadBalancer) (*hns.LoadBalancer, error) {
	return nil, v.refuse(hns.OpCreateLoadBalancer, lbString(lb))
}

func (v *checkView) UpdateLoadBalancer(id string, lb *hns.LoadBalancer) (*hns.LoadBalancer, error) {
	return nil, v.refuse(hns.OpUpdateLoadBalancer, id+" to "+lbString(lb))
}

func (v *checkView) DeleteLoadBalancer(id string) error {
	return v.refuse(hns.OpDeleteLoadBalancer, id)
}

func endpointString(ep *hns.Endpoint) string {
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

func lbString(lb *hns.LoadBalancer) string {
	vips := strings.Join(lb.FrontendVIPs, ",")
	if vips == "" {
		vips = "*"
	}
	var pm hns.PortMapping
	if len(lb.PortMappings) > 0 {
		pm = lb.PortMappings[0]
	}
	return fmt.Sprintf("%s %s:%d -> %d flags=%d pflags=%d dist=%d src=%s", plan.ProtocolName(pm.Protocol), vips, pm.ExternalPort,
		pm.InternalPort, lb.Flags, pm.Flags, pm.DistributionType, lb.SourceVIP)
}

// sourceVIP finds the source VIP of an overlay network for the check when
// none is given: Calico's endpoint, kproxy's source VIP endpoint, kproxy's
// reservation in the IPAM store, else one reserved in the pod CIDR given.
func (c *round) sourceVIP(listed *reconcile.State) (netip.Addr, string, error) {
	v6 := c.fam == v1.IPv6Protocol
	var calico, ours netip.Addr
	for ip, ep := range listed.Endpoints {
		switch {
		case ep.Remote || ip.Is6() != v6:
		case strings.EqualFold(ep.Name, windows.CalicoEndpointName):
			calico = ip
		case strings.HasPrefix(ep.Name, plan.EndpointNamePrefix+strings.ToLower(string(plan.RoleSourceVIP))+"-"):
			ours = ip
		}
	}
	switch {
	case calico.IsValid():
		return calico, "the " + windows.CalicoEndpointName + " endpoint", nil
	case ours.IsValid():
		return ours, "kproxy's source VIP endpoint on the network", nil
	}
	store, _ := windows.IPAMStore(c.cni, c.o.IPAMDataDir, c.network.Name)
	if c.o.ReservedSourceVIP != nil {
		ip, ok, err := c.o.ReservedSourceVIP(store, v6)
		if err != nil {
			return netip.Addr{}, "", fmt.Errorf("looking for kproxy's source VIP reservation: %w", err)
		}
		if ok {
			return ip, "kproxy's reservation in the IPAM store " + store, nil
		}
	}
	if len(c.o.PodCIDRs) == 0 {
		return netip.Addr{}, "", fmt.Errorf("%w: network %q is an overlay network and no source VIP was found (no %s endpoint, no kproxy source VIP endpoint or reservation in %s): pass --source-vip, or --pod-cidr (this node's podCIDR) to reserve one as kproxy does",
			plan.ErrNoSourceVIP, c.network.Name, windows.CalicoEndpointName, store)
	}
	opts := c.opts
	opts.ReserveSourceVIP = c.o.ReserveSourceVIP
	return windows.FindSourceVIP(&opts, store, listed, c.o.PodCIDRs)
}

// checkLocal is the local endpoint the check's Services use (invalid when
// the network has none): the lowest address of a CNI endpoint of the
// family, Calico's host endpoint aside.
func checkLocal(st *reconcile.State, fam v1.IPFamily) (netip.Addr, string) {
	var local netip.Addr
	var name string
	for ip, ep := range st.Endpoints {
		if !ep.Remote && !strings.EqualFold(ep.Name, windows.CalicoEndpointName) && ip.Is6() == (fam == v1.IPv6Protocol) &&
			(!local.IsValid() || ip.Less(local)) {
			local, name = ip, ep.Name
		}
	}
	return local, name
}

// cleanup deletes what the check created: its load balancers, then the
// endpoints it created.
func (c *round) cleanup(rec *reconcile.Record) {
	for _, slot := range reconcile.SortedSlots(rec.State.LoadBalancers) {
		lb := rec.State.LoadBalancers[slot]
		if _, ours := rec.Sent.LBs[strings.ToLower(lb.ID)]; !ours {
			continue
		}
		if err := c.h.DeleteLoadBalancer(lb.ID); err != nil && !hns.IsNotFound(err) {
			c.problem("cleanup: deleting load balancer %s (%s): %v", slot, lb.ID, err)
		}
	}
	ids := make([]string, 0, len(rec.Sent.EPs))
	for id := range rec.Sent.EPs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := c.h.DeleteEndpoint(id); err != nil && !hns.IsNotFound(err) {
			c.problem("cleanup: deleting endpoint %s: %v", id, err)
		}
	}
}

// checkSnapshot is the check's Services: one with a ClusterIP, a NodePort,
// an external IP and ClientIP affinity, backed by a remote endpoint and a
// local one when the network has one; and, with a local endpoint, a
// LoadBalancer with externalTrafficPolicy Local (DSR).
func checkSnapshot(o *Options, fam v1.IPFamily, n *hns.Network, st *reconcile.State) *proxy.Snapshot {
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
	eps := []proxy.Endpoint{{IP: remoteIP, Port: 8080, Ready: true, Serving: true, Where: proxy.At("other", "")}}
	if local.IsValid() {
		eps = append(eps, proxy.Endpoint{IP: local, Port: 8080, Ready: true, Serving: true, Where: proxy.At("this", ""), Local: true})
	}
	proxy.SortEndpoints(eps)
	main := &proxy.ServicePort{
		Name: name("nodeport"), Family: fam, Type: v1.ServiceTypeNodePort, ClusterIP: clusterIP, Port: 80,
		NodePort: o.NodePort, Protocol: v1.ProtocolTCP, ExternalIPs: []netip.Addr{externalIP},
		AffinityTimeoutSeconds: 10800, HasAnyEndpoints: true, ClusterEndpoints: eps,
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

// lastAddr returns the highest address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// compareObjects lists, field by field, what was sent for each object the
// check created and what HNS returned for it.
func compareObjects(fam v1.IPFamily, rec *reconcile.Record, eps []hns.Endpoint, lbs []hns.LoadBalancer) []Row {
	var rows []Row
	byID := make(map[string]*hns.Endpoint, len(eps))
	for i := range eps {
		byID[strings.ToLower(eps[i].ID)] = &eps[i]
	}
	ids := make([]string, 0, len(rec.Sent.EPs))
	for id := range rec.Sent.EPs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return rec.Sent.EPs[ids[i]].IP.Less(rec.Sent.EPs[ids[j]].IP) })
	f := string(fam)
	for _, id := range ids {
		s := rec.Sent.EPs[id]
		obj := "endpoint " + s.IP.String()
		got := byID[id]
		if got == nil {
			rows = append(rows, Row{f, obj, "ID", id, "(missing)"})
			continue
		}
		remote := func(r bool) string { return fmt.Sprint(r) }
		pa := ""
		if s.ProviderAddress.IsValid() {
			pa = s.ProviderAddress.String()
		}
		gotIP := ""
		if ips := got.IPs(); len(ips) > 0 {
			gotIP = ips[0].String()
		}
		rows = append(rows,
			Row{f, obj, "IpAddress", s.IP.String(), gotIP},
			Row{f, obj, "Name", s.Name, got.Name},
			Row{f, obj, "MacAddress", strings.ToLower(s.MAC), strings.ToLower(got.MacAddress)},
			Row{f, obj, "Flags.Remote", remote(s.Remote), remote(got.IsRemote())},
			Row{f, obj, "Policies.ProviderAddress", pa, got.ProviderAddress()},
		)
	}
	lbByID := make(map[string]*hns.LoadBalancer, len(lbs))
	for i := range lbs {
		lbByID[strings.ToLower(lbs[i].ID)] = &lbs[i]
	}
	lbIDs := make([]string, 0, len(rec.Sent.LBs))
	for id := range rec.Sent.LBs {
		lbIDs = append(lbIDs, id)
	}
	sort.Slice(lbIDs, func(i, j int) bool { return rec.Sent.LBs[lbIDs[i]].Slot() < rec.Sent.LBs[lbIDs[j]].Slot() })
	for _, id := range lbIDs {
		spec := rec.Sent.LBs[id]
		obj := "load balancer " + spec.Slot()
		got := lbByID[id]
		if got == nil {
			rows = append(rows, Row{f, obj, "ID", id, "(missing)"})
			continue
		}
		sent := spec.HNS(nil)
		pm, gpm := sent.PortMappings[0], hns.PortMapping{}
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
			if ep := rec.State.Endpoints[ip]; ep != nil {
				wantEPs = append(wantEPs, strings.ToLower(ep.ID))
			}
		}
		sort.Strings(wantEPs)
		gotEPs := make([]string, 0, len(got.HostComputeEndpoints))
		for _, e := range got.HostComputeEndpoints {
			gotEPs = append(gotEPs, strings.ToLower(e))
		}
		sort.Strings(gotEPs)
		rows = append(rows,
			Row{f, obj, "FrontendVIPs", strings.Join(sent.FrontendVIPs, ","), strings.Join(got.FrontendVIPs, ",")},
			Row{f, obj, "SourceVIP", sent.SourceVIP, got.SourceVIP},
			Row{f, obj, "Flags", num(uint64(sent.Flags)), num(uint64(got.Flags))},
			Row{f, obj, "HostComputeEndpoints", strings.Join(wantEPs, ","), strings.Join(gotEPs, ",")},
			Row{f, obj, "PortMappings.Protocol", num(uint64(pm.Protocol)), num(uint64(gpm.Protocol))},
			Row{f, obj, "PortMappings.InternalPort", num(uint64(pm.InternalPort)), num(uint64(gpm.InternalPort))},
			Row{f, obj, "PortMappings.ExternalPort", num(uint64(pm.ExternalPort)), num(uint64(gpm.ExternalPort))},
			Row{f, obj, "PortMappings.DistributionType", num(uint64(pm.DistributionType)), num(uint64(gpm.DistributionType))},
			Row{f, obj, "PortMappings.Flags", num(uint64(pm.Flags)), num(uint64(gpm.Flags))},
		)
	}
	return rows
}
