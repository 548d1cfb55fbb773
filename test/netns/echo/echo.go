// Package echo is the tiny TCP and UDP echo protocol of the kernel test
// harness: a server that answers every request with its own name and the
// client address it saw, and a bounded client that reports one of answer,
// rejected (refused at once) or dropped (nothing before the timeout).
//
// It is plain Go networking with no platform code; the harness runs servers
// and clients inside network namespaces.
//
// Protocol: the client sends one line ("ping\n" or any text without a newline)
// over TCP, or one datagram over UDP; the server answers with one JSON line
// {"name": ..., "client": "ip:port", "echo": ...}. A TCP connection may carry
// any number of requests.
//
// HTTP: a TCP connection whose first line is an HTTP/1.x request line
// ("GET / HTTP/1.1") gets one HTTP/1.1 200 response whose body is that JSON
// line (echo: the method and target), then the connection is closed, so
// curl works against a pod or a Service (make netns-cluster).
package echo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Reply is one answer of a server.
type Reply struct {
	// Name is the server's name (the pod name).
	Name string `json:"name"`
	// Client is the client address the server saw.
	Client string `json:"client"`
	// Echo repeats the request text.
	Echo string `json:"echo"`
}

// ClientAddr parses Client.
func (r Reply) ClientAddr() (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(r.Client)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("echo reply from %s: bad client address %q: %w", r.Name, r.Client, err)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// maxRequest bounds one request line or datagram.
const maxRequest = 1024

// Server answers on one TCP listener and one UDP socket per address family.
type Server struct {
	Name string
	tcp  []net.Listener
	udp  []net.PacketConn
	wg   sync.WaitGroup
}

// Listen opens TCP and UDP sockets on port for IPv4 (0.0.0.0) and IPv6 ([::],
// IPv6 only). A family that is unavailable is skipped; Listen fails only if
// nothing could be opened.
func Listen(name string, port int) (*Server, error) {
	s := &Server{Name: name}
	var errs []error
	for _, fam := range []struct{ tcp, udp, host string }{{"tcp4", "udp4", "0.0.0.0"}, {"tcp6", "udp6", "::"}} {
		addr := net.JoinHostPort(fam.host, fmt.Sprint(port))
		ln, err := net.Listen(fam.tcp, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pc, err := net.ListenPacket(fam.udp, addr)
		if err != nil {
			_ = ln.Close()
			errs = append(errs, err)
			continue
		}
		s.tcp = append(s.tcp, ln)
		s.udp = append(s.udp, pc)
	}
	if len(s.tcp) == 0 {
		return nil, fmt.Errorf("echo server %s: listen on port %d: %w", name, port, errors.Join(errs...))
	}
	return s, nil
}

// Addrs returns the TCP listener addresses and the UDP socket addresses.
func (s *Server) Addrs() (tcp, udp []netip.AddrPort) {
	for _, ln := range s.tcp {
		tcp = append(tcp, netipAddrPort(ln.Addr()))
	}
	for _, pc := range s.udp {
		udp = append(udp, netipAddrPort(pc.LocalAddr()))
	}
	return tcp, udp
}

// Serve answers until ctx is done, then closes every socket and waits for
// the connection handlers.
func (s *Server) Serve(ctx context.Context) {
	for _, ln := range s.tcp {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.serveTCP(ln) }()
	}
	for _, pc := range s.udp {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.serveUDP(pc) }()
	}
	<-ctx.Done()
	for _, ln := range s.tcp {
		_ = ln.Close()
	}
	for _, pc := range s.udp {
		_ = pc.Close()
	}
	s.wg.Wait()
}

func (s *Server) answer(client net.Addr, req string) []byte {
	b, _ := json.Marshal(Reply{Name: s.Name, Client: client.String(), Echo: req})
	return append(b, '\n')
}

func (s *Server) serveTCP(ln net.Listener) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer func() { _ = c.Close() }()
			r := bufio.NewReaderSize(c, maxRequest)
			for first := true; ; first = false {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if method, target, ok := httpRequestLine(line); first && ok {
					s.serveHTTP(c, r, method, target)
					return
				}
				if _, err := c.Write(s.answer(c.RemoteAddr(), strings.TrimSuffix(line, "\n"))); err != nil {
					return
				}
			}
		}()
	}
}

// httpMethods are the methods that start an HTTP request line.
var httpMethods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "OPTIONS": true, "PATCH": true,
}

// httpRequestLine reports whether line is an HTTP/1.x request line and
// returns its method and target.
func httpRequestLine(line string) (method, target string, ok bool) {
	f := strings.Fields(strings.TrimRight(line, "\r\n"))
	if len(f) != 3 || !httpMethods[f[0]] || !strings.HasPrefix(f[2], "HTTP/1.") {
		return "", "", false
	}
	return f[0], f[1], true
}

// maxHeaders bounds the header lines read from an HTTP request.
const maxHeaders = 100

// serveHTTP answers one HTTP request whose request line has been read: it
// reads the header lines (a body is not read), writes one response, and
// returns; the caller closes the connection.
func (s *Server) serveHTTP(c net.Conn, r *bufio.Reader, method, target string) {
	for i := 0; i < maxHeaders; i++ {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if strings.TrimRight(line, "\r\n") == "" {
			break
		}
	}
	body := s.answer(c.RemoteAddr(), method+" "+target)
	head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", len(body))
	if method == "HEAD" {
		body = nil
	}
	_, _ = c.Write(append([]byte(head), body...))
}

func (s *Server) serveUDP(pc net.PacketConn) {
	buf := make([]byte, maxRequest)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = pc.WriteTo(s.answer(from, string(buf[:n])), from)
	}
}

// Outcome is what a probe experienced.
type Outcome string

// Outcomes. The first three match proxytest's names.
const (
	Answer   Outcome = "answer"
	Rejected Outcome = "rejected"
	Dropped  Outcome = "dropped"
	// Failed is any other error (no route, bad reply...): a harness problem,
	// never an expected outcome.
	Failed Outcome = "failed"
)

// Result is the outcome of one probe.
type Result struct {
	Outcome Outcome
	Reply   Reply
	// Source is the client address the server saw (Answer only).
	Source netip.AddrPort
	// Local is the probe's own socket address (zero if none was bound).
	Local netip.AddrPort
	// Err explains Rejected, Dropped and Failed.
	Err     error
	Elapsed time.Duration
}

// String renders a result for logs and failure messages.
func (r Result) String() string {
	if r.Outcome == Answer {
		return fmt.Sprintf("answer from %s (saw %s) in %v", r.Reply.Name, r.Source, r.Elapsed.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s after %v: %v", r.Outcome, r.Elapsed.Round(time.Millisecond), r.Err)
}

// ProbeOptions tune a probe.
type ProbeOptions struct {
	// Timeout bounds the whole probe (default 2s). Silence until then is Dropped.
	Timeout time.Duration
	// Retransmit is the UDP resend interval (default 200ms); TCP relies on
	// the kernel's own retransmissions.
	Retransmit time.Duration
	// Payload is the request text (default "ping").
	Payload string
	// LocalPort binds the client to this source port (0: any). Reusing a
	// port keeps the same UDP conntrack entry.
	LocalPort int
	// LocalAddr binds the client to this source address (zero: the one the
	// route chooses); it must be assigned in the client's namespace.
	LocalAddr netip.Addr
}

func (o ProbeOptions) withDefaults() ProbeOptions {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Retransmit <= 0 {
		o.Retransmit = 200 * time.Millisecond
	}
	if o.Payload == "" {
		o.Payload = "ping"
	}
	return o
}

// Probe makes one request to addr over proto ("tcp" or "udp") with a new
// socket and classifies what happens. It never takes longer than the timeout
// (plus scheduling noise).
func Probe(ctx context.Context, proto string, addr netip.AddrPort, opts ProbeOptions) Result {
	opts = opts.withDefaults()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	var r Result
	switch strings.ToLower(proto) {
	case "tcp":
		r = probeTCP(ctx, addr, opts)
	case "udp":
		r = probeUDP(ctx, addr, opts)
	default:
		r = Result{Outcome: Failed, Err: fmt.Errorf("unknown protocol %q", proto)}
	}
	r.Elapsed = time.Since(start)
	return r
}

func localAddr(network string, addr netip.AddrPort, port int, src netip.Addr) net.Addr {
	if port == 0 && !src.IsValid() {
		return nil
	}
	ip := net.IPv4zero
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		ip = net.IPv6unspecified
	}
	if src.IsValid() {
		ip = net.IP(src.AsSlice())
	}
	if network == "udp" {
		return &net.UDPAddr{IP: ip, Port: port}
	}
	return &net.TCPAddr{IP: ip, Port: port}
}

func probeTCP(ctx context.Context, addr netip.AddrPort, opts ProbeOptions) Result {
	d := net.Dialer{LocalAddr: localAddr("tcp", addr, opts.LocalPort, opts.LocalAddr)}
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return classify(fmt.Errorf("connect %s: %w", addr, err))
	}
	defer func() { _ = c.Close() }()
	res := Exchange(ctx, c, opts.Payload)
	res.Local = netipAddrPort(c.LocalAddr())
	return res
}

// Exchange sends one request over an open TCP connection and reads the
// answer, bounded by ctx. Long-lived connections (restart scenarios) use it
// repeatedly.
func Exchange(ctx context.Context, c net.Conn, payload string) Result {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte(payload + "\n")); err != nil {
		return classify(fmt.Errorf("send: %w", err))
	}
	line, err := bufio.NewReaderSize(c, maxRequest).ReadString('\n')
	if err != nil {
		return classify(fmt.Errorf("read answer: %w", err))
	}
	return parse(line)
}

func probeUDP(ctx context.Context, addr netip.AddrPort, opts ProbeOptions) Result {
	d := net.Dialer{LocalAddr: localAddr("udp", addr, opts.LocalPort, opts.LocalAddr)}
	c, err := d.DialContext(ctx, "udp", addr.String())
	if err != nil {
		return classify(fmt.Errorf("open udp socket to %s: %w", addr, err))
	}
	defer func() { _ = c.Close() }()
	local := netipAddrPort(c.LocalAddr())
	dl, _ := ctx.Deadline()
	buf := make([]byte, maxRequest)
	for {
		if _, err := c.Write([]byte(opts.Payload)); err != nil {
			r := classify(fmt.Errorf("send: %w", err))
			r.Local = local
			return r
		}
		wait := time.Now().Add(opts.Retransmit)
		if wait.After(dl) {
			wait = dl
		}
		_ = c.SetReadDeadline(wait)
		n, err := c.Read(buf)
		if err == nil {
			r := parse(string(buf[:n]))
			r.Local = local
			return r
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && time.Now().Before(dl) && ctx.Err() == nil {
			continue // resend
		}
		r := classify(fmt.Errorf("read answer: %w", err))
		r.Local = local
		return r
	}
}

func netipAddrPort(a net.Addr) netip.AddrPort {
	if a == nil {
		return netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func parse(line string) Result {
	var rep Reply
	if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &rep); err != nil {
		return Result{Outcome: Failed, Err: fmt.Errorf("bad answer %q: %w", line, err)}
	}
	src, err := rep.ClientAddr()
	if err != nil {
		return Result{Outcome: Failed, Reply: rep, Err: err}
	}
	return Result{Outcome: Answer, Reply: rep, Source: src}
}

// classify maps an error to an outcome: a refusal is Rejected (ECONNREFUSED;
// EHOSTUNREACH from an ICMP reject; EPERM, which a sender on the firewall's
// own host gets at once when its packet is rejected in the OUTPUT path), a
// timeout is Dropped, anything else Failed.
func classify(err error) Result {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EPERM):
		return Result{Outcome: Rejected, Err: err}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return Result{Outcome: Dropped, Err: err}
	}
	return Result{Outcome: Failed, Err: err}
}
