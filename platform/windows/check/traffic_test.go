package check

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Real sockets on the loopback stand for the Service paths: a listening
// TCP port (a working ClusterIP), a closed one (refused), a DNS server
// answering, and one that never answers.
func TestTraffic(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := netip.MustParseAddrPort(closed.Addr().String())
	_ = closed.Close()

	// Wine has no UDP sockets for Go (WSAIoctl SIO_UDP_CONNRESET is not
	// implemented): the DNS path is then checked on Linux only.
	udp := udpWorks(t)
	var dns, silent netip.AddrPort
	want := map[string]string{"ClusterIP": VerdictOK, "NodePort": VerdictRefused, "DNS": VerdictNotTried}
	if udp {
		dns, silent = udpServer(t, true), udpServer(t, false)
		want["DNS"] = VerdictOK
	}

	res := Traffic(context.Background(), TrafficOptions{
		ClusterIP: netip.MustParseAddrPort(ln.Addr().String()),
		NodePort:  closedAddr,
		DNS:       dns,
		Attempts:  2,
		Timeout:   2 * time.Second,
	})
	var out bytes.Buffer
	if err := res.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Paths {
		if p.Verdict != want[p.Path] {
			t.Errorf("%s: %s, want %s\n%s", p.Path, p.Verdict, want[p.Path], out.String())
		}
	}
	if res.OK() || !strings.Contains(out.String(), "TRAFFIC PROBLEMS") {
		t.Errorf("a refused path is a problem:\n%s", out.String())
	}

	if udp {
		res = Traffic(context.Background(), TrafficOptions{DNS: silent, Attempts: 1, Timeout: 300 * time.Millisecond})
		if v := res.Paths[2].Verdict; v != VerdictTimeout || res.Paths[0].Verdict != VerdictNotTried {
			t.Errorf("silent DNS: %+v, want TIMEOUT and the others not tried", res.Paths)
		}
	}

	// Half the connections fail: an endpoint (or its entry) does not work.
	var n atomic.Int32
	var d net.Dialer
	res = Traffic(context.Background(), TrafficOptions{ClusterIP: netip.MustParseAddrPort(ln.Addr().String()), Attempts: 4,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if n.Add(1)%2 == 0 {
				return nil, errors.New("connect: connection refused")
			}
			return d.DialContext(ctx, network, address)
		}})
	if p := res.Paths[0]; p.Verdict != VerdictPartial || p.OK != 2 {
		t.Errorf("half failing: %+v, want PARTIAL 2/4", p)
	}
	if !(&TrafficResult{Paths: []PathResult{{Verdict: VerdictOK}, {Verdict: VerdictNotTried}}}).OK() {
		t.Errorf("paths not tried do not fail the check")
	}
	if (&TrafficResult{Paths: []PathResult{{Verdict: VerdictNotTried}}}).OK() {
		t.Errorf("nothing tried is not OK")
	}
}

// udpWorks reports whether this platform has UDP sockets; only Wine lacks
// them (Go's UDP sockets need WSAIoctl SIO_UDP_CONNRESET on Windows).
func udpWorks(t *testing.T) bool {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err == nil {
		_ = pc.Close()
		return true
	}
	if runtime.GOOS != "windows" {
		t.Fatalf("no UDP socket: %v", err)
	}
	t.Logf("no UDP socket here (Wine): %v; the DNS path is checked on Linux", err)
	return false
}

// udpServer answers DNS queries (the query echoed with QR set) when answer
// is set, else reads them and says nothing.
func udpServer(t *testing.T, answer bool) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if !answer || n < 12 {
				continue
			}
			buf[2] |= 0x80 // QR: a response
			buf[3] |= 0x03 // NXDOMAIN: still an answer
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

func TestDNSQuery(t *testing.T) {
	q, err := dnsQuery(0x1234, "kubernetes.default.svc.cluster.local.")
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 12+len("kubernetes.default.svc.cluster.local")+2+4 || q[0] != 0x12 || q[1] != 0x34 || q[5] != 1 || q[12] != 10 {
		t.Errorf("query % x", q)
	}
	if _, err := dnsQuery(1, "a..b"); err == nil {
		t.Errorf("an empty label must be refused")
	}
}
