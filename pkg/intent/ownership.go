package intent

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// ReasonFrontendConflict: a frontend (address, port and protocol, or a
// NodePort) of the port is also a frontend of another service port, which
// owns it; it is not programmed for this port.
const ReasonFrontendConflict = "FrontendConflict"

// Ownership of frontends across service ports. Two service ports may claim
// the same frontend — the same address, port and protocol (an externalIP
// that another Service also lists, a load balancer IP shared on the same
// port), or the same NodePort (from manifests; the API server allocates
// NodePorts uniquely). Every platform can send such a frontend to one
// endpoint set only, so the intent decides who owns it, the same way for
// every backend: a ClusterIP claim comes first, then service ports in name
// order (namespace, name, port name, protocol). Only the owner keeps the
// frontend; the others lose it, reported as a FrontendConflict, and get it
// back when the owner gives it up. A port whose ClusterIP frontend is owned
// by another port is left out entirely.

// feKey identifies a frontend across ports.
type feKey struct {
	addr     netip.Addr // invalid for a NodePort
	port     int32
	proto    v1.Protocol
	nodePort bool
}

// claim is one port's claim on a key.
type claim struct {
	p         *Port
	clusterIP bool
}

func claimCmp(a, b claim) int {
	if a.clusterIP != b.clusterIP {
		if a.clusterIP {
			return -1
		}
		return 1
	}
	return compareNames(a.p.Name, b.p.Name)
}

// ownership indexes the claims of the built ports.
type ownership struct {
	// claims holds, per key, the claims sorted by claimCmp: the first
	// owns the key. Most keys have one claim.
	claims map[feKey][]claim
}

func newOwnership() ownership { return ownership{claims: map[feKey][]claim{}} }

func keyOf(p *Port, fe *Frontend) feKey {
	if fe.Kind == NodePort {
		return feKey{port: fe.Port, proto: p.Protocol, nodePort: true}
	}
	return feKey{addr: fe.Addr, port: fe.Port, proto: p.Protocol}
}

// owner returns the port that owns k (nil: none claims it).
func (o *ownership) owner(k feKey) *Port {
	if c := o.claims[k]; len(c) > 0 {
		return c[0].p
	}
	return nil
}

// add records p's claims and returns the other ports whose owned
// frontends, or the owner their conflicts name, changed: every claimant of
// a key whose owner p became.
func (o *ownership) add(p *Port) []proxy.ServicePortName {
	var lost []proxy.ServicePortName
	for i := range p.Frontends {
		fe := &p.Frontends[i]
		k := keyOf(p, fe)
		list := o.claims[k]
		c := claim{p: p, clusterIP: fe.Kind == ClusterIP}
		if slices.ContainsFunc(list, func(x claim) bool { return x.p.Name == p.Name }) {
			continue // the same key twice in one port (a duplicate address)
		}
		before := (*Port)(nil)
		if len(list) > 0 {
			before = list[0].p
		}
		i, _ := slices.BinarySearchFunc(list, c, claimCmp)
		list = slices.Insert(list, i, c)
		o.claims[k] = list
		if before != nil && list[0].p != before {
			for _, c := range list[1:] {
				lost = append(lost, c.p.Name)
			}
		}
	}
	return lost
}

// remove drops the claims of raw (the port's last built intent) and
// returns the claimants of every key whose owner changed.
func (o *ownership) remove(raw *Port) []proxy.ServicePortName {
	if raw == nil {
		return nil
	}
	var gained []proxy.ServicePortName
	for i := range raw.Frontends {
		k := keyOf(raw, &raw.Frontends[i])
		list := o.claims[k]
		j := slices.IndexFunc(list, func(c claim) bool { return c.p.Name == raw.Name })
		if j < 0 {
			continue
		}
		list = slices.Delete(slices.Clone(list), j, j+1)
		if len(list) == 0 {
			delete(o.claims, k)
			continue
		}
		o.claims[k] = list
		if j == 0 {
			for _, c := range list {
				gained = append(gained, c.p.Name)
			}
		}
	}
	return gained
}

// apply returns raw with only the frontends it owns: raw itself when it
// owns every one, a copy without the others (each reported) otherwise, or
// nil and the problem when another port owns its ClusterIP frontend.
func (o *ownership) apply(raw *Port) (*Port, []proxy.Unsupported) {
	lost := -1
	for i := range raw.Frontends {
		if o.owner(keyOf(raw, &raw.Frontends[i])) != raw {
			lost = i
			break
		}
	}
	if lost < 0 {
		return raw, nil
	}
	problem := func(fe *Frontend) proxy.Unsupported {
		owner := o.owner(keyOf(raw, fe))
		return proxy.Unsupported{Service: raw.Name.NamespacedName, Port: raw.Name.Port, Family: raw.Family,
			Reason: ReasonFrontendConflict,
			Message: fmt.Sprintf("service port %s: %s/%s is also a frontend of service port %s, which owns it: not programmed for this port",
				raw.Name, fe, raw.Protocol, owner.Name)}
	}
	if raw.Frontends[0].Kind == ClusterIP && o.owner(keyOf(raw, &raw.Frontends[0])) != raw {
		return nil, []proxy.Unsupported{problem(&raw.Frontends[0])}
	}
	cp := *raw
	cp.Frontends = make([]Frontend, 0, len(raw.Frontends)-1)
	cp.Problems = slices.Clip(raw.Problems)
	for i := range raw.Frontends {
		fe := &raw.Frontends[i]
		if o.owner(keyOf(raw, fe)) == raw {
			cp.Frontends = append(cp.Frontends, *fe)
		} else {
			cp.Problems = append(cp.Problems, problem(fe))
		}
	}
	return &cp, nil
}
