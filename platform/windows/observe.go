package windows

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// reader reads HNS for the backend: the network (found when none is
// named), its endpoints and the load balancers, the node's CNI
// configuration, and the cheap checks. It changes nothing in HNS and
// nothing of the backend's record.
type reader struct {
	hns  hns.HNS
	opts *Options
	log  klog.Logger
	// netName is the network's name: Options.NetworkName, else the one
	// found ("" until found).
	netName string
	// cniLogged: the absence of a CNI configuration was said.
	cniLogged bool
}

// checkRecord lists the load balancers and the network's endpoints and
// reports the first recorded object HNS no longer has ("" when none). It
// compares IDs only (without regard to case).
func (r *reader) checkRecord(rec *reconcile.State, network string) (string, error) {
	lbs, err := r.hns.ListLoadBalancers()
	if err != nil {
		return "", fmt.Errorf("checking HNS load balancers: %w", err)
	}
	ids := make(map[string]bool, len(lbs))
	for i := range lbs {
		ids[strings.ToLower(lbs[i].ID)] = true
	}
	for _, slot := range reconcile.SortedSlots(rec.LoadBalancers) {
		if lb := rec.LoadBalancers[slot]; !ids[strings.ToLower(lb.ID)] {
			return "load balancer " + slot + " (" + lb.ID + ")", nil
		}
	}
	// HNS lists no endpoint for a network that is gone (no error): every
	// recorded endpoint is then missing.
	eps, err := r.hns.ListEndpoints(rec.NetworkID)
	if hns.IsNotFound(err) {
		return "network " + rec.NetworkID, nil
	}
	if err != nil {
		return "", fmt.Errorf("checking endpoints of HNS network %q: %w", network, err)
	}
	clear(ids)
	for i := range eps {
		ids[strings.ToLower(eps[i].ID)] = true
	}
	for _, ip := range sortedAddrs(rec.Endpoints) {
		if ep := rec.Endpoints[ip]; !ids[ep.ID] {
			return "endpoint " + ip.String() + " (" + ep.ID + ")", nil
		}
	}
	return "", nil
}

// read lists the network, its endpoints and the load balancers, without
// changing the record.
func (r *reader) read() (*observed, error) {
	if r.netName == "" {
		name, why, err := r.findNetwork()
		if err != nil {
			return nil, err
		}
		r.log.Info("HNS network found", "network", name, "why", why)
		r.netName = name
	}
	n, err := r.hns.GetNetwork(r.netName)
	if err != nil {
		if hns.IsNotFound(err) {
			return nil, fmt.Errorf("waiting for HNS network %q (created by the CNI): %w", r.netName, err)
		}
		return nil, fmt.Errorf("getting HNS network %q: %w", r.netName, err)
	}
	eps, err := r.hns.ListEndpoints(n.ID)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints of HNS network %q: %w", n.Name, err)
	}
	lbs, err := r.hns.ListLoadBalancers()
	if err != nil {
		return nil, fmt.Errorf("listing HNS load balancers: %w", err)
	}
	o := &observed{network: n, state: reconcile.Observe(r.opts.Family, n.ID, eps, lbs), evidence: reconcile.Evidence(eps, lbs)}
	if ifaces, err := r.opts.Interfaces(); err == nil {
		o.ifaces = ifaces
	} else {
		r.log.V(2).Info("Cannot list host interfaces; node IP and MAC from the Node object only", "err", err)
	}
	return o, nil
}

// readRoutes reads the network again for its remote subnet routes. It
// returns the network with its current routes, or reports it recreated
// under the same name (the caller lists HNS).
func (r *reader) readRoutes(network *hns.Network) (updated *hns.Network, recreated bool, err error) {
	n, err := r.hns.GetNetwork(network.Name)
	if err != nil {
		return nil, false, fmt.Errorf("reading HNS network %q for its remote subnets: %w", network.Name, err)
	}
	if !strings.EqualFold(n.ID, network.ID) {
		return network, true, nil
	}
	if slices.Equal(n.RemoteSubnets, network.RemoteSubnets) {
		return network, false, nil
	}
	r.log.V(2).Info("Remote subnets changed; provider addresses that depend on them follow", "family", r.opts.Family,
		"network", n.Name, "subnets", len(n.RemoteSubnets))
	c := *network
	c.RemoteSubnets = n.RemoteSubnets
	return &c, false, nil
}

// findNetwork returns the name of the network to use when none is
// configured, and why: the one the node's CNI configuration names, else the
// host's only L2Bridge or Overlay network.
func (r *reader) findNetwork() (string, string, error) {
	ns, err := r.hns.ListNetworks()
	if err != nil {
		return "", "", fmt.Errorf("listing HNS networks to find the one to use: %w", err)
	}
	return pickNetwork(ns, r.cniConfig())
}

// cniConfig reads the node's CNI configuration (nil when there is none or
// it cannot be read; said once in the log).
func (r *reader) cniConfig() *CNIConfig {
	if r.opts.CNIConfig == nil {
		return nil
	}
	cfg, err := r.opts.CNIConfig()
	if err != nil {
		if !r.cniLogged {
			r.cniLogged = true
			r.log.V(1).Info("No CNI configuration read", "err", err)
		}
		return nil
	}
	return cfg
}

// ipamStore is host-local's store for the source VIP (see IPAMStore).
func (r *reader) ipamStore(network string) string {
	store, why := IPAMStore(r.cniConfig(), r.opts.IPAMDataDir, network)
	r.log.V(2).Info("IPAM store for the source VIP", "store", store, "why", why)
	return store
}

// refreshEndpoints lists the network's endpoints and returns last with
// those it lacks added (local endpoints created by the CNI since the last
// listing).
func (r *reader) refreshEndpoints(last *reconcile.Record, network string) (*reconcile.Record, error) {
	eps, err := r.hns.ListEndpoints(last.State.NetworkID)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints of HNS network %q: %w", network, err)
	}
	return reconcile.AddEndpoints(last, reconcile.Observe(r.opts.Family, last.State.NetworkID, eps, nil), reconcile.Evidence(eps, nil)), nil
}
