// Package fakehns is an in-memory HNS (hns.HNS) that enforces what a real
// HNS enforces and behaves as a real one does where kproxy must cope with
// it (see Fake). Tests of the Windows backend run against it, on Linux and
// under Wine; `kproxy check-hns --fake` runs against it on any OS.
package fakehns

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/platform/windows/hns"
)

// Fake is an in-memory HNS that enforces what HNS enforces:
//   - a load balancer needs exactly one port mapping and at least one
//     endpoint, and every endpoint must exist (E_INVALIDARG, HCN_E_ENDPOINT_NOT_FOUND);
//   - one load balancer per family, protocol, frontend VIPs and external port
//     (HCN_E_PORT_ALREADY_EXISTS), and none on a port a host socket holds
//     (HoldHostPort: the same code, as WS2019 answers when the port is
//     reserved in the TCP/IP stack);
//   - one endpoint per address in a network (ERROR_ALREADY_EXISTS);
//   - an endpoint a load balancer refers to cannot be deleted (HCN_E_ENTITY_HAS_REFERENCES);
//   - deleting or updating what does not exist fails (ERROR_NOT_FOUND);
//   - UpdateLoadBalancer needs HNS 15.4 (E_NOTIMPL before); on exactly 15.4
//     it succeeds but keeps the old endpoints, as the real one does.
//
// It answers as a real HNS does where that differs from what was sent:
//   - IDs are upper-case GUIDs; a load balancer lists its endpoints by
//     their upper-case IDs whatever case they were given in, and an
//     endpoint names its network in lower case (callers must compare IDs
//     without regard to case, as upstream does);
//   - the endpoints of a network that does not exist are an empty list,
//     not an error;
//   - fields can be left out of what it returns (DropOnRead) or returned
//     with another value (RewriteOnRead);
//   - a creation can fail half-way and leave a partly created load
//     balancer that holds its port but lists without port mapping or
//     endpoints (CreatePartially);
//   - a restart loses the load balancers and remote endpoints (Restart),
//     and can restore them later under their old IDs (RestartRestoring),
//     as HNS's own rehydration does;
//   - "restarting" (HCN_E_MANAGER_STOPPED, Down) and "not running"
//     (RPC_S_UNKNOWN_IF 0x6b5, StopService) periods.
//
// It counts calls per operation and injects failures: the Nth call, a given
// operation, or a period without HNS. Out-of-band helpers (AddNetwork,
// AddLocalEndpoint, RemoveLoadBalancer, ...) act like the CNI or an operator
// and are not counted. Safe for concurrent use.
type Fake struct {
	mu        sync.Mutex
	version   hns.Version
	networks  map[string]*hns.Network // by upper-case ID
	endpoints map[string]*hns.Endpoint
	lbs       map[string]*hns.LoadBalancer
	partial   map[string]bool // IDs of partly created load balancers
	// Indexes, kept by the put/drop helpers below (keys upper case).
	epByAddr  map[string]string          // network ID + "/" + address → endpoint ID
	lbBySlot  map[string]map[string]bool // slot → load balancer IDs
	hostPorts map[hostPort]bool
	nextID    int
	calls     map[string]int
	total     int
	failAt    map[int]error      // absolute call number → error
	failOp    map[string][]error // operation → queued errors
	// down > 0: the next down calls fail with downCode; < 0: until Up.
	down     int
	downCode uint32
	hang     map[string]chan struct{} // operation → closed when the hung calls may return
	rejectLB func(*hns.LoadBalancer) error
	rejectEP func(*hns.Endpoint) error
	drops    hns.Fields
	rewrites []Rewrite
	// partialLeft creations still to fail half-way, with partialErr.
	partialLeft int
	partialErr  error
	restore     *restoring
	onCall      func(op string)
}

var _ hns.HNS = (*Fake)(nil)

type hostPort struct {
	protocol uint32
	port     uint16
}

// restoring holds what a restart took away, until HNS brings it back.
type restoring struct {
	after int // calls to begin before the objects come back
	lbs   []*hns.LoadBalancer
	eps   []*hns.Endpoint
}

// New returns an empty fake HNS of a version.
func New(v hns.Version) *Fake {
	return &Fake{
		version:   v,
		networks:  make(map[string]*hns.Network),
		endpoints: make(map[string]*hns.Endpoint),
		lbs:       make(map[string]*hns.LoadBalancer),
		partial:   make(map[string]bool),
		epByAddr:  make(map[string]string),
		lbBySlot:  make(map[string]map[string]bool),
		hostPorts: make(map[hostPort]bool),
		calls:     make(map[string]int),
		failAt:    make(map[int]error),
		failOp:    make(map[string][]error),
	}
}

// newID returns an upper-case GUID, as HNS returns its IDs.
func (f *Fake) newID() string {
	f.nextID++
	return fmt.Sprintf("%08X-0000-4000-8000-%012X", f.nextID, f.nextID)
}

func key(id string) string { return strings.ToUpper(id) }

func fakeErr(op string, code uint32, format string, args ...any) error {
	return hns.NewError(op, code, fmt.Errorf(format, args...))
}

// ErrFakeRestarting is the error of calls made while the fake is "restarting".
var ErrFakeRestarting = errors.New("the HNS service is restarting")

// ErrFakeNotRunning is the error of calls made while the fake "is not running".
var ErrFakeNotRunning = errors.New("hcn call failed: The interface is unknown. (0x6b5)")

// begin counts a call and returns an injected failure, if any. f.mu is held.
func (f *Fake) begin(op string) error {
	f.calls[op]++
	f.total++
	if f.onCall != nil {
		f.onCall(op)
	}
	if r := f.restore; r != nil {
		if r.after--; r.after <= 0 {
			f.restore = nil
			for _, ep := range r.eps {
				if f.networks[key(ep.HostComputeNetwork)] != nil {
					f.putEndpoint(ep)
				}
			}
			for _, lb := range r.lbs {
				f.putLB(lb)
			}
		}
	}
	if err, ok := f.failAt[f.total]; ok {
		delete(f.failAt, f.total)
		return err
	}
	if q := f.failOp[op]; len(q) > 0 {
		f.failOp[op] = q[1:]
		return q[0]
	}
	if f.down != 0 {
		if f.down > 0 {
			f.down--
		}
		if f.downCode == hns.CodeRPCUnknownInterface {
			return hns.NewError(op, f.downCode, ErrFakeNotRunning)
		}
		return hns.NewError(op, f.downCode, ErrFakeRestarting)
	}
	return nil
}

// --- indexes (f.mu held) ---

func (f *Fake) putEndpoint(ep *hns.Endpoint) {
	ep.ID = key(ep.ID)
	ep.HostComputeNetwork = key(ep.HostComputeNetwork)
	f.endpoints[ep.ID] = ep
	for _, ip := range ep.IPs() {
		f.epByAddr[ep.HostComputeNetwork+"/"+ip.String()] = ep.ID
	}
}

func (f *Fake) dropEndpoint(id string) {
	id = key(id)
	ep := f.endpoints[id]
	if ep == nil {
		return
	}
	delete(f.endpoints, id)
	for _, ip := range ep.IPs() {
		if k := ep.HostComputeNetwork + "/" + ip.String(); f.epByAddr[k] == id {
			delete(f.epByAddr, k)
		}
	}
}

func (f *Fake) putLB(lb *hns.LoadBalancer) {
	lb.ID = key(lb.ID)
	if old := f.lbs[lb.ID]; old != nil {
		f.dropLB(lb.ID)
	}
	for i, id := range lb.HostComputeEndpoints {
		lb.HostComputeEndpoints[i] = key(id)
	}
	f.lbs[lb.ID] = lb
	if len(lb.PortMappings) > 0 {
		slot := fakeSlot(lb)
		if f.lbBySlot[slot] == nil {
			f.lbBySlot[slot] = make(map[string]bool)
		}
		f.lbBySlot[slot][lb.ID] = true
	}
}

func (f *Fake) dropLB(id string) {
	id = key(id)
	lb := f.lbs[id]
	if lb == nil {
		return
	}
	delete(f.lbs, id)
	delete(f.partial, id)
	if len(lb.PortMappings) > 0 {
		delete(f.lbBySlot[fakeSlot(lb)], id)
	}
}

// --- out-of-band changes (the CNI, an operator) ---

// AddNetwork adds a network and returns its ID (n.ID is used when set).
func (f *Fake) AddNetwork(n hns.Network) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n.ID == "" {
		n.ID = f.newID()
	}
	c := n
	c.ID = key(n.ID)
	c.RemoteSubnets = append([]hns.RemoteSubnet(nil), n.RemoteSubnets...)
	f.networks[c.ID] = &c
	return c.ID
}

// SetRemoteSubnets replaces a network's remote subnet routes.
func (f *Fake) SetRemoteSubnets(networkID string, rs []hns.RemoteSubnet) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.networks[key(networkID)]; n != nil {
		n.RemoteSubnets = append([]hns.RemoteSubnet(nil), rs...)
	}
}

// RemoveNetwork deletes a network with its endpoints, as a CNI's cleanup
// does. Load balancers keep referring to the deleted endpoints.
func (f *Fake) RemoveNetwork(networkID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	networkID = key(networkID)
	delete(f.networks, networkID)
	for id, ep := range f.endpoints {
		if ep.HostComputeNetwork == networkID {
			f.dropEndpoint(id)
		}
	}
}

// RecreateNetwork deletes a network with its endpoints and creates it again
// under a new ID, as a CNI does on restart. Load balancers keep referring to
// the deleted endpoints. It returns the new ID.
func (f *Fake) RecreateNetwork(networkID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	networkID = key(networkID)
	n := f.networks[networkID]
	if n == nil {
		return ""
	}
	delete(f.networks, networkID)
	for id, ep := range f.endpoints {
		if ep.HostComputeNetwork == networkID {
			f.dropEndpoint(id)
		}
	}
	c := *n
	c.ID = f.newID()
	f.networks[c.ID] = &c
	return c.ID
}

// AddLocalEndpoint adds a local endpoint, as the CNI does for a pod, and
// returns its ID.
func (f *Fake) AddLocalEndpoint(networkID string, ip netip.Addr, name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID()
	f.putEndpoint(&hns.Endpoint{
		ID: id, Name: name, HostComputeNetwork: networkID,
		IPConfigurations: []hns.IPConfig{{IPAddress: ip.String()}},
		MacAddress:       fmt.Sprintf("00-15-5D-%02X-%02X-%02X", f.nextID>>16&0xff, f.nextID>>8&0xff, f.nextID&0xff),
	})
	return id
}

// AddEndpoint adds any endpoint without checks (a leftover) and returns its ID.
func (f *Fake) AddEndpoint(ep hns.Endpoint) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ep.ID == "" {
		ep.ID = f.newID()
	}
	c := cloneEndpoint(&ep)
	f.putEndpoint(c)
	return c.ID
}

// RemoveEndpoint deletes an endpoint out of band, without checks.
func (f *Fake) RemoveEndpoint(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropEndpoint(id)
}

// AddLoadBalancer adds a load balancer without checks (a leftover, possibly
// malformed) and returns its ID.
func (f *Fake) AddLoadBalancer(lb hns.LoadBalancer) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if lb.ID == "" {
		lb.ID = f.newID()
	}
	c := cloneLB(&lb)
	f.putLB(c)
	return c.ID
}

// RemoveLoadBalancer deletes a load balancer out of band.
func (f *Fake) RemoveLoadBalancer(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLB(id)
}

// HoldHostPort makes a host socket hold a port: creating or updating a
// load balancer of that protocol and external port fails with
// HCN_E_PORT_ALREADY_EXISTS until ReleaseHostPort, as on Windows Server
// 2019 when the port is reserved in the TCP/IP stack (a health check load
// balancer on the port the proxy's own health server listens on).
func (f *Fake) HoldHostPort(protocol uint32, port uint16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hostPorts[hostPort{protocol, port}] = true
}

// ReleaseHostPort undoes HoldHostPort.
func (f *Fake) ReleaseHostPort(protocol uint32, port uint16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.hostPorts, hostPort{protocol, port})
}

// LoadBalancers returns copies of every load balancer as stored, sorted by ID.
func (f *Fake) LoadBalancers() []hns.LoadBalancer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listLBs()
}

// Endpoints returns copies of every endpoint as stored, sorted by ID.
func (f *Fake) Endpoints() []hns.Endpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]hns.Endpoint, 0, len(f.endpoints))
	for _, ep := range f.endpoints {
		out = append(out, *cloneEndpoint(ep))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Dump renders the load balancers and endpoints as stored, with endpoints
// named by address instead of ID, sorted: stable across runs for golden
// comparisons. A partly created load balancer is marked "partial".
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr := func(id string) string {
		if ep := f.endpoints[key(id)]; ep != nil && len(ep.IPConfigurations) > 0 {
			return ep.IPConfigurations[0].IPAddress
		}
		return "missing:" + id
	}
	var lines []string
	for _, lb := range f.lbs {
		var eps []string
		for _, id := range lb.HostComputeEndpoints {
			eps = append(eps, addr(id))
		}
		sort.Slice(eps, func(i, j int) bool { return addrLess(eps[i], eps[j]) })
		pm := hns.PortMapping{}
		if len(lb.PortMappings) > 0 {
			pm = lb.PortMappings[0]
		}
		vips := strings.Join(lb.FrontendVIPs, ",")
		if vips == "" {
			vips = "*"
		}
		line := fmt.Sprintf("lb %s %s:%d -> %d flags=%d pflags=%d dist=%d", protocolName(pm.Protocol), vips,
			pm.ExternalPort, pm.InternalPort, lb.Flags, pm.Flags, pm.DistributionType)
		if lb.SourceVIP != "" {
			line += " src=" + lb.SourceVIP
		}
		line += " eps=" + strings.Join(eps, ",")
		if f.partial[lb.ID] {
			line += " partial"
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	var eps []string
	for _, ep := range f.endpoints {
		kind := "local"
		if ep.IsRemote() {
			kind = "remote"
		}
		var ips []string
		for _, c := range ep.IPConfigurations {
			ips = append(ips, c.IPAddress)
		}
		line := fmt.Sprintf("ep %s %s", strings.Join(ips, ","), kind)
		if pa := ep.ProviderAddress(); pa != "" {
			line += " pa=" + pa
		}
		if ep.Name != "" {
			line += " name=" + ep.Name
		}
		eps = append(eps, line)
	}
	sort.Slice(eps, func(i, j int) bool { return addrLess(strings.Fields(eps[i])[1], strings.Fields(eps[j])[1]) })
	return strings.Join(append(lines, eps...), "\n") + "\n"
}

func addrLess(a, b string) bool {
	x, err1 := netip.ParseAddr(strings.Split(a, ",")[0])
	y, err2 := netip.ParseAddr(strings.Split(b, ",")[0])
	if err1 != nil || err2 != nil {
		return a < b
	}
	return x.Less(y)
}

func protocolName(p uint32) string {
	switch p {
	case hns.ProtocolTCP:
		return "TCP"
	case hns.ProtocolUDP:
		return "UDP"
	case hns.ProtocolSCTP:
		return "SCTP"
	}
	return "proto" + strconv.Itoa(int(p))
}

// --- HNS ---

// Version implements hns.HNS.
func (f *Fake) Version() (hns.Version, error) {
	f.wait(hns.OpVersion)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpVersion); err != nil {
		return hns.Version{}, err
	}
	return f.version, nil
}

// ListNetworks implements hns.HNS.
func (f *Fake) ListNetworks() ([]hns.Network, error) {
	f.wait(hns.OpListNetworks)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpListNetworks); err != nil {
		return nil, err
	}
	out := make([]hns.Network, 0, len(f.networks))
	for _, n := range f.networks {
		c := *n
		c.RemoteSubnets = append([]hns.RemoteSubnet(nil), n.RemoteSubnets...)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// GetNetwork implements hns.HNS.
func (f *Fake) GetNetwork(name string) (*hns.Network, error) {
	f.wait(hns.OpGetNetwork)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpGetNetwork); err != nil {
		return nil, err
	}
	for _, n := range f.networks {
		if strings.EqualFold(n.Name, name) {
			c := *n
			c.RemoteSubnets = append([]hns.RemoteSubnet(nil), n.RemoteSubnets...)
			return &c, nil
		}
	}
	return nil, fakeErr(hns.OpGetNetwork, hns.CodeNetworkNotFound, "network %q not found", name)
}

// ListEndpoints implements hns.HNS. As HNS does, a network that does not
// exist has no endpoints (an empty list, not an error).
func (f *Fake) ListEndpoints(networkID string) ([]hns.Endpoint, error) {
	f.wait(hns.OpListEndpoints)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpListEndpoints); err != nil {
		return nil, err
	}
	networkID = key(networkID)
	out := []hns.Endpoint{}
	for _, ep := range f.endpoints {
		if ep.HostComputeNetwork == networkID {
			out = append(out, *f.readEndpoint(ep))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// CreateEndpoint implements hns.HNS.
func (f *Fake) CreateEndpoint(networkID string, ep *hns.Endpoint) (*hns.Endpoint, error) {
	f.wait(hns.OpCreateEndpoint)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpCreateEndpoint); err != nil {
		return nil, err
	}
	networkID = key(networkID)
	if f.networks[networkID] == nil {
		return nil, fakeErr(hns.OpCreateEndpoint, hns.CodeNetworkNotFound, "network %s not found", networkID)
	}
	ips := ep.IPs()
	if len(ips) == 0 {
		return nil, fakeErr(hns.OpCreateEndpoint, hns.CodeInvalidArg, "endpoint without a valid IP address")
	}
	if f.rejectEP != nil {
		if err := f.rejectEP(ep); err != nil {
			return nil, err
		}
	}
	for _, a := range ips {
		if other, ok := f.epByAddr[networkID+"/"+a.String()]; ok {
			return nil, fakeErr(hns.OpCreateEndpoint, hns.CodeAlreadyExists, "address %s is used by endpoint %s", a, other)
		}
	}
	c := cloneEndpoint(ep)
	c.ID = f.newID()
	c.HostComputeNetwork = networkID
	f.putEndpoint(c)
	return f.readEndpoint(c), nil
}

// DeleteEndpoint implements hns.HNS.
func (f *Fake) DeleteEndpoint(id string) error {
	f.wait(hns.OpDeleteEndpoint)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpDeleteEndpoint); err != nil {
		return err
	}
	id = key(id)
	if f.endpoints[id] == nil {
		return fakeErr(hns.OpDeleteEndpoint, hns.CodeEndpointNotFound, "endpoint %s not found", id)
	}
	for _, lb := range f.lbs {
		for _, ref := range lb.HostComputeEndpoints {
			if ref == id {
				return fakeErr(hns.OpDeleteEndpoint, hns.CodeEntityHasReferences, "endpoint %s is used by load balancer %s", id, lb.ID)
			}
		}
	}
	f.dropEndpoint(id)
	return nil
}

// ListLoadBalancers implements hns.HNS.
func (f *Fake) ListLoadBalancers() ([]hns.LoadBalancer, error) {
	f.wait(hns.OpListLoadBalancers)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpListLoadBalancers); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(f.lbs))
	for id := range f.lbs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]hns.LoadBalancer, 0, len(ids))
	for _, id := range ids {
		out = append(out, *f.readLB(f.lbs[id]))
	}
	return out, nil
}

func (f *Fake) listLBs() []hns.LoadBalancer {
	out := make([]hns.LoadBalancer, 0, len(f.lbs))
	for _, lb := range f.lbs {
		out = append(out, *cloneLB(lb))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// fakeSlot is the frontend a load balancer occupies.
func fakeSlot(lb *hns.LoadBalancer) string {
	vips := make([]string, 0, len(lb.FrontendVIPs))
	for _, v := range lb.FrontendVIPs {
		if a, err := netip.ParseAddr(v); err == nil {
			v = a.Unmap().String()
		}
		vips = append(vips, v)
	}
	sort.Strings(vips)
	pm := lb.PortMappings[0]
	return strconv.Itoa(int(lb.Flags&hns.LBFlagIPv6)) + "/" + strconv.Itoa(int(pm.Protocol)) + "/" +
		strconv.Itoa(int(pm.ExternalPort)) + "/" + strings.Join(vips, ",")
}

// validateLB checks a load balancer as HNS would; skipID is the load balancer
// being updated.
func (f *Fake) validateLB(op string, lb *hns.LoadBalancer, skipID string) error {
	if len(lb.PortMappings) != 1 {
		return fakeErr(op, hns.CodeInvalidArg, "load balancer needs one port mapping, has %d", len(lb.PortMappings))
	}
	if len(lb.HostComputeEndpoints) == 0 {
		return fakeErr(op, hns.CodeInvalidArg, "load balancer without endpoints")
	}
	for _, v := range lb.FrontendVIPs {
		if _, err := netip.ParseAddr(v); err != nil {
			return fakeErr(op, hns.CodeInvalidArg, "frontend VIP %q: %v", v, err)
		}
	}
	for _, id := range lb.HostComputeEndpoints {
		if f.endpoints[key(id)] == nil {
			return fakeErr(op, hns.CodeEndpointNotFound, "endpoint %s not found", id)
		}
	}
	pm := lb.PortMappings[0]
	if f.hostPorts[hostPort{pm.Protocol, pm.ExternalPort}] {
		return fakeErr(op, hns.CodePortAlreadyExists, "The specified port already exists: %s port %d is held by a host socket", protocolName(pm.Protocol), pm.ExternalPort)
	}
	for other := range f.lbBySlot[fakeSlot(lb)] {
		if other != key(skipID) {
			return fakeErr(op, hns.CodePortAlreadyExists, "The specified port already exists: used by load balancer %s", other)
		}
	}
	if f.rejectLB != nil {
		if err := f.rejectLB(lb); err != nil {
			return err
		}
	}
	return nil
}

// CreateLoadBalancer implements hns.HNS.
func (f *Fake) CreateLoadBalancer(lb *hns.LoadBalancer) (*hns.LoadBalancer, error) {
	f.wait(hns.OpCreateLoadBalancer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpCreateLoadBalancer); err != nil {
		return nil, err
	}
	if err := f.validateLB(hns.OpCreateLoadBalancer, lb, ""); err != nil {
		return nil, err
	}
	c := cloneLB(lb)
	c.ID = f.newID()
	if f.partialLeft > 0 {
		// Half-way: the object exists and holds its port, without its
		// endpoints; the caller is told the creation failed.
		f.partialLeft--
		c.HostComputeEndpoints = nil
		f.putLB(c)
		f.partial[c.ID] = true
		return nil, f.partialErr
	}
	f.putLB(c)
	return f.readLB(c), nil
}

// UpdateLoadBalancer implements hns.HNS.
func (f *Fake) UpdateLoadBalancer(id string, lb *hns.LoadBalancer) (*hns.LoadBalancer, error) {
	f.wait(hns.OpUpdateLoadBalancer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpUpdateLoadBalancer); err != nil {
		return nil, err
	}
	if !f.version.AtLeast(15, 4) {
		return nil, fakeErr(hns.OpUpdateLoadBalancer, hns.CodeNotImplemented, "not implemented")
	}
	id = key(id)
	old := f.lbs[id]
	if old == nil {
		return nil, fakeErr(hns.OpUpdateLoadBalancer, hns.CodeNotFound, "load balancer %s not found", id)
	}
	if err := f.validateLB(hns.OpUpdateLoadBalancer, lb, id); err != nil {
		return nil, err
	}
	c := cloneLB(lb)
	c.ID = id
	if f.version.Major == 15 && f.version.Minor == 4 {
		c.HostComputeEndpoints = append([]string(nil), old.HostComputeEndpoints...) // the 15.4 bug
	}
	delete(f.partial, id)
	f.putLB(c)
	return f.readLB(c), nil
}

// DeleteLoadBalancer implements hns.HNS.
func (f *Fake) DeleteLoadBalancer(id string) error {
	f.wait(hns.OpDeleteLoadBalancer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(hns.OpDeleteLoadBalancer); err != nil {
		return err
	}
	if f.lbs[key(id)] == nil {
		return fakeErr(hns.OpDeleteLoadBalancer, hns.CodeNotFound, "load balancer %s not found", id)
	}
	f.dropLB(id)
	return nil
}

func cloneLB(lb *hns.LoadBalancer) *hns.LoadBalancer {
	c := *lb
	c.HostComputeEndpoints = append([]string(nil), lb.HostComputeEndpoints...)
	c.FrontendVIPs = append([]string(nil), lb.FrontendVIPs...)
	c.PortMappings = append([]hns.PortMapping(nil), lb.PortMappings...)
	return &c
}

func cloneEndpoint(ep *hns.Endpoint) *hns.Endpoint {
	c := *ep
	c.IPConfigurations = append([]hns.IPConfig(nil), ep.IPConfigurations...)
	c.Policies = append([]hns.EndpointPolicy(nil), ep.Policies...)
	return &c
}
