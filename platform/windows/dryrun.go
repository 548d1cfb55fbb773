package windows

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// DryRunOutput is what DryRun prints: the desired HNS objects in HNS's own
// schema and field names, plus kproxy's annotations.
type DryRunOutput struct {
	Family  string
	Network hns.Network
	// Version is the HNS version the plan assumes.
	Version hns.Version
	// Offline is true when HNS was not asked (any OS without HNS): endpoint
	// references then are addresses, and local endpoints are assumed to exist.
	Offline bool
	// Endpoints are the endpoints kproxy creates (remote backends; on overlay
	// networks the source VIP and service VIP endpoints).
	Endpoints []*hns.Endpoint
	// LoadBalancers in HNS's schema. HostComputeEndpoints holds HNS IDs of
	// existing endpoints, and addresses for endpoints not created yet.
	LoadBalancers []DryRunLB
	Warnings      []plan.Warning `json:",omitempty"`
	// Operations are the HNS calls a sync would make now (online only).
	Operations []string `json:",omitempty"`
}

// DryRunLB is a load balancer with kproxy's annotations.
type DryRunLB struct {
	hns.LoadBalancer
	Kind     plan.LBKind
	Services []string
}

// DryRun prints, without changing anything, the HNS plan for v as JSON.
// With HNS it reads the network, endpoints and load balancers to show real
// IDs and the operations a sync would make; without, it uses Options.Offline.
func (b *Backend) DryRun(w io.Writer, v *intent.View) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := DryRunOutput{Family: string(b.opts.Family)}

	var st *reconcile.State
	var version hns.Version
	var network *hns.Network
	var ifaces []HostInterface
	if b.hns == nil {
		out.Offline = true
		version = hns.Version{Major: 15, Minor: 5}
		if b.opts.Offline.Version != nil {
			version = *b.opts.Offline.Version
		}
		network = &hns.Network{Name: b.opts.NetworkName, Type: hns.NetworkTypeL2Bridge}
		if b.opts.Offline.Network != nil {
			network = b.opts.Offline.Network
		}
		ifaces, _ = b.opts.Interfaces() // best effort: the node IP may then come from the Node only
	} else {
		v, err := b.hns.Version()
		if err != nil {
			return fmt.Errorf("dry run: asking HNS for its version: %w", err)
		}
		version = v
		o, err := b.r.read()
		if err != nil {
			return fmt.Errorf("dry run: %w", err)
		}
		st, network, ifaces = o.state, o.network, o.ifaces
	}
	facts := GatherFacts(&b.opts, hns.CapabilitiesFor(version), network, ifaces, st, v.Node)
	out.Version = version
	out.Network = facts.Network
	p := plan.Build(facts, v, nil)
	if p.Err != nil {
		return fmt.Errorf("dry run: planning %s HNS load balancers: %w", b.opts.Family, p.Err)
	}
	out.Warnings = p.Warnings
	for _, e := range p.Endpoints {
		out.Endpoints = append(out.Endpoints, e.HNS(facts.Network.ID))
	}
	for _, lb := range p.LoadBalancers {
		refs := make([]string, 0, len(lb.Endpoints))
		for _, ip := range lb.Endpoints {
			if st != nil && st.Endpoints[ip] != nil {
				refs = append(refs, st.Endpoints[ip].ID)
			} else {
				refs = append(refs, ip.String())
			}
		}
		d := DryRunLB{LoadBalancer: *lb.HNS(refs), Kind: lb.Kind}
		for _, o := range lb.Owners {
			d.Services = append(d.Services, o.String())
		}
		out.LoadBalancers = append(out.LoadBalancers, d)
	}
	if st != nil {
		for _, op := range reconcile.Reconcile(p, st, hns.CapabilitiesFor(version).ModifyLoadBalancer).Ops {
			out.Operations = append(out.Operations, op.String())
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("dry run: writing the plan: %w", err)
	}
	return nil
}
