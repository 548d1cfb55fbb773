package hns

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// DefaultCallTimeout bounds one HNS call. HNS answers in milliseconds when
// healthy; listing a busy host takes seconds. A call that takes longer is
// treated as HNS being unavailable.
const DefaultCallTimeout = time.Minute

// CodeTimeout is the code of an HNS call that did not return in time
// (ERROR_TIMEOUT); it is transient.
const CodeTimeout uint32 = 0x5b4

// timeoutHNS bounds every HNS call. hcn offers no cancellation, so a call
// that does not return in time is abandoned: its goroutine keeps waiting for
// HNS and the caller gets a transient CodeTimeout error. While an abandoned
// call has not returned, every further call fails at once with the same
// error, so a hung HNS costs one goroutine, not one per sync. A call that
// returns late may have done its work (a load balancer created after all);
// the failed sync makes the next one list HNS, which adopts or deletes it.
type timeoutHNS struct {
	log     klog.Logger
	hns     HNS
	timeout time.Duration

	mu sync.Mutex
	// stuck names the abandoned call still running ("" when none).
	stuck      string
	stuckSince time.Time
}

var _ HNS = (*timeoutHNS)(nil)

// WithTimeout bounds every call of h by timeout (see timeoutHNS); log
// receives a line when an abandoned call finally returns.
func WithTimeout(h HNS, timeout time.Duration, log klog.Logger) HNS {
	return &timeoutHNS{hns: h, timeout: timeout, log: log}
}

// timed runs f with h's timeout.
func timed[T any](h *timeoutHNS, op string, f func() (T, error)) (T, error) {
	var zero T
	h.mu.Lock()
	if h.stuck != "" {
		stuck, since := h.stuck, h.stuckSince
		h.mu.Unlock()
		return zero, NewError(op, CodeTimeout, fmt.Errorf("not tried: an earlier %s call has not returned since %s", stuck, since.Format(time.RFC3339)))
	}
	h.mu.Unlock()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	t := time.NewTimer(h.timeout)
	defer t.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
	}
	h.mu.Lock()
	h.stuck, h.stuckSince = op, time.Now()
	h.mu.Unlock()
	go func() {
		r := <-done
		h.mu.Lock()
		h.stuck = ""
		h.mu.Unlock()
		h.log.Info("An HNS call that timed out has returned", "op", op, "err", r.err)
	}()
	return zero, NewError(op, CodeTimeout, fmt.Errorf("no answer within %s", h.timeout))
}

func (h *timeoutHNS) Version() (Version, error) {
	return timed(h, OpVersion, h.hns.Version)
}

func (h *timeoutHNS) ListNetworks() ([]Network, error) {
	return timed(h, OpListNetworks, h.hns.ListNetworks)
}

func (h *timeoutHNS) GetNetwork(name string) (*Network, error) {
	return timed(h, OpGetNetwork, func() (*Network, error) { return h.hns.GetNetwork(name) })
}

func (h *timeoutHNS) ListEndpoints(networkID string) ([]Endpoint, error) {
	return timed(h, OpListEndpoints, func() ([]Endpoint, error) { return h.hns.ListEndpoints(networkID) })
}

func (h *timeoutHNS) CreateEndpoint(networkID string, ep *Endpoint) (*Endpoint, error) {
	return timed(h, OpCreateEndpoint, func() (*Endpoint, error) { return h.hns.CreateEndpoint(networkID, ep) })
}

func (h *timeoutHNS) DeleteEndpoint(id string) error {
	_, err := timed(h, OpDeleteEndpoint, func() (struct{}, error) { return struct{}{}, h.hns.DeleteEndpoint(id) })
	return err
}

func (h *timeoutHNS) ListLoadBalancers() ([]LoadBalancer, error) {
	return timed(h, OpListLoadBalancers, h.hns.ListLoadBalancers)
}

func (h *timeoutHNS) CreateLoadBalancer(lb *LoadBalancer) (*LoadBalancer, error) {
	return timed(h, OpCreateLoadBalancer, func() (*LoadBalancer, error) { return h.hns.CreateLoadBalancer(lb) })
}

func (h *timeoutHNS) UpdateLoadBalancer(id string, lb *LoadBalancer) (*LoadBalancer, error) {
	return timed(h, OpUpdateLoadBalancer, func() (*LoadBalancer, error) { return h.hns.UpdateLoadBalancer(id, lb) })
}

func (h *timeoutHNS) DeleteLoadBalancer(id string) error {
	_, err := timed(h, OpDeleteLoadBalancer, func() (struct{}, error) { return struct{}{}, h.hns.DeleteLoadBalancer(id) })
	return err
}
