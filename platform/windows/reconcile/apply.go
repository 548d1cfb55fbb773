package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// Applier runs reconciliations against HNS: the only code of the backend
// with side effects on HNS (besides listing it).
type Applier struct {
	HNS    hns.HNS
	Log    klog.Logger
	Family v1.IPFamily
	// Modify: update load balancers in place (hns.Capabilities
	// ModifyLoadBalancer); otherwise an update is a deletion and a creation.
	Modify bool
}

// Rejection is one operation HNS refused.
type Rejection struct {
	Op  *Op
	Err error
}

// Result is the outcome of Apply.
type Result struct {
	// Err joins the failures that fail the sync: HNS unavailable (the
	// remaining operations were not tried), the context ended, a deletion
	// refused.
	Err error
	// Transient: HNS is unavailable; the remaining operations were not tried.
	Transient bool
	// Conflicts are creations and updates HNS refused with "already
	// exists" or "not found": HNS holds something the record does not (or
	// lacks something it holds). Every other operation still ran; the
	// caller lists HNS again and, if they are refused again, isolates them.
	Conflicts []Rejection
	// Rejected are creations and updates HNS refused for good (any other
	// error that says nothing of HNS's health): the caller isolates them.
	Rejected []Rejection
	// ModifyUnsupported: HNS answered "not implemented" to an update; the
	// load balancer was replaced instead, and so should the next ones be.
	ModifyUnsupported bool
	// Learned are fields whose echo the answers taught (echo.go).
	Learned hns.Fields
}

// Joined returns every error, the conflicts and rejections included.
func (r *Result) Joined() error {
	errs := []error{r.Err}
	for _, x := range r.Conflicts {
		errs = append(errs, x.Err)
	}
	for _, x := range r.Rejected {
		errs = append(errs, x.Err)
	}
	return errors.Join(errs...)
}

// isRejection reports whether a failed operation is isolated instead of
// failing the sync: creating or updating a load balancer, or creating an
// endpoint, refused with an error that says nothing about HNS's health or
// the record's accuracy.
func isRejection(op *Op, err error) bool {
	if !creates(op) {
		return false
	}
	switch hns.ClassOf(err) {
	case hns.ClassOther, hns.ClassNotImplemented:
		return true
	}
	return false
}

// isConflict reports whether a failed creation or update says the record
// is wrong: something exists that it does not know, or is gone that it holds.
func isConflict(op *Op, err error) bool {
	return creates(op) && (hns.IsAlreadyExists(err) || hns.IsNotFound(err))
}

func creates(op *Op) bool {
	return op.Kind == OpKindCreateLB || op.Kind == OpKindUpdateLB || op.Kind == OpKindCreateEndpoint
}

// Apply runs the operations in order and returns the record after them:
// last with the answer of every call that succeeded (last itself is not
// changed). It goes on past a refused operation (the objects that depend on
// it are programmed without it) and stops only when HNS is unavailable or
// ctx ends: one refused object never keeps the others from being
// programmed.
func (a *Applier) Apply(ctx context.Context, r *Reconciliation, last *Record) (*Record, Result) {
	var res Result
	if r.Empty() {
		return last, res
	}
	x := &applying{Applier: a, rec: last.clone(), modify: a.Modify}
	var errs []error
	for i := range r.Ops {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("HNS sync interrupted after %d of %d operations: %w", i, len(r.Ops), err))
			break
		}
		op := &r.Ops[i]
		a.Log.V(4).Info("HNS operation", "family", a.Family, "op", op.String())
		err := x.do(op)
		if err == nil {
			continue
		}
		switch {
		case hns.IsTransient(err):
			errs = append(errs, err)
			res.Transient = true
		case isConflict(op, err):
			res.Conflicts = append(res.Conflicts, Rejection{Op: op, Err: err})
			continue
		case isRejection(op, err):
			res.Rejected = append(res.Rejected, Rejection{Op: op, Err: err})
			continue
		case op.Kind == OpKindDeleteEndpoint && hns.ClassOf(err) == hns.ClassInUse && len(res.Rejected)+len(res.Conflicts) > 0:
			// Still held by a load balancer whose update HNS refused (it is
			// kept as it was); the endpoint goes once that one changes.
			a.Log.V(2).Info("Endpoint kept: still used by a load balancer HNS refused to update", "family", a.Family, "op", op.String())
			continue
		default:
			errs = append(errs, err)
			continue
		}
		break
	}
	res.Err = errors.Join(errs...)
	res.ModifyUnsupported = a.Modify && !x.modify
	res.Learned = x.learned
	return x.rec, res
}

// applying is one Apply: the record it builds.
type applying struct {
	*Applier
	rec     *Record
	modify  bool
	learned hns.Fields
	// refusedVIP holds the source VIP whose endpoint HNS refused: no load
	// balancer is created with it.
	refusedVIP map[netip.Addr]error
}

// errSourceVIPRefused is why a load balancer is not created: HNS refused
// the endpoint of its source VIP.
var errSourceVIPRefused = errors.New("HNS refused the endpoint of its source VIP")

func (x *applying) do(op *Op) error {
	switch op.Kind {
	case OpKindCreateEndpoint:
		return x.createEndpoint(op.Endpoint)
	case OpKindDeleteEndpoint:
		if op.Replacing {
			// The address gets a new endpoint ID: no recorded load balancer
			// may be trusted on its spec alone from now on.
			x.rec.State.idGen++
		}
		return x.deleteEndpoint(op.OldEndpoint)
	case OpKindCreateLB:
		return x.createLB(op.LB)
	case OpKindUpdateLB:
		return x.updateLB(op.Old, op.LB)
	case OpKindDeleteLB:
		return x.deleteLB(op.Old)
	}
	return fmt.Errorf("unknown HNS operation %d", op.Kind)
}

func (x *applying) createEndpoint(spec *plan.EndpointSpec) error {
	st := x.rec.State
	out, err := x.HNS.CreateEndpoint(st.NetworkID, spec.HNS(st.NetworkID))
	if err != nil {
		if spec.Role == plan.RoleSourceVIP {
			if x.refusedVIP == nil {
				x.refusedVIP = make(map[netip.Addr]error)
			}
			x.refusedVIP[spec.IP] = err
		}
		return fmt.Errorf("creating %s endpoint %s: %w", spec.Role, spec.IP, err)
	}
	o := observeEndpoint(out, spec.IP)
	if o.ID == "" {
		return fmt.Errorf("creating %s endpoint %s: HNS returned no ID", spec.Role, spec.IP)
	}
	if len(out.IPConfigurations) == 0 { // keep what we asked for
		o.Remote, o.ProviderAddress, o.Name = spec.Remote(), spec.ProviderAddress, spec.Name()
	}
	sent := SentFrom(spec)
	x.rec.Sent.EPs[o.ID] = sent
	echo := x.rec.Echo
	echo.Seen = 0 // what HNS did not return: it was just created as sent
	x.learned |= echo.fillEndpoint(o, sent, nil, nil)
	x.rec.Echo.Learned = echo.Learned
	st.setEndpoint(o)
	return nil
}

func (x *applying) deleteEndpoint(ep *ObservedEndpoint) error {
	err := x.HNS.DeleteEndpoint(ep.ID)
	if err != nil && !hns.IsNotFound(err) {
		return fmt.Errorf("deleting endpoint %s (%s): %w", ep.IP, ep.ID, err)
	}
	st := x.rec.State
	if cur := st.Endpoints[ep.IP]; cur != nil && cur.ID == ep.ID {
		delete(st.Endpoints, ep.IP)
	}
	delete(x.rec.Sent.EPs, ep.ID)
	for i, s := range st.Shadowed {
		if s.ID == ep.ID {
			st.Shadowed = append(st.Shadowed[:i:i], st.Shadowed[i+1:]...)
			break
		}
	}
	return nil
}

// resolveIDs maps the endpoint addresses of spec to the IDs in the record.
// An address without an endpoint (its creation failed) is left out, and the
// returned spec says so.
func (x *applying) resolveIDs(spec *plan.LBSpec) (*plan.LBSpec, []string) {
	eps := x.rec.State.Endpoints
	ids := make([]string, 0, len(spec.Endpoints))
	var lost bool
	for _, ip := range spec.Endpoints {
		ep := eps[ip]
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
		if eps[ip] != nil {
			keep = append(keep, ip)
		}
	}
	return spec.WithEndpoints(keep), ids
}

// LBName names a load balancer for messages: kind, slot and Services.
func LBName(spec *plan.LBSpec) string {
	if len(spec.Owners) == 0 {
		return fmt.Sprintf("%s load balancer %s", spec.Kind, spec.Slot())
	}
	return fmt.Sprintf("%s load balancer %s of %s", spec.Kind, spec.Slot(), plan.OwnerNames(spec.Owners))
}

func (x *applying) record(id string, spec *plan.LBSpec, ids []string, out *hns.LoadBalancer) {
	sorted := make([]string, len(ids))
	for i, id := range ids {
		sorted[i] = lower(id)
	}
	sort.Strings(sorted)
	st := x.rec.State
	st.LoadBalancers[spec.Slot()] = &ObservedLB{ID: id, Spec: spec, EndpointIDs: sorted, Slot: spec.Slot(), gen: st.idGen}
	x.rec.Sent.LBs[lower(id)] = spec
	if out != nil && len(out.PortMappings) == 1 {
		// What HNS says it made: a field it returns changed is its echo.
		pm := out.PortMappings[0]
		got := *spec
		got.Protocol, got.InternalPort, got.ExternalPort = pm.Protocol, pm.InternalPort, pm.ExternalPort
		got.PortFlags, got.Distribution, got.Flags = pm.Flags, pm.DistributionType, out.Flags
		got.SourceVIP = netip.Addr{}
		if a, err := netip.ParseAddr(out.SourceVIP); err == nil {
			got.SourceVIP = a.Unmap()
		}
		if l := x.rec.Echo.learnLB(got.Finish(), spec); l != 0 {
			x.learned |= l
			x.Log.Info("HNS returns a field of a load balancer changed; learned as its echo", "family", x.Family,
				"loadBalancer", spec.Slot(), "fields", l.String())
		}
	}
}

func (x *applying) createLB(want *plan.LBSpec) error {
	if err := x.refusedVIP[want.SourceVIP]; err != nil {
		return fmt.Errorf("creating %s: %w %s: %v", LBName(want), errSourceVIPRefused, want.SourceVIP, err)
	}
	spec, ids := x.resolveIDs(want)
	if len(ids) == 0 {
		return nil // every endpoint failed to be created; those errors are reported
	}
	out, err := x.HNS.CreateLoadBalancer(spec.HNS(ids))
	if err != nil {
		return fmt.Errorf("creating %s: %w", LBName(spec), err)
	}
	if out == nil || out.ID == "" {
		return fmt.Errorf("creating %s: HNS returned no ID", LBName(spec))
	}
	x.record(out.ID, spec, ids, out)
	return nil
}

func (x *applying) updateLB(old *ObservedLB, want *plan.LBSpec) error {
	if !x.modify {
		return x.replaceLB(old, want)
	}
	spec, ids := x.resolveIDs(want)
	if len(ids) == 0 {
		return x.deleteLB(old)
	}
	out, err := x.HNS.UpdateLoadBalancer(old.ID, spec.HNS(ids))
	switch {
	case err == nil:
		x.record(old.ID, spec, ids, out)
		return nil
	case hns.IsNotImplemented(err):
		x.Log.Info("HNS cannot update load balancers in place; deleting and creating them instead", "err", err)
		x.modify = false
		return x.replaceLB(old, want)
	}
	return fmt.Errorf("updating %s (%s): %w", LBName(spec), old.ID, err)
}

func (x *applying) replaceLB(old *ObservedLB, want *plan.LBSpec) error {
	if err := x.deleteLB(old); err != nil {
		return err
	}
	return x.createLB(want)
}

func (x *applying) deleteLB(old *ObservedLB) error {
	err := x.HNS.DeleteLoadBalancer(old.ID)
	if err != nil && !hns.IsNotFound(err) {
		what := old.ID
		if old.Spec != nil {
			what = old.Spec.Slot() + " (" + old.ID + ")"
		}
		return fmt.Errorf("deleting load balancer %s: %w", what, err)
	}
	x.rec.forgetLB(old)
	return nil
}

// forgetLB removes a deleted load balancer from the record.
func (r *Record) forgetLB(old *ObservedLB) {
	delete(r.Sent.LBs, lower(old.ID))
	st := r.State
	if old.Spec != nil {
		if cur := st.LoadBalancers[old.Spec.Slot()]; cur != nil && strings.EqualFold(cur.ID, old.ID) {
			delete(st.LoadBalancers, old.Spec.Slot())
		}
	}
	for i, o := range st.Orphans {
		if strings.EqualFold(o.ID, old.ID) {
			st.Orphans = append(st.Orphans[:i:i], st.Orphans[i+1:]...)
			break
		}
	}
}
