package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

// The hot path over netlink. A transaction of element operations only (an
// endpoint change, a Service added or removed, the canaries) is encoded
// here as the nfnetlink batch nft itself would send, and System sends it on
// a socket it keeps open. nft -f closes its socket when it exits, and the
// kernel makes that close wait for the release of what the transaction
// deleted (an RCU grace period, about 20 ms here), whatever the table's
// size; a socket that stays open does not wait. The elements are typed
// (Elem): their keys and values are written from their numbers and
// address bytes, nothing is parsed. Anything this file does not encode
// (the interval set of pod CIDRs, an address of the other family, a
// verdict the kernel would refuse) goes through nft -f as before.

// Netlink constants (linux/netlink.h, linux/netfilter/nfnetlink.h,
// linux/netfilter/nf_tables.h), written out so that the encoding builds
// and is tested on any OS.
const (
	nlmsgError         = 2
	nlmFRequest        = 0x1
	nlmFAck            = 0x4
	nlmFCreate         = 0x400
	nlaFNested         = 0x8000
	nfnlSubsysNFTables = 10
	nfnlMsgBatchBegin  = 0x10
	nfnlMsgBatchEnd    = 0x11
	nftMsgNewSetElem   = 12
	nftMsgDelSetElem   = 14
	nftMsgNewTable     = 0
	nftMsgGetTable     = 1
	nftaTableName      = 1
	nftMsgNewRule      = 6
	nftMsgGetRule      = 7
	nlmsgDone          = 3
	nlmFDump           = 0x300 // NLM_F_ROOT | NLM_F_MATCH
	nftaRuleTable      = 1
	nftaRuleChain      = 2
	nfprotoIPv4        = 2
	nfprotoIPv6        = 10

	nftaSetElemListTable    = 1
	nftaSetElemListSet      = 2
	nftaSetElemListElements = 3
	nftaListElem            = 1
	nftaSetElemKey          = 1
	nftaSetElemData         = 2
	nftaDataValue           = 1
	nftaDataVerdict         = 2
	nftaVerdictCode         = 1
	nftaVerdictChain        = 2

	nlmsgHdrLen = 16
)

// Verdict codes (linux/netfilter.h and nf_tables.h).
var verdictCodes = map[string]int32{"drop": 0, "accept": 1, "continue": -1, "return": -5, "jump": -3, "goto": -4}

// errNotEncodable says a transaction has an operation this file does not
// encode (it goes through nft -f).
var errNotEncodable = errors.New("not encodable as a netlink batch")

// The layout of nftables registers: each part of a concatenation takes a
// multiple of 4 bytes; addresses and ports are in network order, a
// protocol is one byte, numgen's slot a 32-bit number in host order.

// appendAddr appends address bytes b (of an element of family v6) to w.
func appendAddr(w []byte, b *[16]byte, v6 bool) []byte {
	if v6 {
		return append(w, b[:]...)
	}
	return append(w, b[:4]...)
}

func appendProto(w []byte, p uint8) []byte { return append(w, p, 0, 0, 0) }

func appendService(w []byte, port uint16) []byte {
	return append(binary.BigEndian.AppendUint16(w, port), 0, 0)
}

// appendKey appends e's key in its set's layout to w.
func appendKey(w []byte, e *Elem) []byte {
	switch e.set.layout() {
	case layoutFrontends:
		w = appendAddr(w, &e.addr, e.v6)
		w = appendProto(w, e.proto)
		return appendService(w, e.port)
	case layoutProtoPort:
		return appendService(appendProto(w, e.proto), e.port)
	case layoutSlotsIP:
		w = appendAddr(w, &e.addr, e.v6)
		w = appendService(w, e.port)
		return binary.NativeEndian.AppendUint32(w, e.slot)
	case layoutSlotsNP:
		return binary.NativeEndian.AppendUint32(appendService(w, e.port), e.slot)
	case layoutAddrPair:
		return appendAddr(appendAddr(w, &e.addr, e.v6), &e.to, e.v6)
	case layoutAddr:
		return appendAddr(w, &e.addr, e.v6)
	}
	return w
}

// appendData appends a data map element's value to w.
func appendData(w []byte, e *Elem) []byte {
	return appendService(appendAddr(w, &e.to, e.v6), e.toPort)
}

// hasAddr reports whether e holds an address (whose family must be the
// table's): every layout but proto . port has one, in its key or value.
func (e *Elem) hasAddr() bool { return e.set.layout() != layoutProtoPort }

// nlBuf builds netlink messages and attributes in a buffer. With chunk
// set, a message that might not fit in what is left of the buffer starts
// a new one of chunk bytes (the batch is sent as one datagram from all of
// them): a full sync's megabytes are never copied to grow one buffer, and
// no more is allocated than the messages take, give or take a chunk.
type nlBuf struct {
	b     []byte
	done  [][]byte
	chunk int
}

// chunkReserve is more than one message takes (an element list stops
// growing past maxNetlinkListBytes; one element and the headers are at
// most a few hundred bytes more).
const chunkReserve = maxNetlinkListBytes + 4<<10

// bulkChunk is the size of a large batch's buffers.
const bulkChunk = 1 << 20

// buffers returns what was written, in order.
func (w *nlBuf) buffers() [][]byte {
	if len(w.b) == 0 {
		return w.done
	}
	return append(w.done, w.b)
}

func (w *nlBuf) align() {
	for len(w.b)%4 != 0 {
		w.b = append(w.b, 0)
	}
}

// msg starts a message; end fills its length in.
func (w *nlBuf) msg(typ, flags uint16, seq uint32, family uint8, resID uint16) int {
	if w.chunk > 0 && cap(w.b)-len(w.b) < chunkReserve {
		if len(w.b) > 0 {
			w.done = append(w.done, w.b)
		}
		w.b = make([]byte, 0, w.chunk)
	}
	start := len(w.b)
	w.b = binary.NativeEndian.AppendUint32(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.NativeEndian.AppendUint16(w.b, flags)
	w.b = binary.NativeEndian.AppendUint32(w.b, seq)
	w.b = binary.NativeEndian.AppendUint32(w.b, 0)
	w.b = append(w.b, family, 0) // nfgenmsg: family, NFNETLINK_V0
	w.b = binary.BigEndian.AppendUint16(w.b, resID)
	return start
}

// nest starts an attribute holding others (or raw data); end closes it.
func (w *nlBuf) nest(typ uint16) int {
	start := len(w.b)
	w.b = binary.NativeEndian.AppendUint16(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	return start
}

func (w *nlBuf) endAttr(start int) {
	binary.NativeEndian.PutUint16(w.b[start:], uint16(len(w.b)-start))
	w.align()
}

func (w *nlBuf) endMsg(start int) {
	w.align()
	binary.NativeEndian.PutUint32(w.b[start:], uint32(len(w.b)-start))
}

func (w *nlBuf) attr(typ uint16, data []byte) {
	s := w.nest(typ)
	w.b = append(w.b, data...)
	w.endAttr(s)
}

func (w *nlBuf) str(typ uint16, s string) {
	st := w.nest(typ)
	w.b = append(w.b, s...)
	w.b = append(w.b, 0)
	w.endAttr(st)
}

// maxNetlinkElems bounds the element operations of a partial transaction
// sent over netlink (larger ones, a burst of new Services, go through
// nft -f), maxBulkElems those of a full sync's batch (see Tx.Split);
// maxNetlinkMsgElems and maxNetlinkListBytes bound one message's elements
// and their attribute, whose length field has 16 bits (an element takes
// at most a few hundred bytes: a verdict names a chain of at most 255).
const (
	maxNetlinkElems     = 4096
	maxBulkElems        = 1 << 22
	maxNetlinkMsgElems  = 512
	maxNetlinkListBytes = 60 << 10
)

// nlBatch is an encoded batch: its bytes, and the sequence numbers of the
// messages whose acknowledgement the sender waits for.
type nlBatch struct {
	// data holds the messages, in order, in one or more buffers (sent
	// as one datagram; no message spans two).
	data      [][]byte
	begin     uint32 // the batch begin's (the kernel reports a failed commit on it)
	first     uint32 // the first element message's
	messages  int    // element messages, each acknowledged
	endSeqNum uint32
}

// size returns the batch's length in bytes.
func (b *nlBatch) size() int {
	n := 0
	for _, d := range b.data {
		n += len(d)
	}
	return n
}

// nfproto is the netfilter protocol family of an nftables family (ip and
// ip6 only).
func nfproto(family knftables.Family) (uint8, bool) {
	switch family {
	case knftables.IPv4Family:
		return nfprotoIPv4, true
	case knftables.IPv6Family:
		return nfprotoIPv6, true
	}
	return 0, false
}

// encodeRuleDump encodes the request for a dump of the rules of one chain
// of a table: the kernel filters the dump by table and chain, so its cost
// is that chain's, not the table's.
func encodeRuleDump(proto uint8, table, chain string, seq uint32) []byte {
	w := &nlBuf{}
	m := w.msg(nfnlSubsysNFTables<<8|nftMsgGetRule, nlmFRequest|nlmFDump, seq, proto, 0)
	w.str(nftaRuleTable, table)
	w.str(nftaRuleChain, chain)
	w.endMsg(m)
	return w.b
}

// encodeTableDump encodes the request for a dump of every table of every
// family (names only: the kernel sends no chain, set or element).
func encodeTableDump(seq uint32) []byte {
	w := &nlBuf{}
	m := w.msg(nfnlSubsysNFTables<<8|nftMsgGetTable, nlmFRequest|nlmFDump, seq, 0, 0)
	w.endMsg(m)
	return w.b
}

// familyNames are nftables' family names by netfilter protocol number.
var familyNames = map[uint8]string{1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}

// walkDump reads one buffer of a dump's answers to request seq: each is
// called with every message of the request but the end (NLMSG_DONE) and
// an error; messages of other requests are skipped. It reports whether
// the dump is done, and the kernel's error.
func walkDump(b []byte, seq uint32, each func(typ uint16, msg []byte)) (done bool, err error) {
	for len(b) >= 16 {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		s := binary.NativeEndian.Uint32(b[8:12])
		if l < 16 || l > len(b) {
			return false, fmt.Errorf("a truncated netlink message (%d bytes of %d)", len(b), l)
		}
		if s == seq {
			switch typ {
			case nlmsgDone:
				return true, nil
			case nlmsgError:
				if l >= 20 {
					if n := int32(binary.NativeEndian.Uint32(b[16:20])); n != 0 {
						return true, errnoOf(-n)
					}
				}
				return true, nil
			default:
				each(typ, b[:l])
			}
		}
		b = b[(l+3)&^3:]
	}
	return false, nil
}

// dumpedTables reads one buffer of a table dump's answers to request seq:
// "family name" of each table in it, whether the dump is done, and the
// kernel's error.
func dumpedTables(b []byte, seq uint32) (tables []string, done bool, err error) {
	done, err = walkDump(b, seq, func(typ uint16, m []byte) {
		if typ != nfnlSubsysNFTables<<8|nftMsgNewTable || len(m) < 20 {
			return
		}
		fam, ok := familyNames[m[16]]
		if !ok {
			fam = fmt.Sprintf("family-%d", m[16])
		}
		if name, ok := stringAttr(m[20:], nftaTableName); ok {
			tables = append(tables, fam+" "+name)
		}
	})
	return tables, done, err
}

// stringAttr returns the NUL-terminated string attribute typ of attrs.
func stringAttr(attrs []byte, typ uint16) (string, bool) {
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs[0:2]))
		t := binary.NativeEndian.Uint16(attrs[2:4]) &^ nlaFNested
		if l < 4 || l > len(attrs) {
			return "", false
		}
		if t == typ {
			v := attrs[4:l]
			if i := bytes.IndexByte(v, 0); i >= 0 {
				v = v[:i]
			}
			return string(v), true
		}
		attrs = attrs[(l+3)&^3:]
	}
	return "", false
}

// countDumpedRules reads one buffer of a rule dump's answers to request
// seq: the rules in it, whether the dump is done, and the kernel's error.
func countDumpedRules(b []byte, seq uint32) (rules int, done bool, err error) {
	done, err = walkDump(b, seq, func(typ uint16, _ []byte) {
		if typ == nfnlSubsysNFTables<<8|nftMsgNewRule {
			rules++
		}
	})
	return rules, done, err
}

// encodeBatch encodes element operations of family's kproxy table as one
// nfnetlink batch, with sequence numbers from seq on. Consecutive
// operations on one set with one verb share a message, as nft sends them.
func encodeBatch(family knftables.Family, ops []ElemOp, seq uint32, limit int) (*nlBatch, error) {
	if len(ops) == 0 || len(ops) > limit {
		return nil, fmt.Errorf("%w: %d operations", errNotEncodable, len(ops))
	}
	proto, ok := nfproto(family)
	if !ok {
		return nil, fmt.Errorf("%w: family %q", errNotEncodable, family)
	}
	v6 := proto == nfprotoIPv6
	w := &nlBuf{}
	if len(ops) > maxNetlinkElems {
		w.chunk = bulkChunk
	} else {
		w.b = make([]byte, 0, 256+len(ops)*96)
	}
	out := &nlBatch{begin: seq}
	m := w.msg(nfnlMsgBatchBegin, nlmFRequest, seq, 0, nfnlSubsysNFTables)
	w.endMsg(m)
	seq++
	out.first = seq
	var msgStart, listStart, inMsg int
	var cur *ElemOp
	closeMsg := func() {
		if cur != nil {
			w.endAttr(listStart)
			w.endMsg(msgStart)
			out.messages++
			seq++
		}
		cur, inMsg = nil, 0
	}
	var scratch []byte // a key or value, before it is copied into w
	for i := range ops {
		op := &ops[i]
		if !op.set.encodable() {
			return nil, fmt.Errorf("%w: set %q", errNotEncodable, op.Set())
		}
		if op.Flush {
			// A deletion naming no element flushes the set.
			closeMsg()
			m := w.msg(nfnlSubsysNFTables<<8|nftMsgDelSetElem, nlmFRequest|nlmFAck, seq, proto, 0)
			w.str(nftaSetElemListTable, TableName)
			w.str(nftaSetElemListSet, op.Set())
			w.endMsg(m)
			out.messages++
			seq++
			continue
		}
		if op.hasAddr() && op.v6 != v6 {
			return nil, fmt.Errorf("%w: element %s of %s: an address of the other family", errNotEncodable, op.Elem, op.Set())
		}
		var vd *nft.Verdict
		if !op.Delete && op.set.verdictMap() {
			if vd = op.verdict; vd == nil || checkVerdict(vd) != nil {
				return nil, fmt.Errorf("%w: element %s of %s: no verdict the kernel takes", errNotEncodable, op.Elem, op.Set())
			}
		}
		if cur == nil || cur.set != op.set || cur.Delete != op.Delete || inMsg >= maxNetlinkMsgElems || len(w.b)-listStart > maxNetlinkListBytes {
			closeMsg()
			typ, flags := uint16(nfnlSubsysNFTables<<8|nftMsgNewSetElem), uint16(nlmFRequest|nlmFAck|nlmFCreate)
			if op.Delete {
				typ, flags = nfnlSubsysNFTables<<8|nftMsgDelSetElem, nlmFRequest|nlmFAck
			}
			msgStart = w.msg(typ, flags, seq, proto, 0)
			w.str(nftaSetElemListTable, TableName)
			w.str(nftaSetElemListSet, op.Set())
			listStart = w.nest(nftaSetElemListElements | nlaFNested)
			cur = op
		}
		inMsg++
		el := w.nest(nftaListElem | nlaFNested)
		scratch = appendKey(scratch[:0], &op.Elem)
		k := w.nest(nftaSetElemKey | nlaFNested)
		w.attr(nftaDataValue, scratch)
		w.endAttr(k)
		if !op.Delete {
			switch {
			case vd != nil:
				w.verdict(vd)
			case op.set.dataMap():
				scratch = appendData(scratch[:0], &op.Elem)
				d := w.nest(nftaSetElemData | nlaFNested)
				w.attr(nftaDataValue, scratch)
				w.endAttr(d)
			}
		}
		w.endAttr(el)
	}
	closeMsg()
	m = w.msg(nfnlMsgBatchEnd, nlmFRequest, seq, 0, nfnlSubsysNFTables)
	w.endMsg(m)
	out.endSeqNum = seq
	out.data = w.buffers()
	return out, nil
}

// verdict writes a map element's verdict (checked: see checkVerdict).
func (w *nlBuf) verdict(v *nft.Verdict) {
	d := w.nest(nftaSetElemData | nlaFNested)
	vd := w.nest(nftaDataVerdict | nlaFNested)
	w.attr(nftaVerdictCode, binary.BigEndian.AppendUint32(nil, uint32(verdictCodes[v.Kind])))
	if v.Chain != "" {
		w.str(nftaVerdictChain, v.Chain)
	}
	w.endAttr(vd)
	w.endAttr(d)
}

// ackState collects the kernel's answers to one batch.
type ackState struct {
	b     *nlBatch
	acked map[uint32]bool
	err   error
}

func newAckState(b *nlBatch) *ackState { return &ackState{b: b, acked: map[uint32]bool{}} }

// done reports whether every element message has been answered.
func (s *ackState) done() bool { return len(s.acked) == s.b.messages }

// read parses netlink messages the kernel sent: acknowledgements (error 0)
// and errors of the batch's messages. Messages of other sequence numbers
// (a batch given up on earlier) are ignored.
func (s *ackState) read(buf []byte) error {
	for len(buf) >= nlmsgHdrLen {
		l := binary.NativeEndian.Uint32(buf)
		if l < nlmsgHdrLen || int(l) > len(buf) {
			return fmt.Errorf("netlink: malformed message of %d bytes in %d", l, len(buf))
		}
		typ := binary.NativeEndian.Uint16(buf[4:])
		seq := binary.NativeEndian.Uint32(buf[8:])
		body := buf[nlmsgHdrLen:l]
		next := (int(l) + 3) &^ 3
		if next > len(buf) {
			next = len(buf)
		}
		buf = buf[next:]
		if typ != nlmsgError || seq < s.b.begin || seq > s.b.endSeqNum {
			continue
		}
		if len(body) < 4 {
			return errors.New("netlink: short error message")
		}
		code := int32(binary.NativeEndian.Uint32(body))
		if code != 0 && s.err == nil {
			s.err = errnoError(-code, seq, s.b)
		}
		if seq >= s.b.first && seq < s.b.first+uint32(s.b.messages) {
			s.acked[seq] = true
		}
	}
	if len(buf) > 0 {
		return fmt.Errorf("netlink: %d bytes left after the last message", len(buf))
	}
	return nil
}

// errnoError is the error of a batch answered with errno n on message seq.
// errnoOf is the kernel's error n (positive), ENOENT also ErrNotFound.
func errnoOf(n int32) error {
	if n == 2 {
		return fmt.Errorf("netlink: %w: %w", syscall.Errno(n), ErrNotFound)
	}
	return fmt.Errorf("netlink: %w", syscall.Errno(n))
}

func errnoError(n int32, seq uint32, b *nlBatch) error {
	what := "the commit"
	if seq != b.begin {
		what = fmt.Sprintf("element message %d of %d", seq-b.first+1, b.messages)
	}
	err := fmt.Errorf("netlink: %s: %w", what, syscall.Errno(n))
	if n == 2 { // ENOENT: the table, a set or a chain is gone
		err = fmt.Errorf("%w: %w", err, ErrNotFound)
	}
	return err
}
