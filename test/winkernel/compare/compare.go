package compare

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// LB is an HNS load balancer in the normal form both proxies' objects are
// compared in: endpoints named by address.
type LB struct {
	IPv6         bool
	Protocol     uint32
	FrontendVIPs []string // sorted; empty for a NodePort
	ExternalPort uint16
	InternalPort uint16
	Flags        uint32 // load balancer flags (DSR 1, IPv6 2)
	PortFlags    uint32
	Distribution uint32
	SourceVIP    string
	Endpoints    []string // addresses, sorted
}

// Slot is the frontend the load balancer occupies. Its family is its
// frontend VIP's (so that a load balancer missing the IPv6 flag pairs with
// its twin), else the IPv6 flag's.
func (l LB) Slot() string {
	vips := strings.Join(l.FrontendVIPs, ",")
	v6 := l.IPv6
	if vips == "" {
		vips = "*"
	} else {
		v6 = strings.Contains(vips, ":")
	}
	fam := "v4"
	if v6 {
		fam = "v6"
	}
	return fmt.Sprintf("%s %s %s:%d", fam, protoName(l.Protocol), vips, l.ExternalPort)
}

func (l LB) String() string {
	return fmt.Sprintf("lb %s -> %d flags=%d pflags=%d dist=%d src=%s eps=%s", l.Slot(), l.InternalPort, l.Flags,
		l.PortFlags, l.Distribution, l.SourceVIP, strings.Join(l.Endpoints, ","))
}

// EP is an HNS endpoint a proxy created (the CNI's are left out).
type EP struct {
	IP              string
	Remote          bool
	ProviderAddress string
	MAC             string // lower case
}

func (e EP) String() string {
	kind := "local"
	if e.Remote {
		kind = "remote"
	}
	return fmt.Sprintf("ep %s %s pa=%s mac=%s", e.IP, kind, e.ProviderAddress, e.MAC)
}

// Objects are one proxy's HNS objects after a step.
type Objects struct {
	LBs []LB
	EPs []EP
}

// Normalize sorts what may come in any order.
func (o *Objects) Normalize() {
	for i := range o.LBs {
		sort.Strings(o.LBs[i].FrontendVIPs)
		sort.Slice(o.LBs[i].Endpoints, func(a, b int) bool { return addrLess(o.LBs[i].Endpoints[a], o.LBs[i].Endpoints[b]) })
	}
	sort.Slice(o.LBs, func(a, b int) bool { return o.LBs[a].String() < o.LBs[b].String() })
	for i := range o.EPs {
		o.EPs[i].MAC = strings.ToLower(o.EPs[i].MAC)
	}
	sort.Slice(o.EPs, func(a, b int) bool { return addrLess(o.EPs[a].IP, o.EPs[b].IP) })
}

func addrLess(a, b string) bool {
	x, err1 := netip.ParseAddr(a)
	y, err2 := netip.ParseAddr(b)
	if err1 != nil || err2 != nil {
		return a < b
	}
	return x.Less(y)
}

func protoName(p uint32) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// Diff is one object that is not the same on both sides: a load balancer
// slot or an endpoint address, with each side's object (nil when absent).
type Diff struct {
	Upstream, Kproxy fmt.Stringer
	Key              string
}

func (d Diff) String() string {
	s := func(x fmt.Stringer) string {
		if x == nil {
			return "(none)"
		}
		return x.String()
	}
	return fmt.Sprintf("%s\n    upstream: %s\n    kproxy:   %s", d.Key, s(d.Upstream), s(d.Kproxy))
}

// Result is the comparison of one step.
type Result struct {
	// Same counts the objects identical on both sides.
	Same int
	// Explained are the differences an intended difference accounts for,
	// by the difference's ID.
	Explained map[string][]Diff
	// Unexplained are the other differences: each a failure.
	Unexplained []Diff
}

// Compare compares the objects of both proxies after step i of s.
func Compare(s *Scenario, i int, upstream, kproxy Objects) Result {
	upstream.Normalize()
	kproxy.Normalize()
	res := Result{Explained: map[string][]Diff{}}
	ctx := newContext(s, i, upstream, kproxy)
	var diffs []Diff
	ups := map[string]LB{}
	for _, l := range upstream.LBs {
		ups[l.Slot()] = l
	}
	kps := map[string]LB{}
	for _, l := range kproxy.LBs {
		kps[l.Slot()] = l
	}
	for _, slot := range unionKeys(ups, kps) {
		u, uok := ups[slot]
		k, kok := kps[slot]
		switch {
		case uok && kok && u.String() == k.String():
			res.Same++
		default:
			d := Diff{Key: "load balancer " + slot}
			if uok {
				d.Upstream = u
			}
			if kok {
				d.Kproxy = k
			}
			diffs = append(diffs, d)
		}
	}
	uep := map[string]EP{}
	for _, e := range upstream.EPs {
		uep[e.IP] = e
	}
	kep := map[string]EP{}
	for _, e := range kproxy.EPs {
		kep[e.IP] = e
	}
	for _, ip := range unionKeys(uep, kep) {
		u, uok := uep[ip]
		k, kok := kep[ip]
		switch {
		case uok && kok && u == k:
			res.Same++
		default:
			d := Diff{Key: "endpoint " + ip}
			if uok {
				d.Upstream = u
			}
			if kok {
				d.Kproxy = k
			}
			diffs = append(diffs, d)
		}
	}
	for _, d := range diffs {
		if id := ctx.explain(d); id != "" {
			res.Explained[id] = append(res.Explained[id], d)
			continue
		}
		res.Unexplained = append(res.Unexplained, d)
	}
	return res
}

func unionKeys[V any](a, b map[string]V) []string {
	seen := map[string]bool{}
	var out []string
	for k := range a {
		seen[k] = true
		out = append(out, k)
	}
	for k := range b {
		if !seen[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// FlipDSR flips the DSR flag of every ClusterIP load balancer: the
// oracle's self-test of a planner decision changed.
func FlipDSR(o *Objects) {
	for i := range o.LBs {
		if o.LBs[i].PortFlags&16 == 0 { // not an external frontend
			o.LBs[i].Flags ^= 1
		}
	}
}
