package trace

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// MaxDepth bounds the chains a trace may jump into, one inside the other:
// deeper is a jump loop.
const MaxDepth = 64

// CheckDepth errors when depth is over MaxDepth; where names the chain
// entered.
func CheckDepth(depth int, where string) error {
	if depth > MaxDepth {
		return fmt.Errorf("jump depth over %d at %s (loop?)", MaxDepth, where)
	}
	return nil
}

// State is one branch of a trace: the packet as the rules have left it so
// far, and what the trace has recorded on the way. Copies share slices
// until Clone; Note, AddStep and AddAffinity append through slices.Clip,
// so that a copy never writes into another's array.
type State struct {
	// Pkt is the packet as it was sent; Dst and DstPort are its
	// destination now (rewritten by a DNAT).
	Pkt Packet
	// Hook is the hook whose chains are being walked ("prerouting",
	// "output", ...).
	Hook    string
	Dst     netip.Addr
	DstPort uint16
	// Prob is the probability of this branch.
	Prob float64
	Mark uint32
	// DNAT and Masq: the destination was rewritten, the source masqueraded.
	DNAT, Masq bool
	// Affinity lists the affinity lists or sets the source was added to.
	Affinity []string
	Path     []string
	Steps    []Step
	// Counters holds the numgen inc counters (nil: not tracked); copied
	// on write.
	Counters map[string]uint32
}

// NewState is the state of p before any rule, on host h.
func NewState(h Host, p Packet) State {
	st := State{Pkt: p, Dst: p.Dst, DstPort: p.DstPort, Prob: 1}
	if h.Counters != nil {
		st.Counters = maps.Clone(h.Counters)
	}
	return st
}

// Clone returns a copy of s that shares no slice with it (the counters
// are copied on write, not here).
func (s State) Clone() State {
	s.Affinity = slices.Clone(s.Affinity)
	s.Path = slices.Clone(s.Path)
	s.Steps = slices.Clone(s.Steps)
	return s
}

// Note appends a line to the path.
func (s *State) Note(format string, args ...any) {
	s.Path = append(slices.Clip(s.Path), fmt.Sprintf(format, args...))
}

// AddStep records a rule taken.
func (s *State) AddStep(st Step) {
	s.Steps = append(slices.Clip(s.Steps), st)
}

// AddAffinity records that the source is added to the affinity list or
// set name.
func (s *State) AddAffinity(name string) {
	s.Affinity = append(slices.Clip(s.Affinity), name)
}

// End is how a branch's walk of a chain ended.
type End uint8

// Ends.
const (
	// EndNone: it fell off the end of the chain, or returned.
	EndNone End = iota
	// EndAccept: accepted (a DNAT or a masquerade accepts too).
	EndAccept
	// EndDrop and EndReject: the packet goes no further.
	EndDrop
	EndReject
	// EndUnknown: it met a rule the tracer does not simulate.
	EndUnknown
)

// Final reports whether the packet goes no further than e (a drop, a
// reject, or what is not simulated).
func (e End) Final() bool { return e == EndDrop || e == EndReject || e == EndUnknown }

// Branch is a state and how its walk of a chain ended.
type Branch struct {
	St  State
	End End
}

// Verdict is the fate of a branch whose trace is over.
func (b Branch) Verdict() Verdict {
	switch {
	case b.End == EndDrop:
		return VerdictDrop
	case b.End == EndReject:
		return VerdictReject
	case b.End == EndUnknown:
		return VerdictUnknown
	case b.St.DNAT:
		return VerdictDNAT
	}
	return VerdictAccept
}

// Outcome is the outcome of a branch whose trace is over, delivered where
// the caller says.
func (b Branch) Outcome(delivered string) Outcome {
	st := b.St
	return Outcome{Verdict: b.Verdict(), Dst: netip.AddrPortFrom(st.Dst, st.DstPort), DNAT: st.DNAT, Masquerade: st.Masq,
		Probability: st.Prob, Delivered: delivered, Mark: st.Mark, Path: st.Path, Steps: st.Steps,
		AffinitySets: st.Affinity, Counters: st.Counters}
}
