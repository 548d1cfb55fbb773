package differential

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/test/netns/echo"
)

// attempt makes one attempt from the calling thread's network namespace:
// a new TCP connection that sends one echo request, or a new UDP socket
// that sends one (again every 200 ms) until an answer, an error or the
// timeout. The socket asks for ICMP errors (IP_RECVERR / IPV6_RECVERR),
// so a refusal says how it came: a reset, which ICMP error from whom, or
// EPERM from the client's own output path. local, when valid, is the
// source address to bind.
func attempt(proto string, dst, local netip.Addr, port uint16, timeout time.Duration) Attempt {
	start := time.Now()
	var a Attempt
	switch proto {
	case "tcp":
		a = attemptTCP(netip.AddrPortFrom(dst, port), local, start.Add(timeout))
	case "udp":
		a = attemptUDP(netip.AddrPortFrom(dst, port), local, start.Add(timeout))
	default:
		a = Attempt{Kind: Error, Detail: "unknown protocol " + proto}
	}
	a.Elapsed = time.Since(start)
	return a
}

// socket opens a non-blocking socket of dst's family asking for ICMP
// errors, bound to local when valid.
func socket(typ int, dst netip.AddrPort, local netip.Addr) (int, error) {
	fam := unix.AF_INET
	if dst.Addr().Is6() {
		fam = unix.AF_INET6
	}
	fd, err := unix.Socket(fam, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if fam == unix.AF_INET {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("asking for ICMP errors: %w", err)
	}
	if local.IsValid() {
		if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(local, 0))); err != nil {
			_ = unix.Close(fd)
			return -1, fmt.Errorf("bind %s: %w", local, err)
		}
	}
	return fd, nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// wait polls fd for events until deadline; it returns the events seen (0
// at the deadline).
func wait(fd int, events int16, deadline time.Time) (int16, error) {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, nil
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("poll: %w", err)
		}
		if n > 0 {
			return fds[0].Revents, nil
		}
	}
}

// icmpError is an ICMP error read from a socket's error queue.
type icmpError struct {
	errno    syscall.Errno
	name     string
	from     netip.Addr
	isICMP   bool
	origin   uint8
	typ      uint8
	code     uint8
	received bool
}

// readErrQueue reads the socket's error queue (all of it; the last ICMP
// error wins).
func readErrQueue(fd int) icmpError {
	var out icmpError
	for i := 0; i < 8; i++ {
		buf := make([]byte, 256)
		oob := make([]byte, 512)
		_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if err != nil {
			return out
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return out
		}
		for _, m := range msgs {
			if !(m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_RECVERR) &&
				!(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_RECVERR) {
				continue
			}
			if len(m.Data) < 16 {
				continue
			}
			e := icmpError{
				received: true,
				errno:    syscall.Errno(binary.NativeEndian.Uint32(m.Data[0:4])),
				origin:   m.Data[4],
				typ:      m.Data[5],
				code:     m.Data[6],
			}
			e.isICMP = e.origin == unix.SO_EE_ORIGIN_ICMP || e.origin == unix.SO_EE_ORIGIN_ICMP6
			e.name = icmpName(e.origin, e.typ, e.code)
			e.from = offender(m.Data[16:])
			out = e
		}
	}
	return out
}

// offender parses the sockaddr that follows sock_extended_err.
func offender(b []byte) netip.Addr {
	if len(b) < 2 {
		return netip.Addr{}
	}
	switch binary.NativeEndian.Uint16(b[0:2]) {
	case unix.AF_INET:
		if len(b) >= 8 {
			return netip.AddrFrom4([4]byte(b[4:8]))
		}
	case unix.AF_INET6:
		if len(b) >= 24 {
			return netip.AddrFrom16([16]byte(b[8:24]))
		}
	}
	return netip.Addr{}
}

func icmpName(origin, typ, code uint8) string {
	switch origin {
	case unix.SO_EE_ORIGIN_ICMP:
		if typ == 3 {
			switch code {
			case 0:
				return "net-unreachable"
			case 1:
				return "host-unreachable"
			case 3:
				return "port-unreachable"
			case 9, 10, 13:
				return "admin-prohibited"
			}
		}
	case unix.SO_EE_ORIGIN_ICMP6:
		if typ == 1 {
			switch code {
			case 0:
				return "net-unreachable"
			case 1:
				return "admin-prohibited"
			case 3:
				return "host-unreachable"
			case 4:
				return "port-unreachable"
			}
		}
	case unix.SO_EE_ORIGIN_LOCAL:
		return "local"
	}
	return fmt.Sprintf("type %d code %d", typ, code)
}

// refusal classifies a failed exchange: errno is the error the client got.
func refusal(fd int, errno syscall.Errno, what string) Attempt {
	q := readErrQueue(fd)
	a := Attempt{Detail: fmt.Sprintf("%s: %v", what, errno)}
	if q.received && q.isICMP {
		a.ICMP = q.name
		if q.from.IsValid() {
			a.ICMPFrom = q.from.String()
		}
	}
	switch {
	case errno == unix.EPERM:
		a.Kind = EPERM
	case q.received && q.isICMP:
		a.Kind = RefusedICMP
	case errno == unix.ECONNREFUSED:
		a.Kind = RefusedRST
	case errno == unix.ENETUNREACH || errno == unix.EHOSTUNREACH:
		a.Kind = Unreachable
	default:
		a.Kind = Error
	}
	return a
}

func attemptTCP(dst netip.AddrPort, local netip.Addr, deadline time.Time) Attempt {
	fd, err := socket(unix.SOCK_STREAM, dst, local)
	if err != nil {
		return Attempt{Kind: Error, Detail: err.Error()}
	}
	defer func() { _ = unix.Close(fd) }()
	if err := unix.Connect(fd, sockaddr(dst)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return refusal(fd, errno, "connect")
		}
		return Attempt{Kind: Error, Detail: err.Error()}
	}
	var icmp icmpError
	for {
		ev, err := wait(fd, unix.POLLOUT, deadline)
		if err != nil {
			return Attempt{Kind: Error, Detail: err.Error()}
		}
		if ev == 0 {
			a := Attempt{Kind: Timeout}
			if icmp.received && icmp.isICMP {
				a.ICMP, a.ICMPFrom = icmp.name, addrString(icmp.from)
			}
			return a
		}
		soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return Attempt{Kind: Error, Detail: fmt.Sprintf("SO_ERROR: %v", err)}
		}
		if soerr != 0 {
			a := refusal(fd, syscall.Errno(soerr), "connect")
			if a.ICMP == "" && icmp.received && icmp.isICMP {
				// The ICMP error was read while the handshake went on.
				a.ICMP, a.ICMPFrom = icmp.name, addrString(icmp.from)
				if a.Kind == RefusedRST {
					a.Kind = RefusedICMP
				}
			}
			return a
		}
		if ev&unix.POLLOUT != 0 {
			break // connected
		}
		// An ICMP error queued while the handshake goes on (a soft error:
		// the kernel retransmits the SYN): keep it, keep waiting.
		if q := readErrQueue(fd); q.received {
			icmp = q
		} else {
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := unix.Write(fd, []byte("ping\n")); err != nil {
		return Attempt{Kind: ResetAfterConnect, Detail: fmt.Sprintf("send: %v", err)}
	}
	var line []byte
	buf := make([]byte, 1024)
	for !bytes.Contains(line, []byte("\n")) {
		ev, err := wait(fd, unix.POLLIN, deadline)
		if err != nil {
			return Attempt{Kind: Error, Detail: err.Error()}
		}
		if ev == 0 {
			return Attempt{Kind: Timeout, Detail: "connected, no answer"}
		}
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return Attempt{Kind: ResetAfterConnect, Detail: fmt.Sprintf("read: %v", err)}
		}
		if n == 0 {
			return Attempt{Kind: ResetAfterConnect, Detail: "closed without an answer"}
		}
		line = append(line, buf[:n]...)
	}
	return parseAnswer(line)
}

func attemptUDP(dst netip.AddrPort, local netip.Addr, deadline time.Time) Attempt {
	fd, err := socket(unix.SOCK_DGRAM, dst, local)
	if err != nil {
		return Attempt{Kind: Error, Detail: err.Error()}
	}
	defer func() { _ = unix.Close(fd) }()
	if err := unix.Connect(fd, sockaddr(dst)); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return refusal(fd, errno, "connect")
		}
		return Attempt{Kind: Error, Detail: err.Error()}
	}
	buf := make([]byte, 1024)
	for {
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				return refusal(fd, errno, "send")
			}
			return Attempt{Kind: Error, Detail: err.Error()}
		}
		resend := time.Now().Add(200 * time.Millisecond)
		if resend.After(deadline) {
			resend = deadline
		}
		ev, err := wait(fd, unix.POLLIN, resend)
		if err != nil {
			return Attempt{Kind: Error, Detail: err.Error()}
		}
		if ev&unix.POLLERR != 0 {
			soerr, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if soerr == 0 {
				soerr = int(unix.ECONNREFUSED)
			}
			return refusal(fd, syscall.Errno(soerr), "receive")
		}
		if ev&unix.POLLIN != 0 {
			n, err := unix.Read(fd, buf)
			if err != nil {
				var errno syscall.Errno
				if errors.As(err, &errno) && errno != unix.EAGAIN {
					return refusal(fd, errno, "receive")
				}
				continue
			}
			return parseAnswer(buf[:n])
		}
		if !time.Now().Before(deadline) {
			return Attempt{Kind: Timeout}
		}
	}
}

func parseAnswer(b []byte) Attempt {
	var rep echo.Reply
	if err := json.Unmarshal(bytes.TrimSpace(b), &rep); err != nil {
		return Attempt{Kind: Error, Detail: fmt.Sprintf("bad answer %q: %v", strings.TrimSpace(string(b)), err)}
	}
	src, err := rep.ClientAddr()
	if err != nil {
		return Attempt{Kind: Error, Detail: err.Error()}
	}
	return Attempt{Kind: Answer, Backend: rep.Name, Seen: src.Addr().String()}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
