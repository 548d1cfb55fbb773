package differential

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kind is what one attempt (one new connection, or one UDP exchange)
// experienced, as its client can tell.
type Kind string

// Kinds of attempts.
const (
	// Answer: an echo server answered.
	Answer Kind = "answer"
	// RefusedRST: the TCP handshake was answered with a reset
	// (ECONNREFUSED, no ICMP error queued on the socket).
	RefusedRST Kind = "refused: RST"
	// RefusedICMP: an ICMP (or ICMPv6) error came back (ICMP names it).
	RefusedICMP Kind = "refused: ICMP"
	// EPERM: the kernel refused the packet on the client's own host, at
	// sendto (UDP) or connect (TCP): its output path dropped or rejected it.
	EPERM Kind = "EPERM at send"
	// Timeout: nothing came back before the attempt's timeout.
	Timeout Kind = "timeout"
	// ResetAfterConnect: TCP connected, then the connection was reset
	// before an answer.
	ResetAfterConnect Kind = "reset after connect"
	// Unreachable: the client's own routing refused to send (no route).
	Unreachable Kind = "unreachable"
	// Error is anything else: a harness problem more than an outcome.
	Error Kind = "error"
)

// Attempt is one attempt's outcome.
type Attempt struct {
	Kind Kind
	// Backend is the name the answering echo server gave (Answer).
	Backend string
	// Seen names the host whose address the backend saw as the source
	// (Answer): a host of the topology, or the address itself.
	Seen string
	// ICMP names the ICMP error (RefusedICMP, and any kind an ICMP error
	// was queued for): "port-unreachable", "admin-prohibited", ...
	ICMP string
	// ICMPFrom names who sent the ICMP error (a host or an address).
	ICMPFrom string
	// Source is the client address used (multi-address probes).
	Source string
	// Detail is free text (the error).
	Detail  string
	Elapsed time.Duration
}

// Facet is the part of an attempt's outcome that is compared between
// proxies. anonymous drops the backend's name: under session affinity,
// which endpoint one client sticks to is a draw, not a behaviour.
func (a Attempt) Facet(anonymous bool) string {
	switch a.Kind {
	case Answer:
		if anonymous {
			return "answer, saw " + a.Seen
		}
		return "answer " + a.Backend + ", saw " + a.Seen
	case RefusedICMP:
		return "refused: ICMP " + a.ICMP
	case EPERM:
		// A reject in the output path queues its ICMP error on the socket
		// (a later receive fails with it); a drop queues nothing.
		if a.ICMP != "" {
			return string(EPERM) + " (ICMP " + a.ICMP + " queued)"
		}
		return string(EPERM)
	case Error:
		return "error"
	}
	return string(a.Kind)
}

// String renders an attempt with its details.
func (a Attempt) String() string {
	s := a.Facet(false)
	if a.Source != "" {
		s = "from " + a.Source + ": " + s
	}
	if a.Kind == RefusedICMP && a.ICMPFrom != "" {
		s += " (from " + a.ICMPFrom + ")"
	} else if a.Kind != RefusedICMP && a.Kind != EPERM && a.ICMP != "" {
		s += fmt.Sprintf(" (ICMP %s from %s queued too)", a.ICMP, a.ICMPFrom)
	}
	if a.Detail != "" && a.Kind != Answer {
		s += ": " + a.Detail
	}
	return s
}

// Sampling bounds: how many attempts a probe makes.
const (
	// MaxAttempts bounds the attempts of a probe whose attempts are all
	// answered (each takes about a millisecond): enough to see every one
	// of five equally likely endpoints with a probability of 1-1e-9.
	MaxAttempts = 100
	// MaxMixedAttempts bounds the attempts of a probe that met a
	// non-answer (a timeout costs the whole attempt timeout, but the
	// attempts of a wave run at once): two waves. A probe whose outcomes
	// differ is probed again with ThoroughMixedAttempts, so a rare answer
	// among timeouts is not taken for a difference.
	MaxMixedAttempts = 18
	// ThoroughMixedAttempts bounds the attempts of a Thorough probe that met
	// a non-answer: one answer in five is seen with a probability of
	// 1-1e-9.
	ThoroughMixedAttempts = 96
	// Wave is the number of attempts (or client addresses) made at once
	// after the first two.
	Wave = 16
	// StickyAttempts is the number of attempts, one after the other, from
	// the one address of a probe under session affinity.
	StickyAttempts = 4
	// AttemptsPerAddress is the number of attempts, one after the other,
	// from each client address of a multi-address probe.
	AttemptsPerAddress = 2
	// MaxMixedAddresses bounds the addresses of a multi-address probe that
	// met a non-answer (two waves), ThoroughMixedAddresses a Thorough one's.
	MaxMixedAddresses      = 1 + Wave/2
	ThoroughMixedAddresses = 40
	// MaxProbeTime bounds one probe.
	MaxProbeTime = 30 * time.Second
)

// Sampler decides, wave after wave, which attempts a probe makes and when
// it has seen enough to compare: the same non-answer on the first
// attempts when no endpoint could answer (a verdict, not a draw), every
// candidate endpoint answering (nothing left to see), or a bound. Attempts
// of a wave run at once, so a probe whose attempts time out costs a few
// timeouts, not one per attempt; attempts from one client address under
// session affinity run one after the other (the first one's endpoint must
// be recorded before the next is sent). It is pure: the runner makes the
// attempts.
type Sampler struct {
	Probe    Probe
	Attempts []Attempt
	start    time.Time
	now      func() time.Time
	// addrs is the number of client addresses used so far.
	addrs int
}

// NewSampler starts a probe's sampling; now is the clock (time.Now).
func NewSampler(p Probe, now func() time.Time) *Sampler {
	if now == nil {
		now = time.Now
	}
	return &Sampler{Probe: p, start: now(), now: now}
}

// Next returns the next wave: the client address index of each group of
// attempts to make at once, and how many attempts each group makes one
// after the other. An empty wave means the probe is done.
func (s *Sampler) Next() (addrs []int, perAddr int) {
	n := len(s.Attempts)
	if s.now().Sub(s.start) >= MaxProbeTime {
		return nil, 0
	}
	p := s.Probe
	switch {
	case p.Addresses > 1:
		// Session affinity from many addresses.
		if s.addrs > 0 && s.uniformNonAnswer() && len(p.Candidates) == 0 {
			return nil, 0
		}
		if s.addrs > 0 && s.allAnswered() && s.seenAll() {
			return nil, 0
		}
		limit := p.Addresses
		if !s.allAnswered() {
			limit = min(limit, MaxMixedAddresses)
			if p.Thorough {
				limit = min(p.Addresses, ThoroughMixedAddresses)
			}
		}
		size := Wave / 2
		if s.addrs == 0 {
			size = 1
		}
		for i := 0; i < size && s.addrs < limit; i++ {
			addrs = append(addrs, s.addrs)
			s.addrs++
		}
		return addrs, AttemptsPerAddress
	case p.Affinity:
		// One address: every attempt must stick to one endpoint.
		if n >= StickyAttempts || (n >= 2 && s.uniformNonAnswer()) {
			return nil, 0
		}
		return []int{0}, 1
	}
	if n >= 2 && s.uniformNonAnswer() && len(p.Candidates) == 0 {
		return nil, 0
	}
	if n > 0 && s.allAnswered() && s.seenAll() {
		return nil, 0
	}
	limit := MaxAttempts
	if !s.allAnswered() {
		limit = MaxMixedAttempts
		if p.Thorough {
			limit = ThoroughMixedAttempts
		}
	}
	size := Wave
	if n == 0 {
		size = 2
	}
	for i := 0; i < size && n+i < limit; i++ {
		addrs = append(addrs, 0)
	}
	return addrs, 1
}

// Record adds the outcomes of a wave's attempts.
func (s *Sampler) Record(a ...Attempt) { s.Attempts = append(s.Attempts, a...) }

// uniformNonAnswer: every attempt so far is the same non-answer.
func (s *Sampler) uniformNonAnswer() bool {
	if len(s.Attempts) == 0 || s.Attempts[0].Kind == Answer {
		return false
	}
	f := s.Attempts[0].Facet(false)
	for _, a := range s.Attempts[1:] {
		if a.Facet(false) != f {
			return false
		}
	}
	return true
}

func (s *Sampler) allAnswered() bool {
	for _, a := range s.Attempts {
		if a.Kind != Answer {
			return false
		}
	}
	return true
}

// seenAll: every candidate endpoint answered at least once (false without
// candidates: the answers then come from somewhere unexpected, sample on).
func (s *Sampler) seenAll() bool {
	if len(s.Probe.Candidates) == 0 {
		return false
	}
	seen := map[string]bool{}
	for _, a := range s.Attempts {
		seen[a.Backend] = true
	}
	for _, c := range s.Probe.Candidates {
		if !seen[c] {
			return false
		}
	}
	return true
}

// Result is a probe's outcome: its attempts and the facets compared.
type Result struct {
	Probe    Probe
	Attempts []Attempt
	// Facets are the distinct facets of the attempts, sorted, plus, under
	// session affinity, "sticky" or "not sticky".
	Facets []string
}

// Summarize turns a probe's attempts into its Result.
func Summarize(p Probe, attempts []Attempt) Result {
	r := Result{Probe: p, Attempts: attempts}
	anonymous := p.Affinity && p.Addresses <= 1
	// A backend reaching its own Service sees a node address when it
	// reaches itself and its own otherwise: under affinity from its one
	// address, which it sticks to is a draw, and so is what it sees.
	hairpin := false
	for _, c := range p.Candidates {
		hairpin = hairpin || (anonymous && strings.SplitN(c, ":", 2)[0] == p.From)
	}
	set := map[string]bool{}
	for _, a := range attempts {
		f := a.Facet(anonymous)
		if hairpin && a.Kind == Answer {
			f = "answer"
		}
		set[f] = true
	}
	if p.Affinity {
		// Per client address: every answer from one backend.
		byAddr := map[string]map[string]bool{}
		for _, a := range attempts {
			if a.Kind != Answer {
				continue
			}
			if byAddr[a.Source] == nil {
				byAddr[a.Source] = map[string]bool{}
			}
			byAddr[a.Source][a.Backend] = true
		}
		if len(byAddr) > 0 {
			sticky := "sticky"
			for _, b := range byAddr {
				if len(b) > 1 {
					sticky = "not sticky"
				}
			}
			set[sticky] = true
		}
	}
	for f := range set {
		r.Facets = append(r.Facets, f)
	}
	sort.Strings(r.Facets)
	return r
}

// Same reports whether two results have the same facets.
func Same(a, b Result) bool {
	return strings.Join(a.Facets, "\n") == strings.Join(b.Facets, "\n")
}

// Outcome renders the facets in one line, with the number of attempts.
func (r Result) Outcome() string {
	if len(r.Facets) == 0 {
		return "(no attempt)"
	}
	return fmt.Sprintf("%s (%d attempts)", strings.Join(r.Facets, "; "), len(r.Attempts))
}

// Has reports whether one of the facets is f, or starts with f followed
// by a space or a colon (Has("answer") matches every answer).
func (r Result) Has(f string) bool {
	for _, x := range r.Facets {
		if x == f || strings.HasPrefix(x, f+" ") || strings.HasPrefix(x, f+",") || strings.HasPrefix(x, f+":") {
			return true
		}
	}
	return false
}

// Only reports whether every facet is one of fs (by Has's rule).
func (r Result) Only(fs ...string) bool {
	if len(r.Facets) == 0 {
		return false
	}
	for _, x := range r.Facets {
		one := Result{Facets: []string{x}}
		ok := false
		for _, f := range fs {
			ok = ok || one.Has(f)
		}
		if !ok {
			return false
		}
	}
	return true
}

// Backends returns the distinct backends that answered, sorted.
func (r Result) Backends() []string {
	set := map[string]bool{}
	for _, a := range r.Attempts {
		if a.Kind == Answer {
			set[a.Backend] = true
		}
	}
	out := make([]string, 0, len(set))
	for b := range set {
		out = append(out, b)
	}
	sort.Strings(out)
	return out
}
