package echo

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// startServer runs an echo server on loopback (IPv4 only matters here).
func startServer(t *testing.T) (tcp, udp netip.AddrPort) {
	t.Helper()
	s, err := Listen("srv", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	tcps, udps := s.Addrs()
	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	return netip.AddrPortFrom(lo, tcps[0].Port()), netip.AddrPortFrom(lo, udps[0].Port())
}

// freePort returns a loopback port nobody listens on (for the protocol).
func freePort(t *testing.T, proto string) netip.AddrPort {
	t.Helper()
	var addr net.Addr
	if proto == "tcp" {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = ln.Addr()
		_ = ln.Close()
	} else {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = pc.LocalAddr()
		_ = pc.Close()
	}
	return netip.MustParseAddrPort(addr.String())
}

// silent returns loopback addresses that accept traffic but never answer.
func silent(t *testing.T) (tcp, udp netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close(); _ = pc.Close() })
	go func() { // accept and hold connections without answering
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, h := range held {
					_ = h.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String()), netip.MustParseAddrPort(pc.LocalAddr().String())
}

func TestProbe(t *testing.T) {
	tcp, udp := startServer(t)
	silentTCP, silentUDP := silent(t)
	for _, tc := range []struct {
		name  string
		proto string
		addr  netip.AddrPort
		want  Outcome
	}{
		{"tcp answer", "tcp", tcp, Answer},
		{"udp answer", "udp", udp, Answer},
		{"tcp refused", "tcp", freePort(t, "tcp"), Rejected},
		{"udp refused", "udp", freePort(t, "udp"), Rejected},
		{"tcp silent", "tcp", silentTCP, Dropped},
		{"udp silent", "udp", silentUDP, Dropped},
		{"unknown protocol", "sctp", tcp, Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Probe(context.Background(), tc.proto, tc.addr, ProbeOptions{Timeout: 300 * time.Millisecond, Retransmit: 50 * time.Millisecond, Payload: "hi"})
			if r.Outcome != tc.want {
				t.Fatalf("outcome %s (%v), want %s", r.Outcome, r, tc.want)
			}
			if r.Outcome != Answer {
				if r.Err == nil {
					t.Error("no error explaining the outcome")
				}
				return
			}
			if r.Reply.Name != "srv" || r.Reply.Echo != "hi" {
				t.Errorf("reply %+v, want name srv echo hi", r.Reply)
			}
			if r.Source != r.Local {
				t.Errorf("server saw %s, client socket is %s", r.Source, r.Local)
			}
		})
	}
}

func TestProbeLocalPort(t *testing.T) {
	_, udp := startServer(t)
	port := freePort(t, "udp").Port()
	for i := 0; i < 2; i++ {
		r := Probe(context.Background(), "udp", udp, ProbeOptions{LocalPort: int(port)})
		if r.Outcome != Answer || r.Source.Port() != port {
			t.Fatalf("attempt %d: %v, want an answer seeing source port %d", i, r, port)
		}
	}
}

func TestExchangeKeepsConnection(t *testing.T) {
	tcp, _ := startServer(t)
	c, err := net.Dial("tcp", tcp.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	var first netip.AddrPort
	for i, msg := range []string{"one", "two", "three"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r := Exchange(ctx, c, msg)
		cancel()
		if r.Outcome != Answer || r.Reply.Echo != msg {
			t.Fatalf("exchange %d: %v echo %q", i, r, r.Reply.Echo)
		}
		if i == 0 {
			first = r.Source
		} else if r.Source != first {
			t.Errorf("exchange %d seen from %s, first from %s", i, r.Source, first)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Outcome
		src  string
	}{
		{`{"name":"a","client":"[::ffff:10.0.0.1]:5","echo":"x"}` + "\n", Answer, "10.0.0.1:5"},
		{`{"name":"a","client":"[fd00::1]:5"}`, Answer, "[fd00::1]:5"},
		{`not json`, Failed, ""},
		{`{"name":"a","client":"nope"}`, Failed, ""},
	} {
		r := parse(tc.line)
		if r.Outcome != tc.want || (tc.src != "" && r.Source.String() != tc.src) {
			t.Errorf("parse(%q) = %v, want %s %s", tc.line, r, tc.want, tc.src)
		}
		if tc.want == Failed && r.Err == nil {
			t.Errorf("parse(%q): failed without an error", tc.line)
		}
	}
}
