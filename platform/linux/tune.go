package linux

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ConntrackSettings are the conntrack sysctls kproxy sets at start, from
// kube-proxy's conntrack.* configuration. A zero value leaves the kernel's
// setting as it is.
type ConntrackSettings struct {
	// Max is nf_conntrack_max (conntrack.maxPerCore × CPUs, at least conntrack.min).
	Max                   int
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
	TCPBeLiberal          bool
	UDPTimeout            time.Duration
	UDPStreamTimeout      time.Duration
}

// Sysctl is one sysctl write: name under /proc/sys and value.
type Sysctl struct{ Name, Value string }

// Sysctls returns the writes the settings ask for, in a fixed order.
func (s ConntrackSettings) Sysctls() []Sysctl {
	var out []Sysctl
	add := func(name string, v int) {
		out = append(out, Sysctl{"net/netfilter/" + name, strconv.Itoa(v)})
	}
	if s.Max > 0 {
		add("nf_conntrack_max", s.Max)
	}
	secs := func(d time.Duration) int { return int(d / time.Second) }
	if s.TCPEstablishedTimeout > 0 {
		add("nf_conntrack_tcp_timeout_established", secs(s.TCPEstablishedTimeout))
	}
	if s.TCPCloseWaitTimeout > 0 {
		add("nf_conntrack_tcp_timeout_close_wait", secs(s.TCPCloseWaitTimeout))
	}
	if s.TCPBeLiberal {
		add("nf_conntrack_tcp_be_liberal", 1)
	}
	if s.UDPTimeout > 0 {
		add("nf_conntrack_udp_timeout", secs(s.UDPTimeout))
	}
	if s.UDPStreamTimeout > 0 {
		add("nf_conntrack_udp_timeout_stream", secs(s.UDPStreamTimeout))
	}
	return out
}

// TuneConntrack applies the settings through h, in the calling thread's
// network namespace, going on past failures (nf_conntrack_max can only be
// written from the host's initial namespace, and the nf_conntrack module may
// not be loaded yet). The joined error names every sysctl that failed.
func TuneConntrack(h Host, s ConntrackSettings) error {
	var errs []error
	for _, sc := range s.Sysctls() {
		if err := h.SetSysctl(sc.Name, sc.Value); err != nil {
			errs = append(errs, fmt.Errorf("conntrack: %w", err))
		}
	}
	// The hash table size is global: only raise it when nf_conntrack_max is
	// ours to set, which the kernel allows only in the host's initial
	// network namespace (in others the sysctl is read-only).
	if s.Max > 0 && maxWritable() {
		if err := raiseHashsize(s.Max / 4); err != nil {
			errs = append(errs, fmt.Errorf("conntrack: %w", err))
		}
	}
	return errors.Join(errs...)
}
