package reconcile

import (
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// LiveLoadBalancers returns the load balancers of one family that HNS holds,
// with endpoints named by address (as a Plan names them), sorted by slot, and
// a line for each load balancer that cannot be understood (an orphan: it
// refers to an endpoint outside the network, is malformed, or is a second
// load balancer in a slot). endpoints are the network's.
func LiveLoadBalancers(family v1.IPFamily, networkID string, endpoints []hns.Endpoint, lbs []hns.LoadBalancer) ([]*plan.LBSpec, []string) {
	st := Observe(family, networkID, endpoints, lbs)
	out := make([]*plan.LBSpec, 0, len(st.LoadBalancers))
	for _, o := range st.LoadBalancers {
		out = append(out, o.Spec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot() < out[j].Slot() })
	var problems []string
	for _, o := range st.Orphans {
		problems = append(problems, fmt.Sprintf("load balancer %s: %s", o.ID, o.Problem))
	}
	return out, problems
}
