package model

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
)

// addrMatch is -s or -d: (addr & mask) == want.
type addrMatch struct {
	set, neg bool
	want     netip.Addr
	mask     netip.Addr
}

func (m addrMatch) matches(a netip.Addr) bool {
	if !m.set {
		return true
	}
	ok := a.IsValid() && a.Is4() == m.want.Is4() && maskAddr(a, m.mask) == maskAddr(m.want, m.mask)
	return ok != m.neg
}

func maskAddr(a, mask netip.Addr) netip.Addr {
	if a.Is4() {
		x, m := a.As4(), mask.As4()
		for i := range x {
			x[i] &= m[i]
		}
		return netip.AddrFrom4(x)
	}
	x, m := a.As16(), mask.As16()
	for i := range x {
		x[i] &= m[i]
	}
	return netip.AddrFrom16(x)
}

// parseAddrMask parses "addr", "addr/len" or "addr/mask".
func parseAddrMask(s string) (netip.Addr, netip.Addr, error) {
	addrS, maskS, hasMask := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addrS)
	if err != nil {
		return a, a, fmt.Errorf("bad address %q", s)
	}
	bits := a.BitLen()
	if !hasMask {
		return a, prefixMask(bits, bits), nil
	}
	if n, err := strconv.Atoi(maskS); err == nil {
		if n < 0 || n > bits {
			return a, a, fmt.Errorf("bad prefix length in %q", s)
		}
		return a, prefixMask(bits, n), nil
	}
	m, err := netip.ParseAddr(maskS)
	if err != nil || m.Is4() != a.Is4() {
		return a, a, fmt.Errorf("bad mask in %q", s)
	}
	return a, m, nil
}

func prefixMask(bits, n int) netip.Addr {
	var b [16]byte
	for i := 0; i < n; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	if bits == 32 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// portRange is an inclusive range of ports.
type portRange struct{ lo, hi uint16 }

func parsePortRange(s string) (portRange, error) {
	loS, hiS, isRange := strings.Cut(s, ":")
	lo, err := strconv.ParseUint(loS, 10, 16)
	if err != nil {
		return portRange{}, fmt.Errorf("bad port %q", s)
	}
	hi := lo
	if isRange {
		if hi, err = strconv.ParseUint(hiS, 10, 16); err != nil || hi < lo {
			return portRange{}, fmt.Errorf("bad port range %q", s)
		}
	}
	return portRange{uint16(lo), uint16(hi)}, nil
}

func (r portRange) has(p uint16) bool { return p >= r.lo && p <= r.hi }

// match is one "-m" module occurrence (or an implicit protocol match).
type match struct {
	module string
	neg    map[string]bool // option → negated
	opts   map[string]string

	// parsed forms
	dports, sports []portRange
	mark, markMask uint32
	states         []string
	probability    float64
	srcType        string
	dstType        string
	recentName     string
	recentMode     string // set, update, rcheck, remove
	// statistic --mode nth: every is --every minus one, as the kernel keeps
	// it; nth holds the counter, shared by every trace (one per rule, as the
	// kernel keeps one per rule instance).
	nth   bool
	every uint32
	count *atomic.Uint32
	// cluster: total nodes (slots), the mask of matching slots, the seed.
	clusterTotal, clusterMask, clusterSeed uint32
}

// target is the rule's verdict.
type target struct {
	name   string // ACCEPT, DROP, RETURN, REJECT, DNAT, SNAT, MARK, MASQUERADE or a chain
	isGoto bool
	// DNAT/SNAT
	toAddr netip.Addr
	toPort uint16
	// MARK: mark = (mark &^ markMask) ^ markValue
	markValue, markMask uint32
}

// builtinTargets are the targets that are not chains.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "DNAT": true,
	"SNAT": true, "MARK": true, "MASQUERADE": true, "LOG": true, "CONNMARK": true,
}

// Rule is one parsed rule.
type Rule struct {
	// Spec is the rule's text after "-A CHAIN ", as given.
	Spec string

	src, dst          addrMatch
	proto             string
	protoNeg          bool
	inIface, outIface string
	inNeg, outNeg     bool
	matches           []*match
	target            target
}

// Target returns the rule's target: a built-in target name or a chain.
func (r *Rule) Target() string { return r.target.name }

// IsJump reports whether the rule jumps or goes to a user chain.
func (r *Rule) IsJump() bool { return r.target.name != "" && !builtinTargets[r.target.name] }

func parseMark(s string) (uint32, uint32, error) {
	vS, mS, hasMask := strings.Cut(s, "/")
	v, err := strconv.ParseUint(vS, 0, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("bad mark %q", s)
	}
	m := uint64(0xffffffff)
	if hasMask {
		if m, err = strconv.ParseUint(mS, 0, 32); err != nil {
			return 0, 0, fmt.Errorf("bad mark mask %q", s)
		}
	}
	return uint32(v), uint32(m), nil
}

// ParseRule parses a rule specification (the arguments after "-A CHAIN").
func ParseRule(args []string) (*Rule, error) {
	r := &Rule{Spec: strings.Join(quoteArgs(args), " ")}
	var cur *match
	neg := false
	next := func(i *int, opt string) (string, error) {
		if *i+1 >= len(args) {
			return "", fmt.Errorf("option %s needs a value", opt)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			neg = true
			continue
		}
		var err error
		var v string
		switch a {
		case "-s", "--source", "-d", "--destination":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			want, mask, perr := parseAddrMask(v)
			if perr != nil {
				return nil, perr
			}
			m := addrMatch{set: true, neg: neg, want: want, mask: mask}
			if a == "-s" || a == "--source" {
				r.src = m
			} else {
				r.dst = m
			}
		case "-p", "--protocol":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			switch v {
			case "tcp", "udp", "sctp", "icmp", "ipv6-icmp", "icmpv6", "all":
			default:
				return nil, fmt.Errorf("unknown protocol %q", v)
			}
			r.proto, r.protoNeg = v, neg
		case "-i", "--in-interface":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			r.inIface, r.inNeg = v, neg
		case "-o", "--out-interface":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			r.outIface, r.outNeg = v, neg
		case "-m", "--match":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			switch v {
			case "comment", "tcp", "udp", "sctp", "addrtype", "mark", "conntrack", "statistic", "recent", "multiport", "cluster":
			default:
				return nil, fmt.Errorf("unknown match %q", v)
			}
			if (v == "tcp" || v == "udp" || v == "sctp") && r.proto != v {
				return nil, fmt.Errorf("match %q needs -p %s", v, v)
			}
			cur = &match{module: v, neg: map[string]bool{}, opts: map[string]string{}}
			r.matches = append(r.matches, cur)
		case "-j", "--jump", "-g", "--goto":
			if neg {
				return nil, fmt.Errorf("unknown argument \"!\" before %s", a)
			}
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			r.target = target{name: v, isGoto: a == "-g" || a == "--goto"}
			if err := parseTarget(r, args[i+1:]); err != nil {
				return nil, err
			}
			i = len(args)
		default:
			if !strings.HasPrefix(a, "--") || cur == nil {
				return nil, fmt.Errorf("unknown argument %q", a)
			}
			if err := parseMatchOption(cur, a, neg, args, &i); err != nil {
				return nil, err
			}
		}
		neg = false
	}
	if neg {
		return nil, errors.New("dangling \"!\"")
	}
	for _, m := range r.matches {
		if err := finishMatch(m); err != nil {
			return nil, err
		}
	}
	r.Spec = saveCluster(r.Spec)
	return r, nil
}

// optionArity lists the match options the model knows and whether they take a value.
var optionArity = map[string]map[string]bool{
	"comment":   {"--comment": true},
	"tcp":       {"--dport": true, "--sport": true, "--destination-port": true, "--source-port": true},
	"udp":       {"--dport": true, "--sport": true, "--destination-port": true, "--source-port": true},
	"sctp":      {"--dport": true, "--sport": true, "--destination-port": true, "--source-port": true},
	"multiport": {"--dports": true, "--sports": true, "--destination-ports": true},
	"addrtype":  {"--src-type": true, "--dst-type": true},
	"mark":      {"--mark": true},
	"conntrack": {"--ctstate": true},
	"statistic": {"--mode": true, "--probability": true, "--every": true, "--packet": true},
	"cluster": {"--cluster-total-nodes": true, "--cluster-local-nodemask": true, "--cluster-local-node": true,
		"--cluster-hash-seed": true},
	"recent": {"--set": false, "--update": false, "--rcheck": false, "--remove": false,
		"--seconds": true, "--reap": false, "--name": true, "--mask": true, "--rsource": false,
		"--rdest": false, "--hitcount": true, "--rttl": false},
}

func parseMatchOption(m *match, opt string, neg bool, args []string, i *int) error {
	takes, ok := optionArity[m.module][opt]
	if !ok {
		return fmt.Errorf("unknown option %q for match %q", opt, m.module)
	}
	if _, dup := m.opts[opt]; dup {
		return fmt.Errorf("option %q given twice", opt)
	}
	val := ""
	if takes {
		if *i+1 >= len(args) {
			return fmt.Errorf("option %s needs a value", opt)
		}
		*i++
		val = args[*i]
	}
	m.opts[opt] = val
	m.neg[opt] = neg
	return nil
}

func finishMatch(m *match) error {
	var err error
	ports := func(list string) ([]portRange, error) {
		var out []portRange
		for _, p := range strings.Split(list, ",") {
			r, err := parsePortRange(p)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		return out, nil
	}
	switch m.module {
	case "tcp", "udp", "sctp", "multiport":
		for _, o := range []string{"--dport", "--destination-port", "--dports", "--destination-ports"} {
			if v, ok := m.opts[o]; ok {
				if m.dports, err = ports(v); err != nil {
					return err
				}
				m.neg["dport"] = m.neg[o]
			}
		}
		for _, o := range []string{"--sport", "--source-port", "--sports"} {
			if v, ok := m.opts[o]; ok {
				if m.sports, err = ports(v); err != nil {
					return err
				}
				m.neg["sport"] = m.neg[o]
			}
		}
	case "addrtype":
		m.srcType, m.dstType = m.opts["--src-type"], m.opts["--dst-type"]
		for _, t := range []string{m.srcType, m.dstType} {
			if t != "" && t != "LOCAL" {
				return fmt.Errorf("addrtype %q not modelled", t)
			}
		}
	case "mark":
		v, ok := m.opts["--mark"]
		if !ok {
			return errors.New("mark match needs --mark")
		}
		if m.mark, m.markMask, err = parseMark(v); err != nil {
			return err
		}
	case "conntrack":
		v, ok := m.opts["--ctstate"]
		if !ok {
			return errors.New("conntrack match needs --ctstate")
		}
		m.states = strings.Split(v, ",")
		for _, s := range m.states {
			switch s {
			case "NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED", "DNAT", "SNAT":
			default:
				return fmt.Errorf("unknown ctstate %q", s)
			}
		}
	case "statistic":
		if m.opts["--mode"] == "nth" {
			return finishNth(m)
		}
		if m.opts["--mode"] != "random" {
			return fmt.Errorf("statistic mode %q not modelled", m.opts["--mode"])
		}
		if m.probability, err = strconv.ParseFloat(m.opts["--probability"], 64); err != nil || m.probability < 0 || m.probability > 1 {
			return fmt.Errorf("bad probability %q", m.opts["--probability"])
		}
	case "cluster":
		return finishCluster(m)
	case "recent":
		m.recentName = m.opts["--name"]
		if m.recentName == "" {
			m.recentName = "DEFAULT"
		}
		for _, mode := range []string{"--set", "--update", "--rcheck", "--remove"} {
			if _, ok := m.opts[mode]; ok {
				if m.recentMode != "" {
					return errors.New("recent: more than one of --set, --update, --rcheck, --remove")
				}
				m.recentMode = mode[2:]
			}
		}
		if m.recentMode == "" {
			return errors.New("recent: one of --set, --update, --rcheck, --remove is required")
		}
		if _, ok := m.opts["--reap"]; ok {
			if _, ok := m.opts["--seconds"]; !ok {
				return errors.New("recent: --reap needs --seconds")
			}
		}
	}
	return nil
}

func parseTarget(r *Rule, rest []string) error {
	t := &r.target
	opts := map[string]string{}
	for i := 0; i < len(rest); i++ {
		o := rest[i]
		if !strings.HasPrefix(o, "--") {
			return fmt.Errorf("unexpected %q after target %s", o, t.name)
		}
		switch o {
		case "--random-fully", "--random", "--persistent":
			opts[o] = ""
			continue
		}
		if i+1 >= len(rest) {
			return fmt.Errorf("target option %s needs a value", o)
		}
		opts[o] = rest[i+1]
		i++
	}
	allowed := map[string][]string{
		"DNAT":       {"--to-destination", "--random", "--persistent"},
		"SNAT":       {"--to-source", "--random", "--random-fully", "--persistent"},
		"MASQUERADE": {"--random-fully", "--random", "--to-ports"},
		"MARK":       {"--set-xmark", "--set-mark", "--or-mark", "--xor-mark", "--and-mark"},
		"REJECT":     {"--reject-with"},
		"LOG":        {"--log-prefix", "--log-level"},
	}
	for o := range opts {
		ok := false
		for _, a := range allowed[t.name] {
			ok = ok || a == o
		}
		if !ok {
			return fmt.Errorf("unknown option %q for target %s", o, t.name)
		}
	}
	switch t.name {
	case "DNAT", "SNAT":
		key := "--to-destination"
		if t.name == "SNAT" {
			key = "--to-source"
		}
		v, ok := opts[key]
		if !ok {
			return fmt.Errorf("%s needs %s", t.name, key)
		}
		if ap, err := netip.ParseAddrPort(v); err == nil {
			if r.proto != "tcp" && r.proto != "udp" && r.proto != "sctp" {
				return fmt.Errorf("%s to a port needs -p tcp, udp or sctp", t.name)
			}
			t.toAddr, t.toPort = ap.Addr(), ap.Port()
		} else if a, err := netip.ParseAddr(v); err == nil {
			t.toAddr = a
		} else {
			return fmt.Errorf("bad %s %q", key, v)
		}
	case "MARK":
		if len(opts) != 1 {
			return errors.New("MARK needs exactly one of --set-xmark, --set-mark, --or-mark, --xor-mark, --and-mark")
		}
		for o, v := range opts {
			val, mask, err := parseMark(v)
			if err != nil {
				return err
			}
			switch o {
			case "--set-xmark":
				t.markValue, t.markMask = val, mask
			case "--set-mark":
				t.markValue, t.markMask = val, mask|val
			case "--or-mark":
				t.markValue, t.markMask = val, val
			case "--xor-mark":
				t.markValue, t.markMask = val, 0
			case "--and-mark":
				t.markValue, t.markMask = 0, ^val
			}
		}
	case "REJECT":
		if v, ok := opts["--reject-with"]; ok {
			switch v {
			case "icmp-port-unreachable", "icmp-host-unreachable", "icmp-net-unreachable", "tcp-reset",
				"icmp6-port-unreachable", "icmp6-adm-prohibited", "icmp-admin-prohibited", "adm-prohibited":
			default:
				return fmt.Errorf("unknown --reject-with %q", v)
			}
		}
	}
	return nil
}

// stringOptions are the options whose values iptables-save prints as strings.
var stringOptions = map[string]bool{"--comment": true, "--log-prefix": true}

// quoteArgs re-quotes arguments the way iptables-save prints them: string
// option values (comments) bare only when made of letters, digits, '_' and
// '-', else in double quotes with '"', '\\' and '\” escaped; other
// arguments quoted only when they hold blanks.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case i > 0 && stringOptions[args[i-1]]:
			out[i] = syntax.SaveString(a)
		case a == "" || strings.ContainsAny(a, " \t\""):
			out[i] = strconv.Quote(a)
		default:
			out[i] = a
		}
	}
	return out
}
