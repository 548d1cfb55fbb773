package check

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// TrafficOptions name the Service paths Traffic tries from the host. Each
// is optional; a path left out is reported as not tried. They are
// Services the operator names (kproxy on the node must program them): a
// ClusterIP Service (e.g. the API server's `kubernetes` Service,
// 10.96.0.1:443), a NodePort on this node's address, and the cluster DNS
// Service (kube-dns, 10.96.0.10:53).
type TrafficOptions struct {
	// ClusterIP and NodePort are dialled over TCP: a connection accepted is
	// the path working.
	ClusterIP, NodePort netip.AddrPort
	// DNS is asked, over UDP, for the A record of DNSName: any answer with
	// the query's ID (NXDOMAIN included) is the path working.
	DNS     netip.AddrPort
	DNSName string
	// Attempts per path (default 3): each a new connection from a new
	// source port, so that several endpoints are tried.
	Attempts int
	// Timeout per attempt (default 3s).
	Timeout time.Duration
	// Dial opens the connections (default net.Dialer's DialContext).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Verdicts of a path.
const (
	// VerdictOK: every attempt got through.
	VerdictOK = "OK"
	// VerdictPartial: some attempts got through, some did not (an
	// endpoint of the Service, or its load balancer entry for it, does not
	// work).
	VerdictPartial = "PARTIAL"
	// VerdictRefused: refused at once (no load balancer for the frontend
	// and nothing listening there, or an endpoint refusing).
	VerdictRefused = "REFUSED"
	// VerdictTimeout: nothing came back (HNS has no load balancer for the
	// frontend, or the endpoints cannot be reached).
	VerdictTimeout = "TIMEOUT"
	// VerdictFailed: another error.
	VerdictFailed = "FAILED"
	// VerdictNotTried: the path was not named.
	VerdictNotTried = "NOT TRIED"
)

// PathResult is the outcome of one path.
type PathResult struct {
	Path    string // "ClusterIP", "NodePort", "DNS"
	Target  string
	Verdict string
	// OK of Attempts got through; Detail says what the others met.
	OK, Attempts int
	Detail       string
	// Took is the slowest successful attempt.
	Took time.Duration
}

// TrafficResult is the outcome of Traffic.
type TrafficResult struct {
	Paths []PathResult
}

// OK reports whether every path tried got through every time (paths not
// tried do not count; at least one must have been tried).
func (r *TrafficResult) OK() bool {
	tried := 0
	for _, p := range r.Paths {
		if p.Verdict == VerdictNotTried {
			continue
		}
		tried++
		if p.Verdict != VerdictOK {
			return false
		}
	}
	return tried > 0
}

// Write prints a verdict per path, then an overall one.
func (r *TrafficResult) Write(w io.Writer) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 2, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "PATH\tTARGET\tVERDICT\tOK\tDETAIL\t")
	for _, p := range r.Paths {
		ok := ""
		if p.Verdict != VerdictNotTried {
			ok = fmt.Sprintf("%d/%d", p.OK, p.Attempts)
		}
		detail := p.Detail
		if p.OK > 0 {
			detail = strings.TrimSpace(fmt.Sprintf("slowest %s %s", p.Took.Round(time.Millisecond), detail))
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", p.Path, p.Target, p.Verdict, ok, detail)
	}
	_ = tw.Flush()
	if r.OK() {
		buf.WriteString("TRAFFIC OK: every path tried got through from the host\n")
	} else {
		buf.WriteString("TRAFFIC PROBLEMS: see docs/windows.md, \"Canary\", for what to look at\n")
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// Traffic sends real connections from this host through the paths named:
// TCP to the ClusterIP and the NodePort, a DNS query over UDP to the DNS
// Service; several per path, each from a new source port. It changes
// nothing on the node.
func Traffic(ctx context.Context, o TrafficOptions) *TrafficResult {
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Second
	}
	if o.Dial == nil {
		var d net.Dialer
		o.Dial = d.DialContext
	}
	if o.DNSName == "" {
		o.DNSName = "kubernetes.default.svc.cluster.local"
	}
	res := &TrafficResult{}
	res.Paths = append(res.Paths,
		tryPath(ctx, o, "ClusterIP", o.ClusterIP, dialTCP),
		tryPath(ctx, o, "NodePort", o.NodePort, dialTCP),
		tryPath(ctx, o, "DNS", o.DNS, askDNS))
	return res
}

type attempt func(ctx context.Context, o TrafficOptions, to netip.AddrPort) error

func tryPath(ctx context.Context, o TrafficOptions, name string, to netip.AddrPort, try attempt) PathResult {
	r := PathResult{Path: name, Target: to.String(), Verdict: VerdictNotTried}
	if !to.IsValid() {
		r.Target = "-"
		return r
	}
	if name == "DNS" {
		r.Target += "/udp " + o.DNSName
	} else {
		r.Target += "/tcp"
	}
	r.Attempts = o.Attempts
	kinds := map[string]int{}
	var last error
	for range o.Attempts {
		actx, cancel := context.WithTimeout(ctx, o.Timeout)
		start := time.Now()
		err := try(actx, o, to)
		took := time.Since(start)
		cancel()
		if err == nil {
			r.OK++
			r.Took = max(r.Took, took)
			continue
		}
		last = err
		kinds[classify(err)]++
	}
	switch {
	case r.OK == r.Attempts:
		r.Verdict = VerdictOK
	case r.OK > 0:
		r.Verdict = VerdictPartial
	case kinds[VerdictRefused] == r.Attempts:
		r.Verdict = VerdictRefused
	case kinds[VerdictTimeout] == r.Attempts:
		r.Verdict = VerdictTimeout
	default:
		r.Verdict = VerdictFailed
	}
	if last != nil {
		r.Detail = last.Error()
	}
	return r
}

// classify sorts a failed attempt.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return VerdictTimeout
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), strings.Contains(err.Error(), "refused"):
		return VerdictRefused
	}
	return VerdictFailed
}

func dialTCP(ctx context.Context, o TrafficOptions, to netip.AddrPort) error {
	c, err := o.Dial(ctx, "tcp", to.String())
	if err != nil {
		return err
	}
	return c.Close()
}

// askDNS sends one A query for o.DNSName and waits for the answer with its ID.
func askDNS(ctx context.Context, o TrafficOptions, to netip.AddrPort) error {
	c, err := o.Dial(ctx, "udp", to.String())
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	id := uint16(rand.N(1 << 16))
	q, err := dnsQuery(id, o.DNSName)
	if err != nil {
		return err
	}
	if _, err := c.Write(q); err != nil {
		return fmt.Errorf("sending the DNS query: %w", err)
	}
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("waiting for the DNS answer: %w", err)
		}
		if n >= 12 && binary.BigEndian.Uint16(buf) == id && buf[2]&0x80 != 0 {
			return nil // an answer to this query, whatever its code
		}
	}
}

// dnsQuery builds a DNS query for the A record of name, recursion desired.
func dnsQuery(id uint16, name string) ([]byte, error) {
	b := make([]byte, 12, 12+len(name)+6)
	binary.BigEndian.PutUint16(b[0:], id)
	b[2] = 0x01                          // RD
	binary.BigEndian.PutUint16(b[4:], 1) // QDCOUNT
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if label == "" || len(label) > 63 {
			return nil, fmt.Errorf("DNS name %q: bad label", name)
		}
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	b = append(b, 0, 0, 1, 0, 1) // root, QTYPE A, QCLASS IN
	return b, nil
}
