package fakehns

import (
	"slices"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/platform/windows/hns"
)

// Fault injection for tests: failures, hangs, rejections, and fields left
// out of what the fake returns or returned changed.

// DropOnRead makes the fake leave these fields out of what it returns
// (listings and the objects returned by creations and updates), as a real
// HNS might: it still stores and applies them. Dump shows what is stored.
func (f *Fake) DropOnRead(d hns.Fields) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drops = d
}

// Rewrite is a value HNS returns for a numeric field in place of the one it
// was given (FieldPortFlags, FieldDistribution or FieldLBFlags, whose IPv6
// bit is never rewritten).
type Rewrite struct {
	Field    hns.Fields
	From, To uint32
}

// RewriteOnRead makes the fake return r.To where it stores r.From in that
// field (it still applies r.From); nil restores plain reads.
func (f *Fake) RewriteOnRead(rs ...Rewrite) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rewrites = rs
}

func (f *Fake) rewrite(field hns.Fields, v uint32) uint32 {
	for _, r := range f.rewrites {
		if r.Field == field && r.From == v {
			return r.To
		}
	}
	return v
}

// readLB is what the fake returns for a stored load balancer. f.mu is held.
func (f *Fake) readLB(lb *hns.LoadBalancer) *hns.LoadBalancer {
	c := cloneLB(lb)
	if f.partial[lb.ID] {
		// A partly created load balancer lists without what was not
		// programmed yet.
		c.PortMappings, c.HostComputeEndpoints = nil, nil
	}
	v6 := c.Flags & hns.LBFlagIPv6
	c.Flags = hns.LoadBalancerFlags(f.rewrite(hns.FieldLBFlags, uint32(c.Flags&^hns.LBFlagIPv6))) | v6
	if f.drops&hns.FieldSourceVIP != 0 {
		c.SourceVIP = ""
	}
	if f.drops&hns.FieldLBFlags != 0 {
		c.Flags &= hns.LBFlagIPv6
	}
	if f.drops&hns.FieldFrontendVIPs != 0 {
		c.FrontendVIPs = nil
	}
	for i := range c.PortMappings {
		pm := &c.PortMappings[i]
		pm.Flags = hns.PortMappingFlags(f.rewrite(hns.FieldPortFlags, uint32(pm.Flags)))
		pm.DistributionType = hns.Distribution(f.rewrite(hns.FieldDistribution, uint32(pm.DistributionType)))
		if f.drops&hns.FieldPortFlags != 0 {
			pm.Flags = 0
		}
		if f.drops&hns.FieldDistribution != 0 {
			pm.DistributionType = 0
		}
	}
	return c
}

// readEndpoint is what the fake returns for a stored endpoint. f.mu is
// held. The network is named in lower case, the ID in upper case.
func (f *Fake) readEndpoint(ep *hns.Endpoint) *hns.Endpoint {
	c := cloneEndpoint(ep)
	c.HostComputeNetwork = strings.ToLower(c.HostComputeNetwork)
	if f.drops&hns.FieldProviderAddress != 0 {
		c.Policies = slices.DeleteFunc(c.Policies, func(p hns.EndpointPolicy) bool { return p.Type == hns.PolicyProviderAddress })
	}
	if f.drops&hns.FieldName != 0 {
		c.Name = ""
	}
	if f.drops&hns.FieldMAC != 0 {
		c.MacAddress = ""
	}
	return c
}

// CreatePartially makes the next n load balancer creations that pass
// validation fail with err half-way: the load balancer exists and holds its
// port, but lists without port mapping and endpoints (a malformed object
// in the slot), as HNS can leave one when a creation fails.
func (f *Fake) CreatePartially(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.partialLeft, f.partialErr = n, err
}

// --- failure injection and call counts ---

// FailCall makes the nth call from now (1 = the next one) fail with err.
func (f *Fake) FailCall(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAt[f.total+n] = err
}

// FailOp makes the next call of op fail with err (queued: call again for more).
func (f *Fake) FailOp(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOp[op] = append(f.failOp[op], err)
}

// Down makes the next n calls fail as if HNS were restarting
// (HCN_E_MANAGER_STOPPED; n < 0: until Up).
func (f *Fake) Down(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.downCode = n, hns.CodeManagerStopped
}

// StopService makes the next n calls fail as HNS does when it is not
// running: RPC_S_UNKNOWN_IF, 0x6b5, the code upstream checks (n < 0: until
// Up).
func (f *Fake) StopService(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.downCode = n, hns.CodeRPCUnknownInterface
}

// Up ends a restarting or stopped period.
func (f *Fake) Up() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = 0
}

// Restart simulates an HNS restart that loses the non-persistent objects:
// every load balancer and every remote endpoint.
func (f *Fake) Restart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restart()
}

// RestartRestoring is Restart, after which HNS restores what it lost, under
// the same IDs, once `after` more calls have begun (HNS's backup and
// rehydration: kube-proxy's creations then fail with "already exists",
// kubernetes/kubernetes#139519).
func (f *Fake) RestartRestoring(after int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lbs, eps := f.restart()
	f.restore = &restoring{after: after, lbs: lbs, eps: eps}
}

// restart drops the load balancers and remote endpoints and returns them. f.mu is held.
func (f *Fake) restart() ([]*hns.LoadBalancer, []*hns.Endpoint) {
	var lbs []*hns.LoadBalancer
	for _, lb := range f.lbs {
		lbs = append(lbs, lb)
	}
	var eps []*hns.Endpoint
	for id, ep := range f.endpoints {
		if ep.IsRemote() {
			eps = append(eps, ep)
			f.dropEndpoint(id)
		}
	}
	f.lbs = make(map[string]*hns.LoadBalancer)
	f.partial = make(map[string]bool)
	f.lbBySlot = make(map[string]map[string]bool)
	return lbs, eps
}

// Calls returns the number of calls per operation since the last ResetCalls.
func (f *Fake) Calls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.calls))
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

// TotalCalls returns the number of calls since the last ResetCalls.
func (f *Fake) TotalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.calls {
		n += v
	}
	return n
}

// ResetCalls zeroes the call counts (pending failures keep their position).
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = make(map[string]int)
}

// RejectLoadBalancers makes creations and updates of the load balancers for
// which reject returns an error fail with that error, until called again
// (nil: accept all), as HNS does with settings it refuses on some hosts.
func (f *Fake) RejectLoadBalancers(reject func(*hns.LoadBalancer) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectLB = reject
}

// RejectEndpoints is RejectLoadBalancers for endpoint creations.
func (f *Fake) RejectEndpoints(reject func(*hns.Endpoint) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectEP = reject
}

// OnCall makes every call run fn first (with the operation's name), e.g.
// to advance a fake clock as a slow HNS would. fn runs with the fake's lock
// held: it must not call the fake. nil removes it.
func (f *Fake) OnCall(fn func(op string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onCall = fn
}

// Hang makes every call of op block, before it is counted or does anything,
// until the returned release function is called (as a hung HNS does).
func (f *Fake) Hang(op string) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang == nil {
		f.hang = make(map[string]chan struct{})
	}
	ch := make(chan struct{})
	f.hang[op] = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			if f.hang[op] == ch {
				delete(f.hang, op)
			}
			f.mu.Unlock()
			close(ch)
		})
	}
}

// wait blocks while op hangs. f.mu is not held.
func (f *Fake) wait(op string) {
	f.mu.Lock()
	ch := f.hang[op]
	f.mu.Unlock()
	if ch != nil {
		<-ch
	}
}
