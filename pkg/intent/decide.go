package intent

import (
	"net/netip"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// Decision is what a new connection gets, by the intent.
type Decision struct {
	Verdict Verdict
	// Endpoints are the endpoints a DNAT picks from, with Weights (nil:
	// equal) and the Set they are.
	Endpoints []proxy.Endpoint
	Weights   []float64
	Set       Set
	// Masquerade: the endpoint sees a node address as the source.
	Masquerade bool
	// Filtered: the source ranges dropped the connection.
	Filtered bool
}

// Decide tells what a new connection from a client of class src, at
// address from, to frontend fe of p gets. A pod reaching itself (from is
// the address of the endpoint picked) is masqueraded too (hairpin); Decide
// does not know which endpoint is picked: see Hairpin.
func (p *Port) Decide(fe *Frontend, src Source, from netip.Addr) Decision {
	if !fe.Admits(from) {
		return Decision{Verdict: Drop, Filtered: true}
	}
	r := fe.Routes[src]
	d := Decision{Verdict: r.Verdict}
	if r.Verdict != DNAT {
		return d
	}
	d.Set, d.Masquerade = r.Set, r.Masquerade
	d.Endpoints, d.Weights = p.Endpoints(r.Set), p.Weights(r.Set)
	return d
}

// Lookup finds the frontend of p that a connection to dst (protocol is p's)
// reaches; nodePort tells that dst is one of the node's NodePort
// addresses. It returns nil when none matches.
func (p *Port) Lookup(dst netip.AddrPort, nodePort bool) *Frontend {
	for i := range p.Frontends {
		fe := &p.Frontends[i]
		if int32(dst.Port()) != fe.Port {
			continue
		}
		switch {
		case fe.Kind == NodePort && nodePort:
			return fe
		case fe.Kind != NodePort && fe.Addr == dst.Addr():
			return fe
		}
	}
	return nil
}
