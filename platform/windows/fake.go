package windows

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// FakeHNS is an in-memory HNS that enforces what HNS enforces:
//   - a load balancer needs exactly one port mapping and at least one
//     endpoint, and every endpoint must exist (E_INVALIDARG, HCN_E_ENDPOINT_NOT_FOUND);
//   - one load balancer per family, protocol, frontend VIPs and external port
//     (HCN_E_PORT_ALREADY_EXISTS);
//   - one endpoint per address in a network (ERROR_ALREADY_EXISTS);
//   - an endpoint a load balancer refers to cannot be deleted (HCN_E_ENTITY_HAS_REFERENCES);
//   - deleting or updating what does not exist fails (ERROR_NOT_FOUND);
//   - UpdateLoadBalancer needs HNS 15.4 (E_NOTIMPL before); on exactly 15.4
//     it succeeds but keeps the old endpoints, as the real one does.
//
// It counts calls per operation and injects failures: the Nth call, a given
// operation, or an "HNS restarting" period. Out-of-band helpers (AddNetwork,
// AddLocalEndpoint, RemoveLoadBalancer, ...) act like the CNI or an operator
// and are not counted. Safe for concurrent use.
type FakeHNS struct {
	mu        sync.Mutex
	version   Version
	networks  map[string]*Network // by ID
	endpoints map[string]*Endpoint
	lbs       map[string]*LoadBalancer
	// Indexes, kept by the add/remove helpers below.
	epByID   map[string]string          // lower-case ID → key in endpoints
	epByAddr map[string]string          // network + "/" + address → endpoint key
	lbBySlot map[string]map[string]bool // slot → load balancer IDs
	nextID   int
	calls    map[string]int
	total    int
	failAt   map[int]error            // absolute call number → error
	failOp   map[string][]error       // operation → queued errors
	down     int                      // >0: the next down calls fail as "restarting"; <0: until Up
	hang     map[string]chan struct{} // operation → closed when the hung calls may return
	rejectLB func(*LoadBalancer) error
	rejectEP func(*Endpoint) error
	drops    EchoDrops
	onCall   func(op string)
}

var _ HNS = (*FakeHNS)(nil)

// NewFakeHNS returns an empty fake HNS of a version.
func NewFakeHNS(v Version) *FakeHNS {
	return &FakeHNS{
		version:   v,
		networks:  make(map[string]*Network),
		endpoints: make(map[string]*Endpoint),
		lbs:       make(map[string]*LoadBalancer),
		epByID:    make(map[string]string),
		epByAddr:  make(map[string]string),
		lbBySlot:  make(map[string]map[string]bool),
		calls:     make(map[string]int),
		failAt:    make(map[int]error),
		failOp:    make(map[string][]error),
	}
}

func (f *FakeHNS) newID() string {
	f.nextID++
	return fmt.Sprintf("00000000-0000-0000-0000-%012x", f.nextID)
}

func fakeErr(op string, code uint32, format string, args ...any) error {
	return NewError(op, code, fmt.Errorf(format, args...))
}

// ErrFakeRestarting is the error of calls made while the fake is "restarting".
var ErrFakeRestarting = errors.New("the HNS service is restarting")

// begin counts a call and returns an injected failure, if any. f.mu is held.
func (f *FakeHNS) begin(op string) error {
	f.calls[op]++
	f.total++
	if f.onCall != nil {
		f.onCall(op)
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
		return NewError(op, CodeManagerStopped, ErrFakeRestarting)
	}
	return nil
}

// --- indexes (f.mu held) ---

func (f *FakeHNS) putEndpoint(ep *Endpoint) {
	f.endpoints[ep.ID] = ep
	f.epByID[strings.ToLower(ep.ID)] = ep.ID
	for _, ip := range ep.IPs() {
		f.epByAddr[ep.HostComputeNetwork+"/"+ip.String()] = ep.ID
	}
}

func (f *FakeHNS) dropEndpoint(key string) {
	ep := f.endpoints[key]
	if ep == nil {
		return
	}
	delete(f.endpoints, key)
	delete(f.epByID, strings.ToLower(key))
	for _, ip := range ep.IPs() {
		if k := ep.HostComputeNetwork + "/" + ip.String(); f.epByAddr[k] == key {
			delete(f.epByAddr, k)
		}
	}
}

func (f *FakeHNS) putLB(lb *LoadBalancer) {
	if old := f.lbs[lb.ID]; old != nil {
		f.dropLB(lb.ID)
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

func (f *FakeHNS) dropLB(id string) {
	lb := f.lbs[id]
	if lb == nil {
		return
	}
	delete(f.lbs, id)
	if len(lb.PortMappings) > 0 {
		delete(f.lbBySlot[fakeSlot(lb)], id)
	}
}

// --- out-of-band changes (the CNI, an operator) ---

// AddNetwork adds a network and returns its ID (n.ID is used when set).
func (f *FakeHNS) AddNetwork(n Network) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n.ID == "" {
		n.ID = f.newID()
	}
	c := n
	c.RemoteSubnets = append([]RemoteSubnet(nil), n.RemoteSubnets...)
	f.networks[c.ID] = &c
	return c.ID
}

// SetRemoteSubnets replaces a network's remote subnet routes.
func (f *FakeHNS) SetRemoteSubnets(networkID string, rs []RemoteSubnet) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.networks[networkID]; n != nil {
		n.RemoteSubnets = append([]RemoteSubnet(nil), rs...)
	}
}

// RemoveNetwork deletes a network with its endpoints, as a CNI's cleanup
// does. Load balancers keep referring to the deleted endpoints.
func (f *FakeHNS) RemoveNetwork(networkID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
func (f *FakeHNS) RecreateNetwork(networkID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
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
func (f *FakeHNS) AddLocalEndpoint(networkID string, ip netip.Addr, name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID()
	f.putEndpoint(&Endpoint{
		ID: id, Name: name, HostComputeNetwork: networkID,
		IPConfigurations: []IPConfig{{IPAddress: ip.String()}},
		MacAddress:       fmt.Sprintf("00-15-5d-%02x-%02x-%02x", f.nextID>>16&0xff, f.nextID>>8&0xff, f.nextID&0xff),
	})
	return id
}

// AddEndpoint adds any endpoint without checks (a leftover) and returns its ID.
func (f *FakeHNS) AddEndpoint(ep Endpoint) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ep.ID == "" {
		ep.ID = f.newID()
	}
	f.putEndpoint(cloneEndpoint(&ep))
	return ep.ID
}

// RemoveEndpoint deletes an endpoint out of band, without checks.
func (f *FakeHNS) RemoveEndpoint(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropEndpoint(f.endpointKey(id))
}

// AddLoadBalancer adds a load balancer without checks (a leftover, possibly
// malformed) and returns its ID.
func (f *FakeHNS) AddLoadBalancer(lb LoadBalancer) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if lb.ID == "" {
		lb.ID = f.newID()
	}
	f.putLB(cloneLB(&lb))
	return lb.ID
}

// RemoveLoadBalancer deletes a load balancer out of band.
func (f *FakeHNS) RemoveLoadBalancer(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLB(id)
}

// LoadBalancers returns copies of every load balancer, sorted by ID.
func (f *FakeHNS) LoadBalancers() []LoadBalancer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listLBs()
}

// Endpoints returns copies of every endpoint, sorted by ID.
func (f *FakeHNS) Endpoints() []Endpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Endpoint, 0, len(f.endpoints))
	for _, ep := range f.endpoints {
		out = append(out, *cloneEndpoint(ep))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Dump renders the load balancers and endpoints with endpoints named by
// address instead of ID, sorted: stable across runs for golden comparisons.
func (f *FakeHNS) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr := func(id string) string {
		if ep := f.endpoints[id]; ep != nil && len(ep.IPConfigurations) > 0 {
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
		pm := PortMapping{}
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
		lines = append(lines, line+" eps="+strings.Join(eps, ","))
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

// --- HNS ---

// Version implements HNS.
func (f *FakeHNS) Version() (Version, error) {
	f.wait(OpVersion)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpVersion); err != nil {
		return Version{}, err
	}
	return f.version, nil
}

// ListNetworks implements HNS.
func (f *FakeHNS) ListNetworks() ([]Network, error) {
	f.wait(OpListNetworks)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpListNetworks); err != nil {
		return nil, err
	}
	out := make([]Network, 0, len(f.networks))
	for _, n := range f.networks {
		c := *n
		c.RemoteSubnets = append([]RemoteSubnet(nil), n.RemoteSubnets...)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// GetNetwork implements HNS.
func (f *FakeHNS) GetNetwork(name string) (*Network, error) {
	f.wait(OpGetNetwork)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpGetNetwork); err != nil {
		return nil, err
	}
	for _, n := range f.networks {
		if strings.EqualFold(n.Name, name) {
			c := *n
			c.RemoteSubnets = append([]RemoteSubnet(nil), n.RemoteSubnets...)
			return &c, nil
		}
	}
	return nil, fakeErr(OpGetNetwork, CodeNetworkNotFound, "network %q not found", name)
}

// ListEndpoints implements HNS.
func (f *FakeHNS) ListEndpoints(networkID string) ([]Endpoint, error) {
	f.wait(OpListEndpoints)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpListEndpoints); err != nil {
		return nil, err
	}
	if f.networks[networkID] == nil {
		return nil, fakeErr(OpListEndpoints, CodeNetworkNotFound, "network %s not found", networkID)
	}
	var out []Endpoint
	for _, ep := range f.endpoints {
		if ep.HostComputeNetwork == networkID {
			out = append(out, *f.readEndpoint(ep))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// CreateEndpoint implements HNS.
func (f *FakeHNS) CreateEndpoint(networkID string, ep *Endpoint) (*Endpoint, error) {
	f.wait(OpCreateEndpoint)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpCreateEndpoint); err != nil {
		return nil, err
	}
	if f.networks[networkID] == nil {
		return nil, fakeErr(OpCreateEndpoint, CodeNetworkNotFound, "network %s not found", networkID)
	}
	ips := ep.IPs()
	if len(ips) == 0 {
		return nil, fakeErr(OpCreateEndpoint, CodeInvalidArg, "endpoint without a valid IP address")
	}
	if f.rejectEP != nil {
		if err := f.rejectEP(ep); err != nil {
			return nil, err
		}
	}
	for _, a := range ips {
		if other, ok := f.epByAddr[networkID+"/"+a.String()]; ok {
			return nil, fakeErr(OpCreateEndpoint, CodeAlreadyExists, "address %s is used by endpoint %s", a, other)
		}
	}
	c := cloneEndpoint(ep)
	c.ID = f.newID()
	c.HostComputeNetwork = networkID
	f.putEndpoint(c)
	return f.readEndpoint(c), nil
}

// DeleteEndpoint implements HNS.
func (f *FakeHNS) DeleteEndpoint(id string) error {
	f.wait(OpDeleteEndpoint)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpDeleteEndpoint); err != nil {
		return err
	}
	key := f.endpointKey(id)
	if key == "" {
		return fakeErr(OpDeleteEndpoint, CodeEndpointNotFound, "endpoint %s not found", id)
	}
	for _, lb := range f.lbs {
		for _, ref := range lb.HostComputeEndpoints {
			if strings.EqualFold(ref, id) {
				return fakeErr(OpDeleteEndpoint, CodeEntityHasReferences, "endpoint %s is used by load balancer %s", id, lb.ID)
			}
		}
	}
	f.dropEndpoint(key)
	return nil
}

func (f *FakeHNS) endpointKey(id string) string { return f.epByID[strings.ToLower(id)] }

// ListLoadBalancers implements HNS.
func (f *FakeHNS) ListLoadBalancers() ([]LoadBalancer, error) {
	f.wait(OpListLoadBalancers)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpListLoadBalancers); err != nil {
		return nil, err
	}
	out := f.listLBs()
	for i := range out {
		out[i] = *f.readLB(&out[i])
	}
	return out, nil
}

func (f *FakeHNS) listLBs() []LoadBalancer {
	out := make([]LoadBalancer, 0, len(f.lbs))
	for _, lb := range f.lbs {
		out = append(out, *cloneLB(lb))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// fakeSlot is the frontend a load balancer occupies.
func fakeSlot(lb *LoadBalancer) string {
	vips := append([]string(nil), lb.FrontendVIPs...)
	sort.Strings(vips)
	pm := lb.PortMappings[0]
	return strconv.Itoa(int(lb.Flags&LBFlagIPv6)) + "/" + strconv.Itoa(int(pm.Protocol)) + "/" +
		strconv.Itoa(int(pm.ExternalPort)) + "/" + strings.Join(vips, ",")
}

// validateLB checks a load balancer as HNS would; skipID is the load balancer
// being updated.
func (f *FakeHNS) validateLB(op string, lb *LoadBalancer, skipID string) error {
	if len(lb.PortMappings) != 1 {
		return fakeErr(op, CodeInvalidArg, "load balancer needs one port mapping, has %d", len(lb.PortMappings))
	}
	if len(lb.HostComputeEndpoints) == 0 {
		return fakeErr(op, CodeInvalidArg, "load balancer without endpoints")
	}
	for _, v := range lb.FrontendVIPs {
		if _, err := netip.ParseAddr(v); err != nil {
			return fakeErr(op, CodeInvalidArg, "frontend VIP %q: %v", v, err)
		}
	}
	for _, id := range lb.HostComputeEndpoints {
		if f.endpointKey(id) == "" {
			return fakeErr(op, CodeEndpointNotFound, "endpoint %s not found", id)
		}
	}
	for other := range f.lbBySlot[fakeSlot(lb)] {
		if other != skipID {
			return fakeErr(op, CodePortAlreadyExists, "port already used by load balancer %s", other)
		}
	}
	if f.rejectLB != nil {
		if err := f.rejectLB(lb); err != nil {
			return err
		}
	}
	return nil
}

// CreateLoadBalancer implements HNS.
func (f *FakeHNS) CreateLoadBalancer(lb *LoadBalancer) (*LoadBalancer, error) {
	f.wait(OpCreateLoadBalancer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpCreateLoadBalancer); err != nil {
		return nil, err
	}
	if err := f.validateLB(OpCreateLoadBalancer, lb, ""); err != nil {
		return nil, err
	}
	c := cloneLB(lb)
	c.ID = f.newID()
	f.putLB(c)
	return f.readLB(c), nil
}

// UpdateLoadBalancer implements HNS.
func (f *FakeHNS) UpdateLoadBalancer(id string, lb *LoadBalancer) (*LoadBalancer, error) {
	f.wait(OpUpdateLoadBalancer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpUpdateLoadBalancer); err != nil {
		return nil, err
	}
	if !f.version.AtLeast(15, 4) {
		return nil, fakeErr(OpUpdateLoadBalancer, CodeNotImplemented, "not implemented")
	}
	old := f.lbs[id]
	if old == nil {
		return nil, fakeErr(OpUpdateLoadBalancer, CodeNotFound, "load balancer %s not found", id)
	}
	if err := f.validateLB(OpUpdateLoadBalancer, lb, id); err != nil {
		return nil, err
	}
	c := cloneLB(lb)
	c.ID = id
	if f.version.Major == 15 && f.version.Minor == 4 {
		c.HostComputeEndpoints = old.HostComputeEndpoints // the 15.4 bug
	}
	f.putLB(c)
	return f.readLB(c), nil
}

// DeleteLoadBalancer implements HNS.
func (f *FakeHNS) DeleteLoadBalancer(id string) error {
	f.wait(OpDeleteLoadBalancer)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpDeleteLoadBalancer); err != nil {
		return err
	}
	if f.lbs[id] == nil {
		return fakeErr(OpDeleteLoadBalancer, CodeNotFound, "load balancer %s not found", id)
	}
	f.dropLB(id)
	return nil
}

func cloneLB(lb *LoadBalancer) *LoadBalancer {
	c := *lb
	c.HostComputeEndpoints = append([]string(nil), lb.HostComputeEndpoints...)
	c.FrontendVIPs = append([]string(nil), lb.FrontendVIPs...)
	c.PortMappings = append([]PortMapping(nil), lb.PortMappings...)
	return &c
}

func cloneEndpoint(ep *Endpoint) *Endpoint {
	c := *ep
	c.IPConfigurations = append([]IPConfig(nil), ep.IPConfigurations...)
	c.Policies = append([]EndpointPolicy(nil), ep.Policies...)
	return &c
}
