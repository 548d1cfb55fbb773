package nftables

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// setID names one of the fixed sets and maps kproxy writes elements into
// (a port's own sets, the affinity sets, get theirs from the kernel only).
type setID uint8

const (
	setNone setID = iota
	setFrontends
	setNodePorts
	setHairpin
	setPodCIDRs
	setNodePortIPs
	setNodePortRejects
	// setSlots is the first of the endpoint maps, one per endpoint set,
	// frontend kind and protocol (see slotSet).
	setSlots
	setCount = setSlots + 2*2*3
)

// slotProtos are the protocols of the endpoint maps, in their order.
var slotProtos = [3]string{"tcp", "udp", "sctp"}

// slotSet returns the endpoint map of set s, frontend kind np and proto
// (false: a protocol without maps).
func slotSet(s intent.Set, np bool, proto string) (setID, bool) {
	i := slices.Index(slotProtos[:], proto)
	if i < 0 || s > intent.Local {
		return setNone, false
	}
	return setSlots + setID(int(s)*6+b2i(np)*3+i), true
}

// setNames holds each set's name, setByName the reverse.
var setNames, setByName = func() ([setCount]string, map[string]setID) {
	var names [setCount]string
	names[setFrontends], names[setNodePorts], names[setHairpin] = MapFrontends, MapNodePorts, SetHairpin
	names[setPodCIDRs], names[setNodePortIPs], names[setNodePortRejects] = SetPodCIDRs, SetNodePorts, SetNodePortRejects
	for _, s := range []intent.Set{intent.Cluster, intent.Local} {
		for _, np := range []bool{false, true} {
			for _, proto := range slotProtos {
				id, _ := slotSet(s, np, proto)
				names[id] = slotMap(s, np, proto)
			}
		}
	}
	byName := make(map[string]setID, setCount)
	for id, n := range names {
		if n != "" {
			byName[n] = setID(id)
		}
	}
	return names, byName
}()

// setOf returns the id of the set named name (false: not a set kproxy
// writes elements into).
func setOf(name string) (setID, bool) {
	id, ok := setByName[name]
	return id, ok
}

func (s setID) String() string { return setNames[s] }

// layout is the form of a set's elements (see Elem).
type layout uint8

const (
	layoutNone      layout = iota
	layoutFrontends        // Addr . Proto . Port : Verdict
	layoutProtoPort        // Proto . Port (: Verdict in nodeports)
	layoutSlotsIP          // Addr . Port . Slot : To . ToPort
	layoutSlotsNP          // Port . Slot : To . ToPort
	layoutAddrPair         // Addr . To
	layoutAddr             // Addr
	layoutPrefix           // Addr/Bits
)

func (s setID) layout() layout {
	switch s {
	case setFrontends:
		return layoutFrontends
	case setNodePorts, setNodePortRejects:
		return layoutProtoPort
	case setHairpin:
		return layoutAddrPair
	case setPodCIDRs:
		return layoutPrefix
	case setNodePortIPs:
		return layoutAddr
	case setNone:
		return layoutNone
	}
	if (s-setSlots)%6 >= 3 {
		return layoutSlotsNP
	}
	return layoutSlotsIP
}

// verdictMap and dataMap say what a set's elements map their keys to.
func (s setID) verdictMap() bool { return s == setFrontends || s == setNodePorts }
func (s setID) dataMap() bool    { return s >= setSlots && s < setCount }

// object is the set or map, to name in a flush.
func (s setID) object() knftables.Object {
	if s.verdictMap() || s.dataMap() {
		return &knftables.Map{Name: s.String()}
	}
	return &knftables.Set{Name: s.String()}
}

// encodable says whether the netlink encoder writes the set's elements
// (the interval set of pod CIDRs is written by nft, which splits each
// prefix into the range the kernel holds).
func (s setID) encodable() bool { return s != setNone && s != setPodCIDRs }

// Elem is one element of one of kproxy's fixed sets and maps, typed in its
// set's layout. It is compact (a full render records some 110,000 of them,
// with no other allocation), and which fields hold what depends on the
// set:
//
//	frontends                 Addr . Proto . Port : Verdict
//	nodeports                 Proto . Port : Verdict
//	nodeport-rejects          Proto . Port
//	<cluster|local>-ip-<p>    Addr . Port . Slot : To . ToPort
//	<cluster|local>-np-<p>    Port . Slot : To . ToPort
//	hairpin                   Addr . To
//	nodeport-ips              Addr
//	pod-cidrs                 Addr/Bits
//
// Addresses are held as their bytes (an IPv4 address in the first four)
// and v6 says which family they are of. The verdict is shared, never
// modified (a renamed verdict is a new one). The zero Elem is no element.
// NewElem makes one from typed values, NFT returns them.
type Elem struct {
	addr, to     [16]byte
	verdict      *nft.Verdict
	slot         uint32
	port, toPort uint16
	proto, bits  uint8
	set          setID
	v6           bool
}

func putAddr(dst *[16]byte, a netip.Addr) {
	if a.Is4() {
		a4 := a.As4()
		copy(dst[:], a4[:])
		return
	}
	*dst = a.As16()
}

func (e *Elem) getAddr(b *[16]byte) netip.Addr {
	if e.v6 {
		return netip.AddrFrom16(*b)
	}
	return netip.AddrFrom4([4]byte(b[:4]))
}

// Set returns the name of the element's set.
func (e Elem) Set() string { return e.set.String() }

// id is the element with its value left out: what identifies it in its
// set (two elements with one id cannot both exist).
func (e Elem) id() Elem {
	if e.set != setHairpin {
		e.to, e.toPort = [16]byte{}, 0
	}
	e.verdict = nil
	return e
}

// sameValue reports whether e and o map their key to the same value.
func (e *Elem) sameValue(o *Elem) bool {
	if e.to != o.to || e.toPort != o.toPort {
		return false
	}
	if e.verdict == nil || o.verdict == nil {
		return e.verdict == o.verdict
	}
	return *e.verdict == *o.verdict
}

// hasValue reports whether e maps its key to a value (a map's element).
func (e *Elem) hasValue() bool { return e.set.verdictMap() || e.set.dataMap() }

// protoNames names the protocols of nft.Protocols by number.
var protoNames = func() (out [256]string) {
	for name, n := range nft.Protocols {
		out[n] = name
	}
	return out
}()

func protoValue(n uint8) nft.Value {
	if name := protoNames[n]; name != "" {
		return nft.Named(name, uint64(n))
	}
	return nft.Num(uint64(n))
}

// key returns the key's parts, in p.
func (e *Elem) key(p *[3]nft.Value) nft.Key {
	port := nft.Num(uint64(e.port))
	switch e.set.layout() {
	case layoutFrontends:
		p[0], p[1], p[2] = nft.Addr(e.getAddr(&e.addr)), protoValue(e.proto), port
		return p[:3]
	case layoutProtoPort:
		p[0], p[1] = protoValue(e.proto), port
		return p[:2]
	case layoutSlotsIP:
		p[0], p[1], p[2] = nft.Addr(e.getAddr(&e.addr)), port, nft.Num(uint64(e.slot))
		return p[:3]
	case layoutSlotsNP:
		p[0], p[1] = port, nft.Num(uint64(e.slot))
		return p[:2]
	case layoutAddrPair:
		p[0], p[1] = nft.Addr(e.getAddr(&e.addr)), nft.Addr(e.getAddr(&e.to))
		return p[:2]
	case layoutAddr:
		p[0] = nft.Addr(e.getAddr(&e.addr))
		return p[:1]
	case layoutPrefix:
		p[0] = nft.Prefix(netip.PrefixFrom(e.getAddr(&e.addr), int(e.bits)))
		return p[:1]
	}
	return nil
}

// data returns a data map element's value, in p (nil for others).
func (e *Elem) data(p *[2]nft.Value) nft.Key {
	if !e.set.dataMap() {
		return nil
	}
	p[0], p[1] = nft.Addr(e.getAddr(&e.to)), nft.Num(uint64(e.toPort))
	return p[:2]
}

// appendKey appends the key's text to b; appendValue appends the value's
// (nothing for a set's element).
func (e *Elem) appendKey(b []byte) []byte {
	var p [3]nft.Value
	return e.key(&p).Append(b)
}

func (e *Elem) appendValue(b []byte) []byte {
	if e.verdict != nil {
		return e.verdict.Append(b)
	}
	var p [2]nft.Value
	return e.data(&p).Append(b)
}

// NFT returns the element as typed values (no value for a set's element;
// the zero nft.Elem for the zero Elem).
func (e Elem) NFT() nft.Elem {
	var k [3]nft.Value
	var d [2]nft.Value
	out := nft.Elem{Key: slices.Clone(e.key(&k)), Data: slices.Clone(e.data(&d))}
	if e.verdict != nil {
		v := *e.verdict
		out.Verdict = &v
	}
	return out
}

// String writes the element as nft does: "key", or "key : value".
func (e Elem) String() string {
	b := e.appendKey(nil)
	if e.hasValue() {
		b = append(b, " : "...)
		b = e.appendValue(b)
	}
	return string(b)
}

// errBadElem says a value does not fit the set's layout.
var errBadElem = errors.New("not an element of the set's layout")

// NewElem returns the element of set in the set's layout (see Elem):
// e's key parts must be the layout's, in order (a protocol may be named
// or a number), and e must have a verdict for a verdict map, a value of
// an address and a port for a data map, neither for a set.
func NewElem(set string, e nft.Elem) (Elem, error) {
	id, ok := setOf(set)
	if !ok {
		return Elem{}, fmt.Errorf("nftables element of %q: %w: not one of kproxy's sets", set, errBadElem)
	}
	out := Elem{set: id}
	var bad error
	fail := func(err error) {
		if bad == nil {
			bad = err
		}
	}
	fam := 0 // 4 or 6 once an address was read
	addr := func(v nft.Value, kind nft.Kind, dst *[16]byte) {
		a := v.Addr
		if kind == nft.KindPrefix {
			a = v.Prefix.Addr()
		}
		f := 4
		if a.Is6() {
			f = 6
		}
		switch {
		case v.Kind != kind || !a.IsValid() || a.Zone() != "":
			fail(fmt.Errorf("%w: %s is not an address or prefix", errBadElem, v))
		case fam != 0 && f != fam:
			fail(fmt.Errorf("%w: addresses of two families", errBadElem))
		default:
			fam = f
			putAddr(dst, a)
		}
	}
	num := func(v nft.Value, max uint64) uint64 {
		if v.Kind != nft.KindNum || v.Num > max {
			fail(fmt.Errorf("%w: %s is not a number up to %d", errBadElem, v, max))
		}
		return v.Num
	}
	k := e.Key
	var p [3]nft.Value
	if want := len(out.key(&p)); len(k) != want {
		return Elem{}, fmt.Errorf("nftables element %s of %s: %w: %d parts, want %d", e, set, errBadElem, len(k), want)
	}
	switch id.layout() {
	case layoutFrontends:
		addr(k[0], nft.KindAddr, &out.addr)
		out.proto, out.port = uint8(num(k[1], 255)), uint16(num(k[2], 65535))
	case layoutProtoPort:
		out.proto, out.port = uint8(num(k[0], 255)), uint16(num(k[1], 65535))
	case layoutSlotsIP:
		addr(k[0], nft.KindAddr, &out.addr)
		out.port, out.slot = uint16(num(k[1], 65535)), uint32(num(k[2], 1<<32-1))
	case layoutSlotsNP:
		out.port, out.slot = uint16(num(k[0], 65535)), uint32(num(k[1], 1<<32-1))
	case layoutAddrPair:
		addr(k[0], nft.KindAddr, &out.addr)
		addr(k[1], nft.KindAddr, &out.to)
	case layoutAddr:
		addr(k[0], nft.KindAddr, &out.addr)
	case layoutPrefix:
		addr(k[0], nft.KindPrefix, &out.addr)
		out.bits = uint8(max(k[0].Prefix.Bits(), 0))
	}
	switch {
	case id.verdictMap():
		if e.Verdict == nil || e.Data != nil {
			fail(fmt.Errorf("%w: a verdict map's element needs a verdict", errBadElem))
			break
		}
		if err := checkVerdict(e.Verdict); err != nil {
			fail(err)
			break
		}
		v := *e.Verdict
		out.verdict = &v
	case id.dataMap():
		if len(e.Data) != 2 || e.Verdict != nil {
			fail(fmt.Errorf("%w: a data map's element needs an address and a port", errBadElem))
			break
		}
		addr(e.Data[0], nft.KindAddr, &out.to)
		out.toPort = uint16(num(e.Data[1], 65535))
	case e.Data != nil || e.Verdict != nil:
		fail(fmt.Errorf("%w: a set's element has no value", errBadElem))
	}
	if bad != nil {
		return Elem{}, fmt.Errorf("nftables element %s of %s: %w", e, set, bad)
	}
	out.v6 = fam == 6
	return out, nil
}

// checkVerdict refuses a verdict a map element cannot hold: a jump or
// goto without a chain (or with a name the kernel refuses, or a port's
// own chain not named yet), a verdict nft does not know.
func checkVerdict(v *nft.Verdict) error {
	switch v.Kind {
	case "accept", "drop", "return", "continue":
		if v.Chain == "" {
			return nil
		}
	case "jump", "goto":
		if v.Chain != "" && len(v.Chain) <= 255 && !strings.ContainsRune(v.Chain, 0) && !strings.HasPrefix(v.Chain, rolePrefix) {
			return nil
		}
	}
	return fmt.Errorf("%w: verdict %q", errBadElem, v.String())
}

// FlushOp returns the operation that deletes every element of set, one of
// the sets the netlink encoder writes.
func FlushOp(set string) (ElemOp, error) {
	id, ok := setOf(set)
	if !ok || !id.encodable() {
		return ElemOp{}, fmt.Errorf("nftables: flushing %q: %w", set, errNotEncodable)
	}
	return ElemOp{Flush: true, Elem: Elem{set: id}}, nil
}

// The renderer's elements. Ports and slots are validated where they come
// from (pkg/intent): they fit.

// setAddr stores a at dst, e.addr or e.to.
func (e *Elem) setAddr(dst *[16]byte, a netip.Addr) {
	putAddr(dst, a)
	e.v6 = a.Is6()
}

// dispatchElem is a frontend's element of the frontends map (a NodePort's
// of nodeports, whose key has no address: a invalid).
func dispatchElem(a netip.Addr, proto uint8, port int32, v *nft.Verdict) Elem {
	if !a.IsValid() {
		return Elem{set: setNodePorts, proto: proto, port: uint16(port), verdict: v}
	}
	e := Elem{set: setFrontends, proto: proto, port: uint16(port), verdict: v}
	e.setAddr(&e.addr, a)
	return e
}

// rejectElem is a NodePort's element of nodeport-rejects.
func rejectElem(proto uint8, port int32) Elem {
	return Elem{set: setNodePortRejects, proto: proto, port: uint16(port)}
}

// slotElem is slot of a frontend (address a, or a NodePort: a invalid) in
// endpoint map set: the endpoint ep.
func slotElem(set setID, a netip.Addr, port int32, slot int, ep netip.AddrPort) Elem {
	e := Elem{set: set, port: uint16(port), slot: uint32(slot), toPort: ep.Port()}
	e.setAddr(&e.to, ep.Addr())
	if a.IsValid() {
		e.setAddr(&e.addr, a)
	}
	return e
}

func hairpinElem(h netip.Addr) Elem {
	e := Elem{set: setHairpin}
	e.setAddr(&e.addr, h)
	e.setAddr(&e.to, h)
	return e
}

func nodePortIPElem(a netip.Addr) Elem {
	e := Elem{set: setNodePortIPs}
	e.setAddr(&e.addr, a)
	return e
}

func podCIDRElem(p netip.Prefix) Elem {
	e := Elem{set: setPodCIDRs, bits: uint8(p.Bits())}
	e.setAddr(&e.addr, p.Addr())
	return e
}
