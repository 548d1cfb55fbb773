package echo

import (
	"context"
	"io"
	"net"
	"net/http"
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

// TestHTTP: a connection that starts with an HTTP/1.x request line gets one
// HTTP response whose body is the JSON reply (what curl shows in make
// cluster); any other first line keeps the line protocol, and an HTTP
// request line later on a connection is echoed like any other line.
func TestHTTP(t *testing.T) {
	tcp, _ := startServer(t)
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := c.Get("http://" + tcp.String() + "/path?x=1")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("status %d, content type %q; want 200 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := parse(string(body))
	if r.Outcome != Answer || r.Reply.Name != "srv" || r.Reply.Echo != "GET /path?x=1" || r.Source.Addr() != tcp.Addr() {
		t.Errorf("body %q parsed as %v (echo %q), want an answer from srv echoing GET /path?x=1", body, r, r.Reply.Echo)
	}

	resp, err = c.Head("http://" + tcp.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 {
		t.Errorf("HEAD: status %d, length %d; want 200 with the GET body's length", resp.StatusCode, resp.ContentLength)
	}

	conn, err := net.Dial("tcp", tcp.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	for i, msg := range []string{"GET /", "GET / HTTP/1.1"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r := Exchange(ctx, conn, msg)
		cancel()
		if r.Outcome != Answer || r.Reply.Echo != msg {
			t.Errorf("line %d %q: %v echo %q, want it echoed by the line protocol", i, msg, r, r.Reply.Echo)
		}
	}
}

func TestHTTPRequestLine(t *testing.T) {
	for _, tc := range []struct {
		line   string
		method string
		ok     bool
	}{
		{"GET / HTTP/1.1\r\n", "GET", true},
		{"HEAD /x HTTP/1.0\n", "HEAD", true},
		{"GET / HTTP/2\r\n", "", false},
		{"get / HTTP/1.1\r\n", "", false},
		{"ping\n", "", false},
		{"GET /\n", "", false},
	} {
		m, _, ok := httpRequestLine(tc.line)
		if ok != tc.ok || m != tc.method {
			t.Errorf("httpRequestLine(%q) = %q, %v; want %q, %v", tc.line, m, ok, tc.method, tc.ok)
		}
	}
}
