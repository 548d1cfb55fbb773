package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/test/netns"
)

// nf_tables' notifications, as include/uapi/linux/netfilter/nfnetlink.h and
// nf_tables.h number them.
const (
	nfnlGroupNFTables  = 7  // NFNLGRP_NFTABLES
	nfnlSubsysNFTables = 10 // NFNL_SUBSYS_NFTABLES
	nftMsgNewChain     = 3  // NFT_MSG_NEWCHAIN
	nftMsgNewRule      = 6  // NFT_MSG_NEWRULE
	nftMsgNewSetElem   = 12 // NFT_MSG_NEWSETELEM
)

// kernelWatch stamps when awaited bench addresses first appear in what
// nf_tables adds in a namespace: it listens to the notifications nft
// monitor reads, but reads them raw, so it keeps up at any ruleset size
// (nft monitor dumps the whole ruleset into its cache first, which takes
// seconds at 10,000 Services and falls behind a churn). An address is
// found as its four bytes in an added element or rule (kproxy's map data,
// upstream's DNAT) or spelt in dotted quad (upstream's endpoint chain
// names).
type kernelWatch struct {
	fd      int
	stopped atomic.Bool
	done    chan struct{}
	// overruns counts the notifications the socket dropped (ENOBUFS).
	overruns atomic.Int64

	mu   sync.Mutex
	sent map[netip.Addr]time.Time
	seen map[netip.Addr]time.Duration
}

// watchKernel starts a kernelWatch in ns.
func watchKernel(ns *netns.NS) (*kernelWatch, error) {
	w := &kernelWatch{fd: -1, done: make(chan struct{}), sent: map[netip.Addr]time.Time{}, seen: map[netip.Addr]time.Duration{}}
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		w.fd = fd
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (nfnlGroupNFTables - 1)}); err != nil {
			return fmt.Errorf("joining nf_tables' notifications: %w", err)
		}
		// Room for a full sync's burst; FORCE passes rmem_max as root.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
			return fmt.Errorf("receive buffer: %w", err)
		}
		tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		if w.fd >= 0 {
			unix.Close(w.fd)
		}
		return nil, err
	}
	go w.run()
	return w, nil
}

// await registers addr as written at t.
func (w *kernelWatch) await(addr netip.Addr, t time.Time) {
	w.mu.Lock()
	w.sent[addr] = t
	w.mu.Unlock()
}

// forget drops an address whose write failed.
func (w *kernelWatch) forget(addr netip.Addr) {
	w.mu.Lock()
	delete(w.sent, addr)
	w.mu.Unlock()
}

// pending counts the awaited addresses not seen yet.
func (w *kernelWatch) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.sent) - len(w.seen)
}

// stop ends the watch (within the receive timeout).
func (w *kernelWatch) stop() {
	if w.stopped.CompareAndSwap(false, true) {
		<-w.done
		unix.Close(w.fd)
	}
}

func (w *kernelWatch) run() {
	defer close(w.done)
	buf := make([]byte, 1<<20)
	for !w.stopped.Load() {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		now := time.Now()
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS):
			w.overruns.Add(1)
			continue
		case err != nil:
			return
		}
		w.found(now, messageAddrs(buf[:n]))
	}
}

func (w *kernelWatch) found(now time.Time, addrs []netip.Addr) {
	if len(addrs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range addrs {
		if t, ok := w.sent[a]; ok {
			if _, done := w.seen[a]; !done {
				w.seen[a] = now.Sub(t)
			}
		}
	}
}

// messageAddrs returns the bench addresses (10.128.0.0/9) in the added
// chains, rules and elements of a buffer of netlink messages.
func messageAddrs(b []byte) []netip.Addr {
	var out []netip.Addr
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if l < unix.SizeofNlMsghdr || l > len(b) {
			break
		}
		if typ>>8 == nfnlSubsysNFTables {
			switch typ & 0xff {
			case nftMsgNewChain, nftMsgNewRule, nftMsgNewSetElem:
				out = appendAddrs(out, b[unix.SizeofNlMsghdr:l])
			}
		}
		b = b[(l+3)&^3:]
	}
	return out
}

// appendAddrs appends the bench addresses in p: four bytes 10.128-255.x.x,
// or their dotted-quad text.
func appendAddrs(out []netip.Addr, p []byte) []netip.Addr {
	for i := 0; i+4 <= len(p); i++ {
		if p[i] == 10 && p[i+1] >= 128 {
			out = append(out, netip.AddrFrom4([4]byte(p[i:i+4])))
		}
	}
	for _, m := range benchAddr.FindAllSubmatch(p, -1) {
		if a, err := netip.ParseAddr(string(m[1])); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// nlMsg builds one netlink message of nf_tables type msg with payload p.
func nlMsg(msg uint16, p []byte) []byte {
	b := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(p)+3)
	binary.NativeEndian.PutUint32(b[0:4], uint32(unix.SizeofNlMsghdr+len(p)))
	binary.NativeEndian.PutUint16(b[4:6], nfnlSubsysNFTables<<8|msg)
	b = append(b, p...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// TestMessageAddrs finds bench addresses as bytes and as text in added
// chains, rules and elements only.
func TestMessageAddrs(t *testing.T) {
	elem := nlMsg(nftMsgNewSetElem, []byte{0, 0, 4, 0, 10, 129, 2, 3, 0, 0, 0x1f, 0x90})
	chain := nlMsg(nftMsgNewChain, []byte("endpoint-AB12-bench/svc-00001/tcp/http__10.200.0.9/8080\x00"))
	deleted := nlMsg(14 /* NFT_MSG_DELSETELEM */, []byte{10, 130, 0, 1})
	other := []byte{10, 131, 0, 1, 0, 0, 0, 0}
	otherSubsys := nlMsg(0, other)
	binary.NativeEndian.PutUint16(otherSubsys[4:6], 1<<8) // conntrack
	outside := nlMsg(nftMsgNewRule, []byte{10, 96, 0, 10, 10, 127, 255, 255})
	var buf []byte
	for _, m := range [][]byte{elem, deleted, chain, otherSubsys, outside} {
		buf = append(buf, m...)
	}
	var got []string
	for _, a := range messageAddrs(buf) {
		got = append(got, a.String())
	}
	if want := "10.129.2.3,10.200.0.9"; strings.Join(got, ",") != want {
		t.Errorf("addresses %v, want %s", got, want)
	}
}

// TestKernelWatch: the watch sees an address added to a map in its
// namespace, and not one in the name of a chain deleted.
func TestKernelWatch(t *testing.T) {
	netns.Require(t, "nft")
	c := netns.New(t, netns.Options{})
	host := c.Topology.Nodes[0].Name
	ns, err := c.MustNS(host)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nft := func(rules string) {
		t.Helper()
		if out, err := ns.ExecInput(ctx, []byte(rules), "nft", "-f", "-"); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
	}
	nft("add table ip kwatch\nadd map ip kwatch m { type ipv4_addr : ipv4_addr ; }\nadd chain ip kwatch ep__10.200.1.2/80\n")
	kw, err := watchKernel(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer kw.stop()
	added, deleted := netip.MustParseAddr("10.200.1.1"), netip.MustParseAddr("10.200.1.2")
	kw.await(added, time.Now())
	kw.await(deleted, time.Now())
	nft("delete chain ip kwatch ep__10.200.1.2/80\nadd element ip kwatch m { 10.96.0.1 : 10.200.1.1 }\n")
	for deadline := time.Now().Add(5 * time.Second); kw.pending() > 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	kw.stop()
	if _, ok := kw.seen[added]; !ok || len(kw.seen) != 1 {
		t.Errorf("seen %v, want %s only", kw.seen, added)
	}
}
