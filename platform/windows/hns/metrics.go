package hns

import (
	"errors"
	"time"

	"k8s.io/utils/clock"
)

// Metrics receives the backend's HNS measurements. The lead's metrics package
// implements it with Prometheus; the default does nothing. Implementations
// must be safe for concurrent use and must not block.
type Metrics interface {
	// HNSCall observes the latency of one HNS call by operation (see the Op*
	// constants), successful or not.
	HNSCall(op string, d time.Duration)
	// HNSError counts one failed HNS call by operation and code
	// ("0x803b0013"; "none" when HNS gave no code).
	HNSError(op, code string)
}

// NopMetrics discards every measurement.
type NopMetrics struct{}

// HNSCall implements Metrics.
func (NopMetrics) HNSCall(string, time.Duration) {}

// HNSError implements Metrics.
func (NopMetrics) HNSError(string, string) {}

// Instrument wraps h so that every call reports its latency and failure to m.
func Instrument(h HNS, m Metrics, c clock.PassiveClock) HNS {
	if m == nil {
		m = NopMetrics{}
	}
	return instrumented{hns: h, m: m, clock: c}
}

// instrumented wraps an HNS with latency and error metrics.
type instrumented struct {
	hns   HNS
	m     Metrics
	clock clock.PassiveClock
}

var _ HNS = instrumented{}

func (h instrumented) done(op string, start time.Time, err error) {
	h.m.HNSCall(op, h.clock.Since(start))
	if err != nil {
		code := "none"
		var e *Error
		if errors.As(err, &e) && e.Code != 0 {
			code = e.CodeString()
		}
		h.m.HNSError(op, code)
	}
}

func (h instrumented) Version() (Version, error) {
	start := h.clock.Now()
	v, err := h.hns.Version()
	h.done(OpVersion, start, err)
	return v, err
}

func (h instrumented) ListNetworks() ([]Network, error) {
	start := h.clock.Now()
	n, err := h.hns.ListNetworks()
	h.done(OpListNetworks, start, err)
	return n, err
}

func (h instrumented) GetNetwork(name string) (*Network, error) {
	start := h.clock.Now()
	n, err := h.hns.GetNetwork(name)
	h.done(OpGetNetwork, start, err)
	return n, err
}

func (h instrumented) ListEndpoints(networkID string) ([]Endpoint, error) {
	start := h.clock.Now()
	eps, err := h.hns.ListEndpoints(networkID)
	h.done(OpListEndpoints, start, err)
	return eps, err
}

func (h instrumented) CreateEndpoint(networkID string, ep *Endpoint) (*Endpoint, error) {
	start := h.clock.Now()
	out, err := h.hns.CreateEndpoint(networkID, ep)
	h.done(OpCreateEndpoint, start, err)
	return out, err
}

func (h instrumented) DeleteEndpoint(id string) error {
	start := h.clock.Now()
	err := h.hns.DeleteEndpoint(id)
	h.done(OpDeleteEndpoint, start, err)
	return err
}

func (h instrumented) ListLoadBalancers() ([]LoadBalancer, error) {
	start := h.clock.Now()
	lbs, err := h.hns.ListLoadBalancers()
	h.done(OpListLoadBalancers, start, err)
	return lbs, err
}

func (h instrumented) CreateLoadBalancer(lb *LoadBalancer) (*LoadBalancer, error) {
	start := h.clock.Now()
	out, err := h.hns.CreateLoadBalancer(lb)
	h.done(OpCreateLoadBalancer, start, err)
	return out, err
}

func (h instrumented) UpdateLoadBalancer(id string, lb *LoadBalancer) (*LoadBalancer, error) {
	start := h.clock.Now()
	out, err := h.hns.UpdateLoadBalancer(id, lb)
	h.done(OpUpdateLoadBalancer, start, err)
	return out, err
}

func (h instrumented) DeleteLoadBalancer(id string) error {
	start := h.clock.Now()
	err := h.hns.DeleteLoadBalancer(id)
	h.done(OpDeleteLoadBalancer, start, err)
	return err
}
