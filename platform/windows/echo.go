package windows

import (
	"net/netip"
	"slices"
	"strings"
)

// What HNS returns when asked for an object is not always what it was given.
// Listing and reading back are trusted only for the fields HNS is known to
// return (the "echoed" fields); the others are taken from kproxy's own
// record of what it sent, keyed by HNS ID. docs/windows.md lists the fields.
//
// Echoed, and the identity of what is found in HNS: a load balancer's ID,
// frontend VIPs, protocol, internal and external port, endpoint IDs and the
// IPv6 flag; an endpoint's ID, address, name, MAC and remote flag.
//
// Trusted only when echoed (a zero value read back means "not said"): the
// port mapping flags, the distribution type and the source VIP of a load
// balancer, its DSR flag, and the provider address policy of a remote
// endpoint. A value read back that differs from the one sent (not zero) is a
// real difference and is reconciled.

// sentLB is what kproxy last sent for a load balancer.
type sentLB struct{ spec *LBSpec }

// sentEndpoint is what kproxy sent for an endpoint it created.
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

// adoptSent completes a fresh listing with what kproxy sent: an endpoint it
// created gets back the fields HNS did not return, and a load balancer it
// created or updated whose echoed fields all match what was sent gets the
// sent spec (with its un-echoed fields). Entries for objects that are gone
// are forgotten when forget is set (st is a full listing).
func (b *Backend) adoptSent(st *State, forget bool) {
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
		fillEndpoint(ep, s)
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
	for _, o := range st.LoadBalancers {
		id := strings.ToLower(o.ID)
		s, ok := b.sentLBs[id]
		if !ok {
			continue
		}
		seenLB[id] = true
		if echoMatches(o.Spec, s.spec) {
			o.Spec = s.spec
		}
	}
	for _, o := range st.Orphans {
		seenLB[strings.ToLower(o.ID)] = true
	}
	for id := range b.sentLBs {
		if forget && !seenLB[id] {
			delete(b.sentLBs, id)
		}
	}
}

func fillEndpoint(ep *ObservedEndpoint, s sentEndpoint) {
	if ep.Name == "" {
		ep.Name = s.name
	}
	if ep.MAC == "" {
		ep.MAC = s.mac
	}
	if !ep.ProviderAddress.IsValid() {
		ep.ProviderAddress = s.providerAddress
	}
}

// echoMatches reports whether a load balancer read back from HNS is the one
// sent: the echoed fields equal, and every other field either equal or not
// returned (zero).
func echoMatches(got, sent *LBSpec) bool {
	if got == nil || sent == nil {
		return false
	}
	if got.Protocol != sent.Protocol || got.InternalPort != sent.InternalPort || got.ExternalPort != sent.ExternalPort ||
		got.Flags&LBFlagIPv6 != sent.Flags&LBFlagIPv6 ||
		!slices.Equal(got.FrontendVIPs, sent.FrontendVIPs) || !slices.Equal(got.Endpoints, sent.Endpoints) {
		return false
	}
	return (got.PortFlags == 0 || got.PortFlags == sent.PortFlags) &&
		(got.Distribution == 0 || got.Distribution == sent.Distribution) &&
		(!got.SourceVIP.IsValid() || got.SourceVIP == sent.SourceVIP) &&
		(got.Flags&^LBFlagIPv6 == 0 || got.Flags == sent.Flags)
}
