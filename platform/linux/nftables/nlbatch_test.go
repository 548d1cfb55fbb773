package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// Keys and values in the layout of nftables registers: each part of a
// concatenation padded to 4 bytes, addresses and ports in network order,
// numgen's slot in host order (TestKernelNFTNetlinkElements in
// platform/linux checks the same against what nft -f writes).
func TestEncodeConcat(t *testing.T) {
	slot1 := binary.NativeEndian.AppendUint32(nil, 1)
	for _, tc := range []struct {
		text   string
		fields []field
		v6     bool
		want   []byte
	}{
		{"10.96.0.1 . tcp . 80", []field{fieldAddr, fieldProto, fieldService}, false, []byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}},
		{"sctp . 30001", []field{fieldProto, fieldService}, false, []byte{132, 0, 0, 0, 0x75, 0x31, 0, 0}},
		{"10.96.0.1 . 443 . 1", []field{fieldAddr, fieldService, fieldSlot}, false, append([]byte{10, 96, 0, 1, 1, 0xbb, 0, 0}, slot1...)},
		{"fd00::1 . 8080", []field{fieldAddr, fieldService}, true, []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x1f, 0x90, 0, 0}},
		{"17 . 53", []field{fieldProto, fieldService}, false, []byte{17, 0, 0, 0, 0, 53, 0, 0}},
	} {
		got, err := encodeConcat(nil, tc.text, tc.fields, tc.v6)
		if err != nil {
			t.Errorf("%q: %v", tc.text, err)
			continue
		}
		if string(got) != string(tc.want) {
			t.Errorf("%q: % x, want % x", tc.text, got, tc.want)
		}
	}
}

// What the encoder does not know goes through nft -f: a set it has no
// layout for (a port's own sets, the interval set of pod CIDRs), a value
// it cannot read, an address of the other family, too many operations.
func TestEncodeBatchRefuses(t *testing.T) {
	for _, ops := range [][]ElemOp{
		{{Set: SetPodCIDRs, Key: "10.0.0.0/8"}},
		{{Set: "port-abc-affinity-1", Key: "10.0.0.1"}},
		{{Set: MapFrontends, Key: "10.0.0.1 . tcp . 80", Value: "dnat to 10.0.0.2"}},
		{{Set: MapFrontends, Key: "fd00::1 . tcp . 80", Value: "drop"}},
		{{Set: MapFrontends, Key: "10.0.0.1 . tcp", Value: "drop"}},
		{{Set: "cluster-ip-tcp", Key: "10.0.0.1 . 80 . x", Value: "10.0.0.2 . 80"}},
		{{Set: "cluster-xx-tcp", Key: "10.0.0.1 . 80 . 0", Value: "10.0.0.2 . 80"}},
		{{Set: SetHairpin, Key: "10.0.0.1 . 10.0.0.1", Value: "drop"}},
		nil,
		make([]ElemOp, maxNetlinkElems+1),
	} {
		if b, err := encodeBatch(knftables.IPv4Family, ops, 1, maxNetlinkElems); err == nil || !errors.Is(err, errNotEncodable) {
			t.Errorf("%.80v: encoded (%v, %v)", ops, b != nil, err)
		}
	}
}

// A batch: begin, one message per run of one verb on one set, end; each
// element message asks for an acknowledgement; the answers are matched by
// sequence number, errors named, ENOENT is IsNotFound.
func TestEncodeBatchAndAcks(t *testing.T) {
	ops := []ElemOp{
		{Delete: true, Set: "cluster-ip-tcp", Key: "10.96.0.1 . 80 . 0"},
		{Delete: true, Set: MapFrontends, Key: "0.0.0.0 . tcp . 0"},
		{Set: "cluster-ip-tcp", Key: "10.96.0.1 . 80 . 0", Value: "10.128.0.1 . 8080"},
		{Set: "cluster-ip-tcp", Key: "10.96.0.1 . 80 . 1", Value: "10.128.0.2 . 8080"},
		{Set: MapFrontends, Key: "10.96.0.1 . tcp . 80", Value: "goto dnat-cluster-ip-tcp-r2"},
		{Set: MapFrontends, Key: "0.0.0.0 . tcp . 0", Value: "drop"},
	}
	b, err := encodeBatch(knftables.IPv4Family, ops, 100, maxNetlinkElems)
	if err != nil {
		t.Fatal(err)
	}
	type msg struct {
		typ, flags uint16
		seq        uint32
	}
	var msgs []msg
	for buf := b.bytes(); len(buf) > 0; {
		l := binary.NativeEndian.Uint32(buf)
		msgs = append(msgs, msg{binary.NativeEndian.Uint16(buf[4:]), binary.NativeEndian.Uint16(buf[6:]), binary.NativeEndian.Uint32(buf[8:])})
		if l%4 != 0 || int(l) > len(buf) {
			t.Fatalf("message length %d", l)
		}
		buf = buf[l:]
	}
	del, add := uint16(nfnlSubsysNFTables<<8|nftMsgDelSetElem), uint16(nfnlSubsysNFTables<<8|nftMsgNewSetElem)
	want := []msg{{nfnlMsgBatchBegin, nlmFRequest, 100}, {del, nlmFRequest | nlmFAck, 101}, {del, nlmFRequest | nlmFAck, 102},
		{add, nlmFRequest | nlmFAck | nlmFCreate, 103}, {add, nlmFRequest | nlmFAck | nlmFCreate, 104}, {nfnlMsgBatchEnd, nlmFRequest, 105}}
	if len(msgs) != len(want) {
		t.Fatalf("messages %v, want %v", msgs, want)
	}
	for i := range want {
		if msgs[i] != want[i] {
			t.Errorf("message %d: %+v, want %+v", i, msgs[i], want[i])
		}
	}
	if !strings.Contains(string(b.bytes()), "dnat-cluster-ip-tcp-r2\x00") {
		t.Error("the goto's chain name is not in the batch")
	}

	ack := func(seq uint32, code int32) []byte {
		m := make([]byte, 36)
		binary.NativeEndian.PutUint32(m, 36)
		binary.NativeEndian.PutUint16(m[4:], nlmsgError)
		binary.NativeEndian.PutUint32(m[8:], seq)
		binary.NativeEndian.PutUint32(m[16:], uint32(code))
		return m
	}
	st := newAckState(b)
	if err := st.read(append(ack(7, -2), ack(101, 0)...)); err != nil || st.done() || st.err != nil {
		t.Fatalf("after one ack (and one of another batch): done %v, err %v/%v", st.done(), err, st.err)
	}
	if err := st.read(append(append(ack(102, 0), ack(103, -2 /* ENOENT */)...), ack(104, 0)...)); err != nil || !st.done() {
		t.Fatalf("after every ack: done %v, err %v", st.done(), err)
	}
	if st.err == nil || !IsNotFound(st.err) || !strings.Contains(st.err.Error(), "element message 3 of 4") {
		t.Errorf("error %v, want message 3's ENOENT as not found", st.err)
	}
	st = newAckState(b)
	_ = st.read(ack(100, -16 /* EBUSY */))
	if st.err == nil || !strings.Contains(st.err.Error(), "the commit") || IsNotFound(st.err) {
		t.Errorf("a failed commit: %v", st.err)
	}
	if err := newAckState(b).read([]byte{40, 0, 0, 0, 2, 0}); err == nil {
		t.Error("a truncated message was read")
	}
}

// A full sync's batch: a flush is a deletion naming no element, in a
// message of its own; elements with long values are spread over messages
// so that no element list overflows its 16-bit attribute length.
func TestEncodeBatchFlushAndLargeMessages(t *testing.T) {
	ops := []ElemOp{{Flush: true, Set: MapFrontends}}
	long := "goto port-" + strings.Repeat("x", 200)
	for i := range 500 {
		ops = append(ops, ElemOp{Set: MapFrontends, Key: fmt.Sprintf("10.96.%d.%d . tcp . 80", i/256, i%256), Value: long})
	}
	if _, err := encodeBatch(knftables.IPv4Family, ops, 1, 100); err == nil {
		t.Error("a batch over the limit was encoded")
	}
	b, err := encodeBatch(knftables.IPv4Family, ops, 1, maxBulkElems)
	if err != nil {
		t.Fatal(err)
	}
	var lens []int
	var first []byte
	for buf := b.bytes(); len(buf) > 0; {
		l := binary.NativeEndian.Uint32(buf)
		if first == nil && binary.NativeEndian.Uint16(buf[4:]) == nfnlSubsysNFTables<<8|nftMsgDelSetElem {
			first = buf[:l]
		}
		lens = append(lens, int(l))
		buf = buf[l:]
	}
	// begin, the flush, the elements' messages, end.
	if len(lens) < 5 || b.messages != len(lens)-2 {
		t.Fatalf("%d messages (%d acknowledged), want begin, a flush, at least two of elements, end", len(lens), b.messages)
	}
	for i, l := range lens[2 : len(lens)-1] {
		if l > 1<<16 {
			t.Errorf("element message %d is %d bytes: its list attribute overflows", i, l)
		}
	}
	// The flush: header, nfgenmsg, table and set names, nothing else.
	if want := nlmsgHdrLen + 4 + 4 + len(TableName) + 1 + 4 + len(MapFrontends) + 1; len(first) < want || len(first) > want+8 {
		t.Errorf("the flush message is %d bytes, want about %d (no element list)", len(first), want)
	}
}

// bytes returns the batch as one buffer.
func (b *nlBatch) bytes() []byte { return bytes.Join(b.data, nil) }

// A key or value with fewer or more parts than its layout is refused.
func TestEncodeConcatParts(t *testing.T) {
	three := []field{fieldAddr, fieldProto, fieldService}
	for _, text := range []string{"10.96.0.1 . tcp", "10.96.0.1 . tcp . 80 . 1", "10.96.0.1", ""} {
		if got, err := encodeConcat(nil, text, three, false); !errors.Is(err, errNotEncodable) {
			t.Errorf("%q: % x, %v; want refused", text, got, err)
		}
	}
}

// A batch of more than a megabyte is written into buffers of bulkChunk
// bytes, each holding whole messages, none grown by a copy; their
// messages, read in order, are the batch's.
func TestEncodeBatchBuffers(t *testing.T) {
	ops := []ElemOp{{Flush: true, Set: "cluster-ip-tcp"}}
	for i := range 40000 {
		ops = append(ops, ElemOp{Set: "cluster-ip-tcp", Key: fmt.Sprintf("10.96.%d.%d . 80 . %d", i/2560, i/10%256, i%10),
			Value: fmt.Sprintf("10.128.%d.%d . 8080", i/256, i%256)})
	}
	b, err := encodeBatch(knftables.IPv4Family, ops, 1, maxBulkElems)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.data) < 2 {
		t.Fatalf("%d bytes in %d buffer(s), want more than one", b.size(), len(b.data))
	}
	seq := uint32(1)
	for i, d := range b.data {
		if cap(d) != bulkChunk {
			t.Errorf("buffer %d: capacity %d, want %d (grown by a copy?)", i, cap(d), bulkChunk)
		}
		for buf := d; len(buf) > 0; {
			l := binary.NativeEndian.Uint32(buf)
			if l < 16 || int(l) > len(buf) {
				t.Fatalf("buffer %d: a message of %d bytes in the %d left: it spans two buffers", i, l, len(buf))
			}
			if got := binary.NativeEndian.Uint32(buf[8:]); got != seq {
				t.Fatalf("buffer %d: sequence number %d, want %d", i, got, seq)
			}
			seq++
			buf = buf[l:]
		}
	}
	if seq != b.endSeqNum+1 {
		t.Errorf("last sequence number %d, want %d", seq-1, b.endSeqNum)
	}
	if want := 40000*40 + 100; b.size() < want || b.size() > 2*want {
		t.Errorf("batch of %d bytes for 40,000 elements", b.size())
	}
}
