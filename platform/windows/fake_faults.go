package windows

import (
	"slices"
	"sync"
)

// Fault injection for tests: failures, hangs, rejections and fields left
// out of what the fake returns.

// EchoDrops are fields the fake leaves out of what it returns (listings and
// the objects returned by creations and updates), as a real HNS might: it
// still stores and applies them. Dump shows what is stored.
type EchoDrops uint32

// Fields the fake can leave out of what it returns.
const (
	DropProviderAddress EchoDrops = 1 << iota // remote endpoints' ProviderAddress policy
	DropPortFlags                             // port mapping flags
	DropDistribution                          // port mapping DistributionType
	DropSourceVIP                             // load balancer SourceVIP
	DropLBFlags                               // load balancer flags other than IPv6 (DSR)
	DropFrontendVIPs                          // load balancer FrontendVIPs
	DropName                                  // endpoint Name
	DropMAC                                   // endpoint MacAddress

	// DropUnechoed is every field nothing shows a real HNS returns
	// (docs/windows.md). Frontend VIPs, names and MACs are returned by the
	// HNS versions upstream kube-proxy runs on (it finds its load balancers
	// by frontend VIP and the root endpoint by name); DropAll adds them.
	DropUnechoed = DropProviderAddress | DropPortFlags | DropDistribution | DropSourceVIP | DropLBFlags

	// DropAll is every field HNS may leave out; the backend treats each as
	// "not said" when read back zero until HNS is seen returning it (echo.go).
	DropAll = DropUnechoed | DropFrontendVIPs | DropName | DropMAC
)

// DropOnRead makes the fake leave these fields out of what it returns.
func (f *FakeHNS) DropOnRead(d EchoDrops) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drops = d
}

// readLB is what the fake returns for a stored load balancer. f.mu is held.
func (f *FakeHNS) readLB(lb *LoadBalancer) *LoadBalancer {
	c := cloneLB(lb)
	if f.drops&DropSourceVIP != 0 {
		c.SourceVIP = ""
	}
	if f.drops&DropLBFlags != 0 {
		c.Flags &= LBFlagIPv6
	}
	if f.drops&DropFrontendVIPs != 0 {
		c.FrontendVIPs = nil
	}
	for i := range c.PortMappings {
		if f.drops&DropPortFlags != 0 {
			c.PortMappings[i].Flags = 0
		}
		if f.drops&DropDistribution != 0 {
			c.PortMappings[i].DistributionType = 0
		}
	}
	return c
}

// readEndpoint is what the fake returns for a stored endpoint. f.mu is held.
func (f *FakeHNS) readEndpoint(ep *Endpoint) *Endpoint {
	c := cloneEndpoint(ep)
	if f.drops&DropProviderAddress != 0 {
		c.Policies = slices.DeleteFunc(c.Policies, func(p EndpointPolicy) bool { return p.Type == PolicyProviderAddress })
	}
	if f.drops&DropName != 0 {
		c.Name = ""
	}
	if f.drops&DropMAC != 0 {
		c.MacAddress = ""
	}
	return c
}

// --- failure injection and call counts ---

// FailCall makes the nth call from now (1 = the next one) fail with err.
func (f *FakeHNS) FailCall(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAt[f.total+n] = err
}

// FailOp makes the next call of op fail with err (queued: call again for more).
func (f *FakeHNS) FailOp(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOp[op] = append(f.failOp[op], err)
}

// Down makes the next n calls fail as if HNS were restarting (n < 0: until Up).
func (f *FakeHNS) Down(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = n
}

// Up ends a restarting period.
func (f *FakeHNS) Up() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = 0
}

// Restart simulates an HNS restart that loses the non-persistent objects:
// every load balancer and every remote endpoint.
func (f *FakeHNS) Restart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lbs = make(map[string]*LoadBalancer)
	f.lbBySlot = make(map[string]map[string]bool)
	for id, ep := range f.endpoints {
		if ep.IsRemote() {
			f.dropEndpoint(id)
		}
	}
}

// Calls returns the number of calls per operation since the last ResetCalls.
func (f *FakeHNS) Calls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.calls))
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

// TotalCalls returns the number of calls since the last ResetCalls.
func (f *FakeHNS) TotalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.calls {
		n += v
	}
	return n
}

// ResetCalls zeroes the call counts (pending failures keep their position).
func (f *FakeHNS) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = make(map[string]int)
}

// RejectLoadBalancers makes creations and updates of the load balancers for
// which reject returns an error fail with that error, until called again
// (nil: accept all), as HNS does with settings it refuses on some hosts.
func (f *FakeHNS) RejectLoadBalancers(reject func(*LoadBalancer) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectLB = reject
}

// RejectEndpoints is RejectLoadBalancers for endpoint creations.
func (f *FakeHNS) RejectEndpoints(reject func(*Endpoint) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectEP = reject
}

// OnCall makes every call run fn first (with the operation's name), e.g.
// to advance a fake clock as a slow HNS would. fn runs with the fake's lock
// held: it must not call the fake. nil removes it.
func (f *FakeHNS) OnCall(fn func(op string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onCall = fn
}

// Hang makes every call of op block, before it is counted or does anything,
// until the returned release function is called (as a hung HNS does).
func (f *FakeHNS) Hang(op string) (release func()) {
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
func (f *FakeHNS) wait(op string) {
	f.mu.Lock()
	ch := f.hang[op]
	f.mu.Unlock()
	if ch != nil {
		<-ch
	}
}
