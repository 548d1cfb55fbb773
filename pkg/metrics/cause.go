package metrics

import (
	"context"
	"errors"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Cause is why a sync failed: the cause label of kproxy_sync_failures_total.
// The set is small and fixed so alerts can name every value.
type Cause string

// Sync failure causes.
const (
	// CauseTimeout: the sync ran out of time (its context's deadline passed).
	CauseTimeout Cause = "timeout"
	// CauseUnavailable: the platform could not be reached or was restarting
	// (HNS service stopped, RPC failures); retrying later is all there is to do.
	CauseUnavailable Cause = "unavailable"
	// CauseRejected: the platform refused what kproxy asked
	// (iptables-restore or iptables-save exited with an error, an HNS call
	// returned an error code).
	CauseRejected Cause = "rejected"
	// CauseOther: anything else (conntrack cleanup, sysctls, ...).
	CauseOther Cause = "other"
)

var causes = []Cause{CauseTimeout, CauseUnavailable, CauseRejected, CauseOther}

// Classify returns the cause of a sync error: what platform says (nil, or
// returning "", for no opinion), else CauseTimeout for a context deadline,
// else CauseOther.
func Classify(err error, platform func(error) Cause) Cause {
	if platform != nil {
		if cause := platform(err); known(cause) {
			return cause
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return CauseTimeout
	}
	return CauseOther
}

func known(c Cause) bool {
	for _, k := range causes {
		if c == k {
			return true
		}
	}
	return false
}

// CountNoLocalEndpoints counts, like upstream kube-proxy, the service ports
// of a view that have usable endpoints somewhere in the cluster but none on
// this node for a Local traffic policy: internal counts ports with
// internalTrafficPolicy Local, external those with externalTrafficPolicy
// Local (and an external frontend). A port with both counts in both. Ports
// with no endpoints at all are rejected, not counted.
func CountNoLocalEndpoints(view *proxy.FamilyView) (internal, external int) {
	for p := range view.All() {
		i, e := NoLocalEndpointsOf(p)
		if i {
			internal++
		}
		if e {
			external++
		}
	}
	return internal, external
}

// NoLocalEndpointsOf tells whether p counts in CountNoLocalEndpoints'
// internal and external numbers.
func NoLocalEndpointsOf(p *proxy.ServicePort) (internal, external bool) {
	if !p.HasAnyEndpoints || len(p.LocalEndpoints) > 0 {
		return false, false
	}
	return p.InternalPolicyLocal, p.ExternalPolicyLocal
}
