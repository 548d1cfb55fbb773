package nftables

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
)

func addr(s string) netip.Addr         { return netip.MustParseAddr(s) }
func addrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func slots(name string) setID          { id, _ := setOf(name); return id }
func flush(t testing.TB, set string) ElemOp {
	t.Helper()
	f, err := FlushOp(set)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

const tcp, udp, sctp = 6, 17, 132

// The batches the encoder wrote when it read the elements' text (before
// elements were typed), for the operations of typedOps: typed elements
// are encoded to the same bytes. Keys and values are in the layout of
// nftables registers (each part of a concatenation padded to 4 bytes,
// addresses and ports in network order, numgen's slot in host order:
// TestKernelNFTNetlinkElements in platform/linux checks the same against
// what nft -f writes). Host order here is little-endian.
const (
	textBatchIPv4 = "140000001000010007000000000000000000000a340000000e0a05000800000000000000020000000b0001006b70726f" +
		"7879000013000200636c75737465722d69702d74637000004c0000000e0a05000900000000000000020000000b000100" +
		"6b70726f787900000e00020066726f6e74656e64730000001c0003801800018014000180100001000a60000106000000" +
		"00500000500000000e0a05000a00000000000000020000000b0001006b70726f7879000013000200636c75737465722d" +
		"69702d74637000001c0003801800018014000180100001000a6000010050000000000000600000000c0a05040b000000" +
		"00000000020000000b0001006b70726f7879000013000200636c75737465722d69702d74637000002c00038028000180" +
		"14000180100001000a6000010050000000000000100002800c0001000af401051f9000005c0000000c0a05040c000000" +
		"00000000020000000b0001006b70726f7879000013000200636c75737465722d6e702d75647000002800038024000180" +
		"100001800c0001007565000002000000100002800c0001000af4010600350000780000000c0a05040d00000000000000" +
		"020000000b0001006b70726f787900000e00020066726f6e74656e647300000048000380440001801400018010000100" +
		"0a60000106000000005000002c0002802800028008000100fffffffc1b000200646e61742d636c75737465722d69702d" +
		"7463702d72320000940000000c0a05040e00000000000000020000000b0001006b70726f787900000e0002006e6f6465" +
		"706f7274730000006400038024000180100001800c0001008400000075310000100002800c0002800800010000000000" +
		"3c000180100001800c0001000600000075320000280002802400028008000100fffffffd16000200706f72742d782d72" +
		"6f7574652d6e702d33000000440000000c0a05040f00000000000000020000000b0001006b70726f787900000c000200" +
		"6861697270696e001800038014000180100001800c0001000af401050af40105480000000c0a05041000000000000000" +
		"020000000b0001006b70726f78790000110002006e6f6465706f72742d6970730000000014000380100001800c000180" +
		"08000100c0a80102500000000c0a05041100000000000000020000000b0001006b70726f78790000150002006e6f6465" +
		"706f72742d72656a65637473000000001800038014000180100001800c00010011000000753300001400000011000100" +
		"12000000000000000000000a"
	textBatchIPv6 = "140000001000010007000000000000000000000a700000000c0a050408000000000000000a0000000b0001006b70726f" +
		"787900000e00020066726f6e74656e6473000000400003803c000180200001801c000100fd0000000000000000000000" +
		"000000010600000001bb0000180002801400028008000100fffffffc0600020078000000780000000c0a050409000000" +
		"000000000a0000000b0001006b70726f78790000120002006c6f63616c2d69702d736374700000004400038040000180" +
		"200001801c000100fd00000000000000000000000000000101bb0000030000001c00028018000100fd00000100000000" +
		"000000000000000520fb00005c0000000e0a05000a000000000000000a0000000b0001006b70726f787900000c000200" +
		"6861697270696e00300003802c0001802800018024000100fd000001000000000000000000000005fd00000100000000" +
		"000000000000000514000000110001000b000000000000000000000a"
)

// typedOps are the operations of textBatchIPv4 and textBatchIPv6: every
// layout the encoder writes, a flush, deletions, a goto and a jump.
func typedOps(t testing.TB) (v4, v6 []ElemOp) {
	front := dispatchElem(addr("10.96.0.1"), tcp, 80, nft.Goto("dnat-cluster-ip-tcp-r2"))
	slot := slotElem(slots("cluster-ip-tcp"), addr("10.96.0.1"), 80, 0, addrPort("10.244.1.5:8080"))
	v4 = []ElemOp{
		flush(t, "cluster-ip-tcp"),
		{Delete: true, Elem: front},
		{Delete: true, Elem: slot},
		{Elem: slot},
		{Elem: slotElem(slots("cluster-np-udp"), netip.Addr{}, 30053, 2, addrPort("10.244.1.6:53"))},
		{Elem: front},
		{Elem: dispatchElem(netip.Addr{}, sctp, 30001, &nft.Verdict{Kind: "drop"})},
		{Elem: dispatchElem(netip.Addr{}, tcp, 30002, nft.Jump("port-x-route-np-3"))},
		{Elem: hairpinElem(addr("10.244.1.5"))},
		{Elem: nodePortIPElem(addr("192.168.1.2"))},
		{Elem: rejectElem(udp, 30003)},
	}
	v6 = []ElemOp{
		{Elem: dispatchElem(addr("fd00::1"), tcp, 443, nft.Goto("x"))},
		{Elem: slotElem(slots("local-ip-sctp"), addr("fd00::1"), 443, 3, addrPort("[fd00:1::5]:8443"))},
		{Delete: true, Elem: hairpinElem(addr("fd00:1::5"))},
	}
	return v4, v6
}

// TestEncodeTypedElements: typed elements are encoded to the bytes the
// text path wrote for the same operations.
func TestEncodeTypedElements(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the expected batches are in little-endian host order")
	}
	v4, v6 := typedOps(t)
	for _, c := range []struct {
		fam  knftables.Family
		ops  []ElemOp
		want string
	}{{knftables.IPv4Family, v4, textBatchIPv4}, {knftables.IPv6Family, v6, textBatchIPv6}} {
		b, err := encodeBatch(c.fam, c.ops, 7, maxNetlinkElems)
		if err != nil {
			t.Fatalf("%s: %v", c.fam, err)
		}
		if got := hex.EncodeToString(b.bytes()); got != c.want {
			i := 0
			for i < min(len(got), len(c.want)) && got[i] == c.want[i] {
				i++
			}
			t.Errorf("%s: the batch differs from byte %d on:\n\tgot  %s\n\twant %s", c.fam, i/2, got[i&^1:], c.want[i&^1:])
		}
	}
}

// What the encoder does not know goes through nft -f: a set it has no
// layout for or does not encode (the interval set of pod CIDRs), an
// address of the other family, a verdict the kernel does not take (a
// port's own chain not named yet), too many operations.
func TestEncodeBatchRefuses(t *testing.T) {
	podCIDR, err := NewElem(SetPodCIDRs, nft.Elem{Key: nft.Key{nft.Prefix(netip.MustParsePrefix("10.0.0.0/8"))}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ops := range [][]ElemOp{
		{{Elem: podCIDR}},
		{{Elem: Elem{}}},
		{{Elem: dispatchElem(addr("fd00::1"), tcp, 80, &nft.Verdict{Kind: "drop"})}},
		{{Delete: true, Elem: hairpinElem(addr("fd00::1"))}},
		{{Elem: slotElem(slots("cluster-np-tcp"), netip.Addr{}, 80, 0, addrPort("[fd00::1]:80"))}},
		{{Elem: dispatchElem(addr("10.0.0.1"), tcp, 80, nil)}},
		{{Elem: dispatchElem(addr("10.0.0.1"), tcp, 80, nft.Goto(rolePrefix+"eps-cluster"))}},
		{{Elem: dispatchElem(addr("10.0.0.1"), tcp, 80, nft.Goto(""))}},
		{{Elem: dispatchElem(addr("10.0.0.1"), tcp, 80, &nft.Verdict{Kind: "dnat"})}},
		nil,
		make([]ElemOp, maxNetlinkElems+1),
	} {
		if b, err := encodeBatch(knftables.IPv4Family, ops, 1, maxNetlinkElems); err == nil || !errors.Is(err, errNotEncodable) {
			t.Errorf("%.80v: encoded (%v, %v)", ops, b != nil, err)
		}
	}
	if _, err := FlushOp(SetPodCIDRs); err == nil {
		t.Error("a flush of the pod CIDRs (written by nft) was made")
	}
	// A deletion's verdict is not read.
	if _, err := encodeBatch(knftables.IPv4Family, []ElemOp{{Delete: true, Elem: dispatchElem(addr("10.0.0.1"), tcp, 80, nil)}}, 1, maxNetlinkElems); err != nil {
		t.Errorf("a deletion without a verdict: %v", err)
	}
}

// A batch: begin, one message per run of one verb on one set, end; each
// element message asks for an acknowledgement; the answers are matched by
// sequence number, errors named, ENOENT is IsNotFound.
func TestEncodeBatchAndAcks(t *testing.T) {
	cip := slots("cluster-ip-tcp")
	drop := &nft.Verdict{Kind: "drop"}
	ops := []ElemOp{
		{Delete: true, Elem: slotElem(cip, addr("10.96.0.1"), 80, 0, addrPort("10.128.0.1:8080"))},
		{Delete: true, Elem: dispatchElem(addr("0.0.0.0"), tcp, 0, drop)},
		{Elem: slotElem(cip, addr("10.96.0.1"), 80, 0, addrPort("10.128.0.1:8080"))},
		{Elem: slotElem(cip, addr("10.96.0.1"), 80, 1, addrPort("10.128.0.2:8080"))},
		{Elem: dispatchElem(addr("10.96.0.1"), tcp, 80, nft.Goto("dnat-cluster-ip-tcp-r2"))},
		{Elem: dispatchElem(addr("0.0.0.0"), tcp, 0, drop)},
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
	ops := []ElemOp{flush(t, MapFrontends)}
	long := nft.Goto("port-" + strings.Repeat("x", 200))
	for i := range 500 {
		ops = append(ops, ElemOp{Elem: dispatchElem(netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i)}), tcp, 80, long)})
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

// A batch of more than a megabyte is written into buffers of bulkChunk
// bytes, each holding whole messages, none grown by a copy; their
// messages, read in order, are the batch's.
func TestEncodeBatchBuffers(t *testing.T) {
	ops := []ElemOp{flush(t, "cluster-ip-tcp")}
	for i := range 40000 {
		ops = append(ops, ElemOp{Elem: slotElem(slots("cluster-ip-tcp"), netip.AddrFrom4([4]byte{10, 96, byte(i / 2560), byte(i / 10)}), 80, i%10,
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128, byte(i / 256), byte(i)}), 8080))})
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

// TestRuleDump: the request names the table and chain in a rule dump; the
// answers count the rules of the request's sequence number only, end at
// NLMSG_DONE, and a kernel error (ENOENT) is IsNotFound.
func TestRuleDump(t *testing.T) {
	req := encodeRuleDump(nfprotoIPv4, "kproxy", "services", 7)
	if got := binary.NativeEndian.Uint16(req[4:6]); got != nfnlSubsysNFTables<<8|nftMsgGetRule {
		t.Errorf("type %#x, want GETRULE", got)
	}
	if got := binary.NativeEndian.Uint16(req[6:8]); got != nlmFRequest|nlmFDump {
		t.Errorf("flags %#x, want a dump request", got)
	}
	if req[16] != nfprotoIPv4 || !bytes.Contains(req, []byte("kproxy\x00")) || !bytes.Contains(req, []byte("services\x00")) {
		t.Errorf("request %x lacks the family, table or chain", req)
	}
	msg := func(typ uint16, seq uint32, payload ...byte) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(16+len(payload)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.NativeEndian.AppendUint16(b, 0)
		b = binary.NativeEndian.AppendUint32(b, seq)
		b = binary.NativeEndian.AppendUint32(b, 0)
		return append(b, payload...)
	}
	rule := uint16(nfnlSubsysNFTables<<8 | nftMsgNewRule)
	first := slices.Concat(msg(rule, 7, 2, 0, 0, 0), msg(rule, 6, 2, 0, 0, 0), msg(rule, 7, 2, 0, 0, 0))
	if n, done, err := countDumpedRules(first, 7); n != 2 || done || err != nil {
		t.Errorf("first part: %d rules, done %v, %v; want 2 (another request's skipped), not done", n, done, err)
	}
	if n, done, err := countDumpedRules(slices.Concat(msg(rule, 7, 2, 0, 0, 0), msg(nlmsgDone, 7, 0, 0, 0, 0)), 7); n != 1 || !done || err != nil {
		t.Errorf("last part: %d rules, done %v, %v; want 1, done", n, done, err)
	}
	enoent := binary.NativeEndian.AppendUint32(nil, uint32(0xfffffffe)) // -2
	if _, done, err := countDumpedRules(msg(nlmsgError, 7, enoent...), 7); !done || !IsNotFound(err) {
		t.Errorf("ENOENT: done %v, %v; want done and IsNotFound", done, err)
	}
}

// TestTableDump: the request is a dump of every family's tables; the
// answers give "family name" per table of the request, end at NLMSG_DONE.
func TestTableDump(t *testing.T) {
	req := encodeTableDump(9)
	if got := binary.NativeEndian.Uint16(req[4:6]); got != nfnlSubsysNFTables<<8|nftMsgGetTable || req[16] != 0 {
		t.Errorf("request %x: want GETTABLE for every family", req)
	}
	table := func(seq uint32, fam uint8, name string) []byte {
		attr := binary.NativeEndian.AppendUint16(nil, uint16(4+len(name)+1))
		attr = binary.NativeEndian.AppendUint16(attr, nftaTableName)
		attr = append(append(attr, name...), 0)
		for len(attr)%4 != 0 {
			attr = append(attr, 0)
		}
		b := binary.NativeEndian.AppendUint32(nil, uint32(20+len(attr)))
		b = binary.NativeEndian.AppendUint16(b, nfnlSubsysNFTables<<8|nftMsgNewTable)
		b = binary.NativeEndian.AppendUint16(b, 0)
		b = binary.NativeEndian.AppendUint32(b, seq)
		b = binary.NativeEndian.AppendUint32(b, 0)
		b = append(b, fam, 0, 0, 0)
		return append(b, attr...)
	}
	done := binary.NativeEndian.AppendUint32(nil, 20)
	done = binary.NativeEndian.AppendUint16(done, nlmsgDone)
	done = binary.NativeEndian.AppendUint16(done, 0)
	done = binary.NativeEndian.AppendUint32(done, 9)
	done = binary.NativeEndian.AppendUint32(done, 0)
	done = binary.NativeEndian.AppendUint32(done, 0)
	got, end, err := dumpedTables(slices.Concat(table(9, 2, "kproxy"), table(8, 2, "other"), table(9, 10, "kube-proxy"), table(9, 1, "filter"), done), 9)
	if want := "ip kproxy,ip6 kube-proxy,inet filter"; strings.Join(got, ",") != want || !end || err != nil {
		t.Errorf("tables %v, done %v, %v; want %s, done", got, end, err, want)
	}
}
