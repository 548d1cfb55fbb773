package reconcile

import (
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// What HNS returns when asked for an object is not always what it was given.
// docs/windows.md lists the fields and where each fact comes from.
//
// Identity, always trusted: a load balancer's ID, protocol, internal and
// external port, endpoint IDs and IPv6 flag; an endpoint's ID, address and
// remote flag. IDs are compared without regard to case (HNS is not
// consistent about it).
//
// The other fields (hns.Fields): a load balancer's port mapping flags,
// distribution type, source VIP, DSR flag and frontend VIPs, an endpoint's
// provider address policy, name and MAC. For each, HNS may
//   - leave it out: a zero value read back is "not said" unless HNS was
//     seen returning the field (a non-zero value of it in a listing:
//     Echoes.Seen). A field not said is taken from kproxy's record of what
//     it sent, for an object it created or adopted (keyed by HNS ID), or
//     adopted as the plan wants it for an object kproxy has no record of
//     (after a restart, or kube-proxy's): unknown, never a difference, so a
//     restart reprograms nothing;
//   - return another value than the one sent (a changed echo). What HNS
//     answers to a creation or an update is what it holds right after it:
//     a field returned there with a different non-zero value is learned at
//     once as HNS's echo of the sent value (Echoes.Learned, per Windows
//     build) and compared against from then on. In a listing the same
//     difference may also be a change made out of band, so the first time
//     it is only suspected and the object is reprogrammed; seen again in a
//     later listing, it is learned. An object kproxy has no record of
//     (after a restart) whose field differs is reprogrammed too; its
//     answer teaches the echo. So a field HNS rewrites costs at most one
//     reprogramming per field, value and Windows build (none, once the
//     learned echoes are kept on disk, Options.EchoFile).
// Any other non-zero difference is what HNS holds, and is reconciled.

// Echoes is what kproxy knows of how HNS returns fields.
type Echoes struct {
	// Seen are the fields HNS was seen returning (a non-zero value in a
	// listing): read back zero, they are zero, not "not said".
	Seen hns.Fields
	// Build is the Windows build (and HNS version) Learned holds for.
	Build string
	// Learned maps a field and a value kproxy sends to the value HNS
	// returns for it on this build.
	Learned map[EchoKey]string
	// Suspected are differences a listing showed once (not yet learned).
	Suspected map[EchoKey]string
}

// EchoKey is a field and the value sent in it.
type EchoKey struct {
	Field hns.Fields
	Sent  string
}

func (e Echoes) clone() Echoes {
	e.Learned = maps.Clone(e.Learned)
	e.Suspected = maps.Clone(e.Suspected)
	return e
}

// unknown are the fields whose zero value read back means "not said".
func (e Echoes) unknown() hns.Fields { return hns.FieldsAll &^ e.Seen }

// same reports whether got, read back in field f, stands for sent: equal,
// or HNS's learned echo of it.
func (e Echoes) same(f hns.Fields, got, sent string) bool {
	if got == sent {
		return true
	}
	v, ok := e.Learned[EchoKey{f, sent}]
	return ok && v == got
}

// learn records that HNS returned got for sent in field f; it reports
// whether that is news.
func (e *Echoes) learn(f hns.Fields, got, sent string) bool {
	k := EchoKey{f, sent}
	if v, ok := e.Learned[k]; ok && v == got {
		return false
	}
	if e.Learned == nil {
		e.Learned = make(map[EchoKey]string)
	}
	e.Learned[k] = got
	return true
}

// Evidence returns the fields a listing shows HNS returns: those with a
// non-zero value on some object.
func Evidence(eps []hns.Endpoint, lbs []hns.LoadBalancer) hns.Fields {
	var seen hns.Fields
	for i := range eps {
		ep := &eps[i]
		if ep.IsRemote() && ep.ProviderAddress() != "" {
			seen |= hns.FieldProviderAddress
		}
		if ep.Name != "" {
			seen |= hns.FieldName
		}
		if ep.MacAddress != "" {
			seen |= hns.FieldMAC
		}
	}
	for i := range lbs {
		lb := &lbs[i]
		if lb.SourceVIP != "" {
			seen |= hns.FieldSourceVIP
		}
		if lb.Flags&^hns.LBFlagIPv6 != 0 {
			seen |= hns.FieldLBFlags
		}
		if len(lb.FrontendVIPs) > 0 {
			seen |= hns.FieldFrontendVIPs
		}
		for _, pm := range lb.PortMappings {
			if pm.Flags != 0 {
				seen |= hns.FieldPortFlags
			}
			if pm.DistributionType != 0 {
				seen |= hns.FieldDistribution
			}
		}
	}
	return seen
}

func num[T ~uint32](v T) string { return strconv.FormatUint(uint64(v), 10) }

func addr(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// lbField is one comparable field of a load balancer.
type lbField struct {
	f         hns.Fields
	got, sent string
	zero      bool // got is zero (possibly "not said")
}

func lbFields(got, sent *plan.LBSpec) []lbField {
	return []lbField{
		{hns.FieldPortFlags, num(got.PortFlags), num(sent.PortFlags), got.PortFlags == 0},
		{hns.FieldDistribution, num(got.Distribution), num(sent.Distribution), got.Distribution == 0},
		{hns.FieldSourceVIP, addr(got.SourceVIP), addr(sent.SourceVIP), !got.SourceVIP.IsValid()},
		{hns.FieldLBFlags, num(got.Flags &^ hns.LBFlagIPv6), num(sent.Flags &^ hns.LBFlagIPv6), got.Flags&^hns.LBFlagIPv6 == 0},
	}
}

// sameIdentity reports whether got and sent are the same load balancer:
// protocol, ports, IPv6 flag and endpoint set.
func sameIdentity(got, sent *plan.LBSpec) bool {
	return got.Protocol == sent.Protocol && got.InternalPort == sent.InternalPort && got.ExternalPort == sent.ExternalPort &&
		got.Flags&hns.LBFlagIPv6 == sent.Flags&hns.LBFlagIPv6 && slices.Equal(got.Endpoints, sent.Endpoints)
}

// matches reports whether a load balancer read back from HNS is sent: the
// identity equal, and every other field equal, not said, or HNS's learned
// echo of the sent value.
func (e Echoes) matches(got, sent *plan.LBSpec) bool {
	if got == nil || sent == nil || !sameIdentity(got, sent) {
		return false
	}
	unknown := e.unknown()
	if !slices.Equal(got.FrontendVIPs, sent.FrontendVIPs) && (len(got.FrontendVIPs) != 0 || unknown&hns.FieldFrontendVIPs == 0) {
		return false
	}
	for _, x := range lbFields(got, sent) {
		if !e.same(x.f, x.got, x.sent) && (!x.zero || unknown&x.f == 0) {
			return false
		}
	}
	return true
}

// learnLB learns, from a load balancer HNS answered a creation or update
// with (same identity as sent), the echoes of the fields it returned
// changed: a non-zero value other than the sent one or its known echo. It
// returns the fields learned.
func (e *Echoes) learnLB(got, sent *plan.LBSpec) hns.Fields {
	return e.learnLBFrom(got, sent, nil, nil)
}

// suspectLB is learnLB for a load balancer read in a listing: a difference
// is learned only when prev (the last record's suspicions) already holds
// it; otherwise it is added to suspects.
func (e *Echoes) suspectLB(got, sent *plan.LBSpec, prev, suspects map[EchoKey]string) hns.Fields {
	return e.learnLBFrom(got, sent, prev, suspects)
}

func (e *Echoes) learnLBFrom(got, sent *plan.LBSpec, prev, suspects map[EchoKey]string) hns.Fields {
	if got == nil || sent == nil || !sameIdentity(got, sent) ||
		(len(got.FrontendVIPs) > 0 && !slices.Equal(got.FrontendVIPs, sent.FrontendVIPs)) {
		return 0
	}
	var learned hns.Fields
	for _, x := range lbFields(got, sent) {
		if x.zero || e.same(x.f, x.got, x.sent) {
			continue
		}
		k := EchoKey{x.f, x.sent}
		if suspects != nil && prev[k] != x.got {
			suspects[k] = x.got
			continue
		}
		if e.learn(x.f, x.got, x.sent) {
			learned |= x.f
		}
	}
	return learned
}

// fillEndpoint gives an endpoint kproxy created the fields HNS did not
// return: its name and MAC whenever HNS says nothing, its provider address
// when HNS is not known to return it. A provider address HNS returns
// changed is its echo of the sent one when known (or learned: at once for
// the answer to a creation, prev and suspects nil; on its second sighting
// for a listing, as suspectLB), and then stands for the sent one.
func (e *Echoes) fillEndpoint(ep *ObservedEndpoint, s SentEndpoint, prev, suspects map[EchoKey]string) (learned hns.Fields) {
	if ep.Name == "" {
		ep.Name = s.Name
	}
	if ep.MAC == "" {
		ep.MAC = s.MAC
	}
	switch {
	case !ep.ProviderAddress.IsValid():
		if e.unknown()&hns.FieldProviderAddress != 0 {
			ep.ProviderAddress = s.ProviderAddress
		}
	case s.ProviderAddress.IsValid() && ep.ProviderAddress != s.ProviderAddress:
		got, sent := ep.ProviderAddress.String(), s.ProviderAddress.String()
		if !e.same(hns.FieldProviderAddress, got, sent) {
			k := EchoKey{hns.FieldProviderAddress, sent}
			if suspects != nil && prev[k] != got {
				suspects[k] = got
				return 0
			}
			if e.learn(hns.FieldProviderAddress, got, sent) {
				learned = hns.FieldProviderAddress
			}
		}
		ep.ProviderAddress = s.ProviderAddress // what it stands for
	}
	return learned
}

// Adoption is the result of Adopt.
type Adoption struct {
	// Record is the listing completed with what kproxy sent and with what
	// the plan wants where HNS said nothing, and the sent records of the
	// objects adopted; it replaces the last record once applied.
	Record *Record
	// Learned are the fields whose echo was learned from the listing.
	Learned hns.Fields
}

// Adopt completes a fresh listing (Observe's state, and the evidence of the
// fields it shows HNS returns) with the last record and the plan. It is
// pure: listing, last and p are not changed.
//
//   - An object kproxy sent (by HNS ID) gets back the fields HNS did not
//     return; a load balancer whose returned fields all match what was sent
//     (or its learned echo) takes the sent spec, in that spec's slot, and a
//     changed echo is learned. Records of objects the listing no longer has
//     are dropped.
//   - An object kproxy has no record of (after a restart, or kube-proxy's)
//     whose fields HNS left out and is not known to return is taken to hold
//     what the plan wants for them (adoptUnknown), and recorded.
func Adopt(listing *State, evidence hns.Fields, last *Record, p *plan.Plan) Adoption {
	st := listing.deepClone()
	rec := &Record{State: st, Sent: Sent{LBs: map[string]*plan.LBSpec{}, EPs: map[string]SentEndpoint{}}}
	if last != nil {
		rec.Echo = last.Echo.clone()
	}
	rec.Echo.Seen |= evidence
	var learned hns.Fields
	var lastSent Sent
	if last != nil {
		lastSent = last.Sent
	}

	var prevSuspects map[EchoKey]string
	if last != nil {
		prevSuspects = last.Echo.Suspected
	}
	suspects := make(map[EchoKey]string)

	// Endpoints kproxy sent.
	fill := func(ep *ObservedEndpoint) {
		s, ok := lastSent.EPs[ep.ID]
		if !ok {
			return
		}
		rec.Sent.EPs[ep.ID] = s
		if s.IP != ep.IP || s.Remote != ep.Remote {
			return // not what was sent: trust HNS
		}
		learned |= rec.Echo.fillEndpoint(ep, s, prevSuspects, suspects)
	}
	for _, ep := range st.Endpoints {
		fill(ep)
	}
	for _, ep := range st.Shadowed {
		fill(ep)
	}

	// Load balancers kproxy sent.
	var adopted map[*ObservedLB]bool
	moved := false
	st.eachUsableLB(func(o *ObservedLB) {
		id := lower(o.ID)
		s, ok := lastSent.LBs[id]
		if !ok {
			return
		}
		rec.Sent.LBs[id] = s
		learned |= rec.Echo.suspectLB(o.Spec, s, prevSuspects, suspects)
		if rec.Echo.matches(o.Spec, s) {
			moved = moved || o.Spec.Slot() != s.Slot() || o.Problem != ""
			o.Spec = s
			if adopted == nil {
				adopted = make(map[*ObservedLB]bool)
			}
			adopted[o] = true
		}
	})
	if moved {
		st.rekey(adopted)
	}
	rec.Echo.Suspected = suspects

	// What kproxy has no record of.
	if p != nil {
		eps, lbs := adoptUnknown(p, st, rec.Echo, rec.Sent.Recorded)
		for _, ep := range eps {
			rec.Sent.EPs[ep.ID] = sentFromObserved(ep)
		}
		for _, o := range lbs {
			rec.Sent.LBs[lower(o.ID)] = o.Spec
		}
	}
	return Adoption{Record: rec, Learned: learned}
}

// adoptUnknown completes, from the plan, the objects kproxy has no record of
// (recorded says which it has) whose fields HNS left out and is not known
// to return: such a field is unknown, not different, so the object is taken
// to hold what the plan wants (the provider address is the one the
// network's remote subnets give, as planned); a field HNS returned as the
// learned echo of the planned value counts as that value. Returned are the
// endpoints and load balancers so completed (they change in st).
//
// A load balancer is adopted when its identity and every field HNS did
// return match the plan's for its slot. When frontend VIPs are not said, a
// load balancer listed without VIPs in a slot the plan does not want may
// serve any wanted frontend of its protocol and port that HNS seems to lack:
// it is adopted for the first one it matches; one that matches none (its
// content changed while kproxy was away) is deleted before the first such
// frontend is programmed, since it may hold it.
func adoptUnknown(p *plan.Plan, st *State, echo Echoes, recorded func(id string) bool) (eps []*ObservedEndpoint, lbs []*ObservedLB) {
	unknown := echo.unknown()
	for _, spec := range p.Endpoints {
		ep := st.Endpoints[spec.IP]
		if ep == nil || !ep.Remote || !spec.Remote() || recorded(ep.ID) {
			continue // a local endpoint may be the CNI's: never made kproxy's
		}
		done := false
		if !ep.ProviderAddress.IsValid() && spec.ProviderAddress.IsValid() && unknown&hns.FieldProviderAddress != 0 {
			ep.ProviderAddress, done = spec.ProviderAddress, true
		}
		if ep.ProviderAddress.IsValid() && spec.ProviderAddress.IsValid() && ep.ProviderAddress != spec.ProviderAddress &&
			echo.same(hns.FieldProviderAddress, ep.ProviderAddress.String(), spec.ProviderAddress.String()) {
			ep.ProviderAddress, done = spec.ProviderAddress, true
		}
		if ep.Name == "" && unknown&hns.FieldName != 0 {
			ep.Name, done = spec.Name(), true
		}
		if ep.MAC == "" && spec.MAC != "" && unknown&hns.FieldMAC != 0 {
			ep.MAC, done = spec.MAC, true
		}
		if done {
			eps = append(eps, ep)
		}
	}

	desiredEP := p.EndpointIndex()
	// target is want without the local addresses HNS lacks, as Reconcile
	// programs it.
	scratch := make(map[netip.Addr]bool)
	target := func(want *plan.LBSpec) *plan.LBSpec {
		t, _ := resolve(want, nil, desiredEP, st, nil, scratch)
		return t
	}
	wanted := make(map[string]bool, len(p.LoadBalancers))
	for _, want := range p.LoadBalancers {
		wanted[want.Slot()] = true
		cur := st.LoadBalancers[want.Slot()]
		if cur == nil || cur.Spec == want || recorded(cur.ID) {
			continue
		}
		if t := target(want); cur.Spec.Key() != t.Key() && echo.matches(cur.Spec, t) {
			cur.Spec = t
			lbs = append(lbs, cur)
		}
	}
	if unknown&hns.FieldFrontendVIPs == 0 {
		return eps, lbs
	}

	// Frontend VIPs not said: match the load balancers listed without VIPs
	// to the wanted frontends HNS seems to lack, per family, protocol and port.
	baseOf := portOf
	lacking := make(map[portKey][]*plan.LBSpec)
	for _, want := range p.LoadBalancers {
		if len(want.FrontendVIPs) > 0 && st.LoadBalancers[want.Slot()] == nil {
			lacking[baseOf(want)] = append(lacking[baseOf(want)], want) // sorted by slot
		}
	}
	if len(lacking) == 0 {
		return eps, lbs
	}
	var cands []*ObservedLB
	st.eachUsableLB(func(o *ObservedLB) {
		if len(o.Spec.FrontendVIPs) == 0 && !wanted[o.Spec.Slot()] && !recorded(o.ID) && len(lacking[baseOf(o.Spec)]) > 0 {
			cands = append(cands, o)
		}
	})
	sort.Slice(cands, func(i, j int) bool { return cands[i].ID < cands[j].ID })
	taken := make(map[*plan.LBSpec]bool)
	moved := make(map[*ObservedLB]bool)
	var unmatched []*ObservedLB
	for _, c := range cands {
		var found *plan.LBSpec
		for _, want := range lacking[baseOf(c.Spec)] {
			if t := target(want); !taken[want] && echo.matches(c.Spec, t) {
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
		var first *plan.LBSpec
		for _, want := range lacking[baseOf(c.Spec)] {
			if !taken[want] {
				first = want
				break
			}
		}
		if first == nil {
			continue // every frontend it could hold is accounted for: it is stale
		}
		st.orphan(c, first.Slot(), "frontend VIPs not returned by HNS and no wanted load balancer matches it; it may hold "+first.Slot())
	}
	return eps, lbs
}

func lower(id string) string { return strings.ToLower(id) }
