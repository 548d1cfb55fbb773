package windows

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// applyResult is the outcome of executing a reconciliation.
type applyResult struct {
	err error
	// stale: HNS refused an operation because it holds something the record
	// does not (already exists, or a referenced object is gone): list again.
	stale bool
	// transient: HNS is unavailable; the remaining operations were not tried.
	transient bool
	// rejected are the operations HNS refused for good (see isRejection):
	// not in err; the sync isolates them.
	rejected []rejection
}

// joined returns every error, the rejections included.
func (r *applyResult) joined() error {
	errs := []error{r.err}
	for _, x := range r.rejected {
		errs = append(errs, x.err)
	}
	return errors.Join(errs...)
}

// apply executes the operations in order, keeping the record in step with
// every call that succeeded. It goes on past a failed operation (the objects
// that depend on it are programmed without it), and stops at the first
// transient error (HNS is unavailable) or the first sign that the record is
// wrong (something exists that it does not know, or is gone that it holds).
func (b *Backend) apply(ctx context.Context, r *Reconciliation) applyResult {
	var res applyResult
	var errs []error
	for i := range r.Ops {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("HNS sync interrupted after %d of %d operations: %w", i, len(r.Ops), err))
			break
		}
		op := &r.Ops[i]
		b.log.V(4).Info("HNS operation", "family", b.opts.Family, "op", op.String())
		err := b.do(op)
		if err == nil {
			continue
		}
		if isRejection(op, err) {
			res.rejected = append(res.rejected, rejection{op: op, err: err})
			continue
		}
		if op.Kind == OpKindDeleteEndpoint && ClassOf(err) == ClassInUse && len(res.rejected) > 0 {
			// Still held by a load balancer whose update HNS refused (it is
			// kept as it was); the endpoint goes once that one changes.
			b.log.V(2).Info("Endpoint kept: still used by a load balancer HNS refused to update", "family", b.opts.Family, "op", op.String())
			continue
		}
		errs = append(errs, err)
		switch {
		case IsTransient(err):
			res.transient = true
		case IsAlreadyExists(err),
			IsNotFound(err) && (op.Kind == OpKindCreateLB || op.Kind == OpKindUpdateLB || op.Kind == OpKindCreateEndpoint):
			// The record is wrong: what follows would be planned on it too.
			res.stale = true
		default:
			continue
		}
		break
	}
	res.err = errors.Join(errs...)
	return res
}

func (b *Backend) do(op *Op) error {
	switch op.Kind {
	case OpKindCreateEndpoint:
		return b.createEndpoint(op.Endpoint)
	case OpKindDeleteEndpoint:
		if op.Replacing {
			// The address gets a new endpoint ID: no recorded load balancer
			// may be trusted on its spec alone from now on.
			b.rec.idGen++
		}
		return b.deleteEndpoint(op.OldEndpoint)
	case OpKindCreateLB:
		return b.createLB(op.LB)
	case OpKindUpdateLB:
		return b.updateLB(op.Old, op.LB)
	case OpKindDeleteLB:
		return b.deleteLB(op.Old)
	}
	return fmt.Errorf("unknown HNS operation %d", op.Kind)
}

func (b *Backend) createEndpoint(spec *EndpointSpec) error {
	out, err := b.hns.CreateEndpoint(b.rec.NetworkID, spec.HNS(b.rec.NetworkID))
	if err != nil {
		return fmt.Errorf("creating %s endpoint %s: %w", spec.Role, spec.IP, err)
	}
	o := observeEndpoint(out, spec.IP)
	if o.ID == "" {
		return fmt.Errorf("creating %s endpoint %s: HNS returned no ID", spec.Role, spec.IP)
	}
	if len(out.IPConfigurations) == 0 { // keep what we asked for
		o.Remote, o.ProviderAddress, o.Name = spec.Remote(), spec.ProviderAddress, spec.Name()
	}
	sent := sentFrom(spec)
	b.sentEP[o.ID] = sent
	fillEndpoint(o, sent, DropAll) // what HNS did not return (echo.go): it was just created as sent
	b.rec.setEndpoint(o)
	return nil
}

func (b *Backend) deleteEndpoint(ep *ObservedEndpoint) error {
	err := b.hns.DeleteEndpoint(ep.ID)
	if err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting endpoint %s (%s): %w", ep.IP, ep.ID, err)
	}
	if cur := b.rec.Endpoints[ep.IP]; cur != nil && cur.ID == ep.ID {
		delete(b.rec.Endpoints, ep.IP)
	}
	delete(b.sentEP, ep.ID)
	for i, s := range b.rec.Shadowed {
		if s.ID == ep.ID {
			b.rec.Shadowed = append(b.rec.Shadowed[:i], b.rec.Shadowed[i+1:]...)
			break
		}
	}
	return nil
}

// resolve maps the endpoint addresses of spec to the IDs in the record. An
// address without an endpoint (its creation failed) is left out, and the
// returned spec says so.
func (b *Backend) resolve(spec *LBSpec) (*LBSpec, []string) {
	ids := make([]string, 0, len(spec.Endpoints))
	var lost bool
	for _, ip := range spec.Endpoints {
		ep := b.rec.Endpoints[ip]
		if ep == nil {
			lost = true
			continue
		}
		ids = append(ids, ep.ID)
	}
	if !lost {
		return spec, ids
	}
	keep := make([]netip.Addr, 0, len(ids))
	for _, ip := range spec.Endpoints {
		if b.rec.Endpoints[ip] != nil {
			keep = append(keep, ip)
		}
	}
	return spec.withEndpoints(keep), ids
}

func lbName(spec *LBSpec) string {
	if len(spec.Owners) == 0 {
		return fmt.Sprintf("%s load balancer %s", spec.Kind, spec.slot)
	}
	return fmt.Sprintf("%s load balancer %s of %s", spec.Kind, spec.slot, ownerNames(spec.Owners))
}

func (b *Backend) record(id string, spec *LBSpec, ids []string) {
	sorted := make([]string, len(ids))
	for i, id := range ids {
		sorted[i] = strings.ToLower(id)
	}
	sort.Strings(sorted)
	b.rec.LoadBalancers[spec.slot] = &ObservedLB{ID: id, Spec: spec, EndpointIDs: sorted, Slot: spec.slot, gen: b.rec.idGen}
	b.sentLBs[strings.ToLower(id)] = sentLB{spec: spec}
}

func (b *Backend) createLB(want *LBSpec) error {
	spec, ids := b.resolve(want)
	if len(ids) == 0 {
		return nil // every endpoint failed to be created; those errors are reported
	}
	out, err := b.hns.CreateLoadBalancer(spec.HNS(ids))
	if err != nil {
		return fmt.Errorf("creating %s: %w", lbName(spec), err)
	}
	if out.ID == "" {
		return fmt.Errorf("creating %s: HNS returned no ID", lbName(spec))
	}
	b.record(out.ID, spec, ids)
	return nil
}

func (b *Backend) updateLB(old *ObservedLB, want *LBSpec) error {
	if !b.caps.ModifyLoadBalancer {
		return b.replaceLB(old, want)
	}
	spec, ids := b.resolve(want)
	if len(ids) == 0 {
		return b.deleteLB(old)
	}
	_, err := b.hns.UpdateLoadBalancer(old.ID, spec.HNS(ids))
	switch {
	case err == nil:
		b.record(old.ID, spec, ids)
		return nil
	case IsNotImplemented(err):
		b.log.Info("HNS cannot update load balancers in place; deleting and creating them instead", "err", err)
		b.caps.ModifyLoadBalancer = false
		return b.replaceLB(old, want)
	}
	return fmt.Errorf("updating %s (%s): %w", lbName(spec), old.ID, err)
}

func (b *Backend) replaceLB(old *ObservedLB, want *LBSpec) error {
	if err := b.deleteLB(old); err != nil {
		return err
	}
	return b.createLB(want)
}

func (b *Backend) deleteLB(old *ObservedLB) error {
	err := b.hns.DeleteLoadBalancer(old.ID)
	if err != nil && !IsNotFound(err) {
		what := old.ID
		if old.Spec != nil {
			what = old.Spec.slot + " (" + old.ID + ")"
		}
		return fmt.Errorf("deleting load balancer %s: %w", what, err)
	}
	b.forgetLB(old)
	return nil
}

func (b *Backend) forgetLB(old *ObservedLB) {
	delete(b.sentLBs, strings.ToLower(old.ID))
	if old.Spec != nil {
		if cur := b.rec.LoadBalancers[old.Spec.slot]; cur != nil && cur.ID == old.ID {
			delete(b.rec.LoadBalancers, old.Spec.slot)
		}
	}
	for i, o := range b.rec.Orphans {
		if o.ID == old.ID {
			b.rec.Orphans = append(b.rec.Orphans[:i], b.rec.Orphans[i+1:]...)
			break
		}
	}
}
