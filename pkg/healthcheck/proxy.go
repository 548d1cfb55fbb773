// Package healthcheck serves kproxy's health endpoints with upstream
// kube-proxy's contract:
//
//   - ProxyHealth answers /healthz and /livez (--healthz-bind-address). The
//     proxy is healthy unless a change queued for an IP family has waited
//     longer than the timeout (2 × syncPeriod) to be programmed; a family is
//     judged only once it has synced successfully once (before that it is
//     starting up, and healthy). /healthz is also 503 while this node is
//     unknown (its Node object not seen yet), being deleted or tainted
//     ToBeDeletedByClusterAutoscaler, so cloud load balancers drain it;
//     /livez ignores the node.
//   - ServiceServers answers the healthCheckNodePort of every LoadBalancer
//     Service with externalTrafficPolicy Local: 200 when this node has ready
//     endpoints of the Service and the proxy is healthy, else 503, so load
//     balancers send traffic only to nodes that can serve it locally.
//
// ServicesFromSnapshot derives what ServiceServers serves from the desired
// state; it is pure. The servers log through an injected logger and report
// ports they cannot bind through a callback (kproxy turns it into an Event).
package healthcheck

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// FamilyHealth is the health of one IP family's programming.
type FamilyHealth struct {
	// LastUpdated is the end of the family's last successful sync (zero
	// before the first).
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Health is the body of /healthz and /livez (upstream's fields).
type Health struct {
	// LastUpdated is the latest successful sync of any family. When the
	// proxy is healthy the handlers report the current time instead, as
	// upstream does for compatibility with older releases.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set by /healthz only: false while the node is unknown,
	// being deleted or tainted ToBeDeletedByClusterAutoscaler.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is.
	Healthy bool `json:"healthy"`
	// Status holds each family that has synced successfully at least once.
	Status map[v1.IPFamily]FamilyHealth `json:"status,omitempty"`
}

// ProxyHealth tracks whether queued changes get programmed in time. It is
// safe for concurrent use.
type ProxyHealth struct {
	timeout time.Duration
	clock   clock.PassiveClock

	mu           sync.Mutex
	lastUpdated  map[v1.IPFamily]time.Time
	oldestQueued map[v1.IPFamily]time.Time
	nodeKnown    bool
	nodeDeleting bool
}

// NewProxyHealth returns the health of a proxy whose queued changes must be
// programmed within timeout (kproxy uses 2 × syncPeriod, like upstream).
// clk defaults to the real clock.
func NewProxyHealth(timeout time.Duration, clk clock.PassiveClock) *ProxyHealth {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &ProxyHealth{
		timeout:      timeout,
		clock:        clk,
		lastUpdated:  map[v1.IPFamily]time.Time{},
		oldestQueued: map[v1.IPFamily]time.Time{},
	}
}

// QueuedUpdate records that a change for family is waiting to be
// programmed. Only the oldest waiting change matters.
func (h *ProxyHealth) QueuedUpdate(f v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.oldestQueued[f]; !ok {
		h.oldestQueued[f] = h.clock.Now()
	}
}

// Updated records that family's programming is up to date.
func (h *ProxyHealth) Updated(f v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestQueued, f)
	h.lastUpdated[f] = h.clock.Now()
}

// SetNode records what kproxy knows of this node: known is false until its
// Node object has been seen (proxy.Node.Known); deleting is true while it has
// a deletion timestamp or the ToBeDeletedByClusterAutoscaler taint
// (proxy.Node.Deleting).
func (h *ProxyHealth) SetNode(known, deleting bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeKnown, h.nodeDeleting = known, deleting
}

// NodeEligible reports whether load balancers may use this node: it is
// known and not being deleted. Like upstream, a node not seen yet is not
// eligible.
func (h *ProxyHealth) NodeEligible() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodeKnown && !h.nodeDeleting
}

// Health returns the programming health, ignoring the node. Like upstream,
// only families that have synced successfully at least once are judged and
// reported: a family is unhealthy when a change queued for it has waited
// longer than the timeout. Before its first successful sync a family is
// starting up and counts as healthy, however long that takes (a first sync
// that keeps failing shows in the sync error metrics, not here).
func (h *ProxyHealth) Health() Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	out := Health{CurrentTime: now, Healthy: true, Status: map[v1.IPFamily]FamilyHealth{}}
	for f, t := range h.lastUpdated {
		st := FamilyHealth{LastUpdated: t, Healthy: true}
		if queued, ok := h.oldestQueued[f]; ok && now.Sub(queued) >= h.timeout {
			st.Healthy = false
			out.Healthy = false
		}
		out.Status[f] = st
		if t.After(out.LastUpdated) {
			out.LastUpdated = t
		}
	}
	return out
}

// Healthy reports Health().Healthy.
func (h *ProxyHealth) Healthy() bool { return h.Health().Healthy }

// Handler serves /healthz and /livez. served, when not nil, is told the
// path and status code of every answer (for kubeproxy_proxy_healthz_total
// and kubeproxy_proxy_livez_total).
func (h *ProxyHealth) Handler(served func(path string, code int)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		health := h.Health()
		eligible := h.NodeEligible()
		health.NodeEligible = &eligible
		h.write(w, "/healthz", health, health.Healthy && eligible, served)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		health := h.Health()
		h.write(w, "/livez", health, health.Healthy, served)
	})
	return mux
}

func (h *ProxyHealth) write(w http.ResponseWriter, path string, health Health, ok bool, served func(string, int)) {
	code := http.StatusServiceUnavailable
	if ok {
		code = http.StatusOK
		health.LastUpdated = health.CurrentTime
	}
	body, err := json.Marshal(health)
	if err != nil {
		// Cannot happen for these types; answer the status anyway.
		body = []byte("{}")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
	if served != nil {
		served(path, code)
	}
}
