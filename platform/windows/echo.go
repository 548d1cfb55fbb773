package windows

import (
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// What HNS returns when asked for an object is not always what it was given.
// docs/windows.md lists the fields and where each fact comes from.
//
// Identity, always trusted: a load balancer's ID, protocol, internal and
// external port, endpoint IDs and IPv6 flag; an endpoint's ID, address and
// remote flag.
//
// The fields HNS may leave out (the bits of EchoDrops): a load balancer's
// port mapping flags, distribution type, source VIP, DSR flag and frontend
// VIPs, an endpoint's provider address policy, name and MAC. A value read
// back that is not zero is what HNS holds, and a difference from what kproxy
// wants is reconciled. A zero value is "not said" unless HNS was seen
// returning the field (a non-zero value of it in a listing: the evidence,
// Backend.echoed); a field not said is
//   - taken from kproxy's record of what it sent, for an object it created
//     or already adopted (keyed by HNS ID);
//   - adopted as the plan wants it, for an object kproxy has no record of
//     (after a restart, or kube-proxy's): unknown, never a difference, so a
//     restart reprograms nothing (adoptUnknown).
// An endpoint's name and MAC are ownership facts: for an endpoint kproxy
// created, the record always supplies them when HNS says nothing.

// sentLB is what kproxy last sent for a load balancer (or adopted for it).
type sentLB struct{ spec *LBSpec }

// sentEndpoint is what kproxy sent for an endpoint it created (or adopted).
type sentEndpoint struct {
	ip              netip.Addr
	remote          bool
	name            string
	mac             string
	providerAddress netip.Addr
}

func sentFrom(spec *EndpointSpec) sentEndpoint {
	return sentEndpoint{ip: spec.IP, remote: spec.Remote(), name: spec.Name(), mac: spec.MAC, providerAddress: spec.ProviderAddress}
}

func sentFromObserved(ep *ObservedEndpoint) sentEndpoint {
	return sentEndpoint{ip: ep.IP, remote: ep.Remote, name: ep.Name, mac: ep.MAC, providerAddress: ep.ProviderAddress}
}

// echoEvidence returns the fields of EchoDrops that a listing shows HNS
// returns: those with a non-zero value on some object.
func echoEvidence(eps []Endpoint, lbs []LoadBalancer) EchoDrops {
	var seen EchoDrops
	for i := range eps {
		ep := &eps[i]
		if ep.IsRemote() && ep.ProviderAddress() != "" {
			seen |= DropProviderAddress
		}
		if ep.Name != "" {
			seen |= DropName
		}
		if ep.MacAddress != "" {
			seen |= DropMAC
		}
	}
	for i := range lbs {
		lb := &lbs[i]
		if lb.SourceVIP != "" {
			seen |= DropSourceVIP
		}
		if lb.Flags&^LBFlagIPv6 != 0 {
			seen |= DropLBFlags
		}
		if len(lb.FrontendVIPs) > 0 {
			seen |= DropFrontendVIPs
		}
		for _, pm := range lb.PortMappings {
			if pm.Flags != 0 {
				seen |= DropPortFlags
			}
			if pm.DistributionType != 0 {
				seen |= DropDistribution
			}
		}
	}
	return seen
}

// unknownFields are the fields whose zero value read back means "not said".
func (b *Backend) unknownFields() EchoDrops { return DropAll &^ b.echoed }

// adoptSent completes a fresh listing with what kproxy sent: an endpoint it
// created gets back the fields HNS did not return, and a load balancer it
// created or updated whose returned fields all match what was sent gets the
// sent spec (with the fields HNS did not return), in the slot of that spec.
// Entries for objects that are gone are forgotten when forget is set (st is
// a full listing).
func (b *Backend) adoptSent(st *State, forget bool) {
	unknown := b.unknownFields()
	seenEP := make(map[string]bool, len(b.sentEP))
	adoptEP := func(ep *ObservedEndpoint) {
		s, ok := b.sentEP[ep.ID]
		if !ok {
			return
		}
		seenEP[ep.ID] = true
		if s.ip != ep.IP || s.remote != ep.Remote {
			return // not what was sent: trust HNS
		}
		fillEndpoint(ep, s, unknown)
	}
	for _, ep := range st.Endpoints {
		adoptEP(ep)
	}
	for _, ep := range st.Shadowed {
		adoptEP(ep)
	}
	for id := range b.sentEP {
		if forget && !seenEP[id] {
			delete(b.sentEP, id)
		}
	}

	seenLB := make(map[string]bool, len(b.sentLBs))
	var adopted map[*ObservedLB]bool
	moved := false
	st.eachUsableLB(func(o *ObservedLB) {
		id := strings.ToLower(o.ID)
		s, ok := b.sentLBs[id]
		if !ok {
			return
		}
		seenLB[id] = true
		if echoMatches(o.Spec, s.spec, unknown) {
			moved = moved || o.Spec.slot != s.spec.slot || o.Problem != ""
			o.Spec = s.spec
			if adopted == nil {
				adopted = make(map[*ObservedLB]bool)
			}
			adopted[o] = true
		}
	})
	for _, o := range st.Orphans {
		seenLB[strings.ToLower(o.ID)] = true
	}
	for id := range b.sentLBs {
		if forget && !seenLB[id] {
			delete(b.sentLBs, id)
		}
	}
	if moved {
		st.rekey(adopted)
	}
}

// fillEndpoint gives an endpoint kproxy created the fields HNS did not
// return: its name and MAC whenever HNS says nothing, its provider address
// when HNS is not known to return it.
func fillEndpoint(ep *ObservedEndpoint, s sentEndpoint, unknown EchoDrops) {
	if ep.Name == "" {
		ep.Name = s.name
	}
	if ep.MAC == "" {
		ep.MAC = s.mac
	}
	if !ep.ProviderAddress.IsValid() && unknown&DropProviderAddress != 0 {
		ep.ProviderAddress = s.providerAddress
	}
}

// echoMatches reports whether a load balancer read back from HNS is sent,
// given the fields whose zero value means "not said": the identity equal,
// and every other field equal or not said.
func echoMatches(got, sent *LBSpec, unknown EchoDrops) bool {
	if got == nil || sent == nil {
		return false
	}
	if got.Protocol != sent.Protocol || got.InternalPort != sent.InternalPort || got.ExternalPort != sent.ExternalPort ||
		got.Flags&LBFlagIPv6 != sent.Flags&LBFlagIPv6 || !slices.Equal(got.Endpoints, sent.Endpoints) {
		return false
	}
	notSaid := func(f EchoDrops, zero bool) bool { return zero && unknown&f != 0 }
	return (slices.Equal(got.FrontendVIPs, sent.FrontendVIPs) || notSaid(DropFrontendVIPs, len(got.FrontendVIPs) == 0)) &&
		(got.PortFlags == sent.PortFlags || notSaid(DropPortFlags, got.PortFlags == 0)) &&
		(got.Distribution == sent.Distribution || notSaid(DropDistribution, got.Distribution == 0)) &&
		(got.SourceVIP == sent.SourceVIP || notSaid(DropSourceVIP, !got.SourceVIP.IsValid())) &&
		(got.Flags == sent.Flags || notSaid(DropLBFlags, got.Flags&^LBFlagIPv6 == 0))
}

// adoptUnknown completes, from the plan, the objects kproxy has no record of
// (recorded says which it has) whose fields HNS left out and is not known
// to return (unknown): such a field is unknown, not different, so the
// object is taken to hold what the plan wants (the provider address is the
// one the network's remote subnets give, as planned). Returned are the
// endpoints and load balancers so completed, for the record.
//
// A load balancer is adopted when its identity and every field HNS did
// return match the plan's for its slot. When frontend VIPs are not said, a
// load balancer listed without VIPs in a slot the plan does not want may
// serve any wanted frontend of its protocol and port that HNS seems to lack:
// it is adopted for the first one it matches; one that matches none (its
// content changed while kproxy was away) is deleted before the first such
// frontend is programmed, since it may hold it.
func adoptUnknown(plan *Plan, st *State, unknown EchoDrops, recorded func(id string) bool) (eps []*ObservedEndpoint, lbs []*ObservedLB) {
	if unknown == 0 {
		return nil, nil
	}
	for _, spec := range plan.Endpoints {
		ep := st.Endpoints[spec.IP]
		if ep == nil || !ep.Remote || !spec.Remote() || recorded(ep.ID) {
			continue // a local endpoint may be the CNI's: never made kproxy's
		}
		done := false
		if !ep.ProviderAddress.IsValid() && spec.ProviderAddress.IsValid() && unknown&DropProviderAddress != 0 {
			ep.ProviderAddress, done = spec.ProviderAddress, true
		}
		if ep.Name == "" && unknown&DropName != 0 {
			ep.Name, done = spec.Name(), true
		}
		if ep.MAC == "" && spec.MAC != "" && unknown&DropMAC != 0 {
			ep.MAC, done = spec.MAC, true
		}
		if done {
			eps = append(eps, ep)
		}
	}

	desiredEP := plan.endpointIndex()
	// target is want without the local addresses HNS lacks, as Reconcile
	// programs it.
	scratch := make(map[netip.Addr]bool)
	target := func(want *LBSpec) *LBSpec {
		t, _ := resolve(want, nil, desiredEP, st, nil, scratch)
		return t
	}
	wanted := make(map[string]bool, len(plan.LoadBalancers))
	for _, want := range plan.LoadBalancers {
		wanted[want.slot] = true
		cur := st.LoadBalancers[want.slot]
		if cur == nil || cur.Spec == want || recorded(cur.ID) {
			continue
		}
		if t := target(want); cur.Spec.key != t.key && echoMatches(cur.Spec, t, unknown) {
			cur.Spec = t
			lbs = append(lbs, cur)
		}
	}
	if unknown&DropFrontendVIPs == 0 {
		return eps, lbs
	}

	// Frontend VIPs not said: match the load balancers listed without VIPs
	// to the wanted frontends HNS seems to lack, per family, protocol and port.
	type base struct {
		v6    bool
		proto uint32
		port  uint16
	}
	baseOf := func(s *LBSpec) base { return base{s.Flags&LBFlagIPv6 != 0, s.Protocol, s.ExternalPort} }
	lacking := make(map[base][]*LBSpec)
	for _, want := range plan.LoadBalancers {
		if len(want.FrontendVIPs) > 0 && st.LoadBalancers[want.slot] == nil {
			lacking[baseOf(want)] = append(lacking[baseOf(want)], want) // sorted by slot
		}
	}
	if len(lacking) == 0 {
		return eps, lbs
	}
	var cands []*ObservedLB
	st.eachUsableLB(func(o *ObservedLB) {
		if len(o.Spec.FrontendVIPs) == 0 && !wanted[o.Spec.slot] && !recorded(o.ID) && len(lacking[baseOf(o.Spec)]) > 0 {
			cands = append(cands, o)
		}
	})
	sort.Slice(cands, func(i, j int) bool { return cands[i].ID < cands[j].ID })
	taken := make(map[*LBSpec]bool)
	moved := make(map[*ObservedLB]bool)
	var unmatched []*ObservedLB
	for _, c := range cands {
		var found *LBSpec
		for _, want := range lacking[baseOf(c.Spec)] {
			if t := target(want); !taken[want] && echoMatches(c.Spec, t, unknown) {
				found, taken[want] = t, true
				break
			}
		}
		if found == nil {
			unmatched = append(unmatched, c)
			continue
		}
		c.Spec = found
		moved[c] = true
		lbs = append(lbs, c)
	}
	if len(moved) > 0 {
		st.rekey(moved)
	}
	for _, c := range unmatched {
		var first *LBSpec
		for _, want := range lacking[baseOf(c.Spec)] {
			if !taken[want] {
				first = want
				break
			}
		}
		if first == nil {
			continue // every frontend it could hold is accounted for: it is stale
		}
		st.orphan(c, first.slot, "frontend VIPs not returned by HNS and no wanted load balancer matches it; it may hold "+first.slot)
	}
	return eps, lbs
}

// adoptListed runs adoptUnknown on the record and records what it adopted.
func (b *Backend) adoptListed(plan *Plan) {
	eps, lbs := adoptUnknown(plan, b.rec, b.unknownFields(), func(id string) bool {
		id = strings.ToLower(id)
		_, lb := b.sentLBs[id]
		_, ep := b.sentEP[id]
		return lb || ep
	})
	for _, ep := range eps {
		b.sentEP[ep.ID] = sentFromObserved(ep)
	}
	for _, o := range lbs {
		b.sentLBs[strings.ToLower(o.ID)] = sentLB{spec: o.Spec}
	}
}
