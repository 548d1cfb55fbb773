package model_test

import (
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"
)

// typesSeen records the dynamic types of the statements and expressions
// of parsed rules ("*nft.Match", "*nft.Numgen").
type typesSeen map[string]bool

func (ts typesSeen) rule(r nft.Rule) {
	var expr func(e nft.Expr)
	expr = func(e nft.Expr) {
		ts[reflect.TypeOf(e).String()] = true
		if j, ok := e.(*nft.Jhash); ok {
			expr(j.Of)
		}
	}
	exprs := func(es []nft.Expr) {
		for _, e := range es {
			expr(e)
		}
	}
	for _, s := range r {
		ts[reflect.TypeOf(s).String()] = true
		switch x := s.(type) {
		case *nft.Match:
			exprs(x.Left)
		case *nft.VMap:
			exprs(x.Key)
		case *nft.DNAT:
			exprs(x.Key)
		case *nft.Update:
			expr(x.Key)
		}
	}
}

// roundTrip writes every base chain spec, rule, element and set
// definition of m as text and reads it back as the Fake does: it must read
// into the same values, which write the same text. It returns the number
// of rules and elements checked.
func roundTrip(t *testing.T, ip string, m *nftmodel.Model, seen typesSeen) (rules, elems int) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(m.Chains)) {
		c := m.Chains[name]
		if c.Base != nil {
			b, err := nftmodel.ParseBase(c.Base.String())
			if err != nil {
				t.Errorf("chain %s: %v", name, err)
			} else if b != *c.Base {
				t.Errorf("chain %s: base %v read back as %v", name, *c.Base, b)
			}
		}
		for i, r := range c.Rules {
			text := r.String()
			back, err := nftmodel.ParseRule(ip, text)
			if err != nil {
				t.Errorf("chain %s rule %d (%s): %v", name, i+1, text, err)
				continue
			}
			if got := back.String(); got != text || !reflect.DeepEqual(back, r) {
				t.Errorf("chain %s rule %d:\n\twritten %s\n\tread    %s (%#v, want %#v)", name, i+1, text, got, back, r)
			}
			seen.rule(r)
			rules++
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.Sets)) {
		s := m.Sets[name]
		if spec, err := nftmodel.ParseSpec(s.Spec.String()); err != nil || !reflect.DeepEqual(spec, s.Spec) {
			t.Errorf("set %s: definition %#v read back as %#v: %v", name, s.Spec, spec, err)
		}
		for id, e := range s.Elements {
			want := e.String()
			if !strings.HasPrefix(want, id) {
				t.Errorf("set %s: element %s filed under %s", name, want, id)
			}
			te, err := nftmodel.ParseElem(s, want)
			if err != nil {
				t.Errorf("set %s element %s: %v", name, want, err)
				continue
			}
			if got := te.String(); got != want || !reflect.DeepEqual(te, e) {
				t.Errorf("set %s element:\n\twritten %s\n\tread    %s", name, want, got)
			}
			elems++
		}
	}
	return rules, elems
}

// TestTypedRoundTrip: every base chain, rule and element the renderer
// writes (rich ports under every configuration, both families; read by the
// Fake), and every one read back from the kernel's JSON listings of
// testdata/json (built as values), writes a text that reads back into the
// same typed values of package nft; and the rules met hold every statement
// and expression type.
func TestTypedRoundTrip(t *testing.T) {
	seen := typesSeen{}
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		fa := addrsOf(fam)
		ip := "ip"
		if fam == v1.IPv6Protocol {
			ip = "ip6"
		}
		for _, tc := range traceConfigs(fa) {
			t.Run(string(fam)+"/"+tc.name, func(t *testing.T) {
				f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
				plan, _ := nfttest.Renderer(t, tc.cfg).Render(nftables.Input{Full: true, Ports: richPorts(t, fa, tc), Node: tc.node}, nil)
				nfttest.Run(t, f, plan)
				rules, elems := roundTrip(t, ip, f.Model(), seen)
				if rules < 50 || elems < 50 {
					t.Errorf("rendered: %d rules, %d elements checked: too few", rules, elems)
				}
				path := filepath.Join("testdata", "json", strings.ToLower(string(fam))+"-"+tc.name+".json.gz")
				l, err := nftmodel.ParseJSON(nftables.Family(fam), nftables.TableName, readGz(t, path))
				if err != nil {
					t.Fatal(err)
				}
				rules, elems = roundTrip(t, ip, l.Model, seen)
				if rules < 50 || elems < 50 {
					t.Errorf("%s: %d rules, %d elements checked: too few", path, rules, elems)
				}
			})
		}
	}
	for _, typ := range []any{&nft.Match{}, &nft.Verdict{}, &nft.VMap{}, &nft.DNAT{}, &nft.Masquerade{}, &nft.Reject{}, &nft.MarkSet{}, &nft.Update{},
		&nft.Payload{}, &nft.Meta{}, &nft.Fib{}, &nft.Numgen{}, &nft.Jhash{}, &nft.CT{}} {
		if n := reflect.TypeOf(typ).String(); !seen[n] {
			t.Errorf("no rendered rule holds a %s", n)
		}
	}
}

// TestTypedWritesBack: forms the renderer does not write today, which the
// tracer reads, write back as they were read.
func TestTypedWritesBack(t *testing.T) {
	for _, text := range []string{
		"meta mark set 0x10",
		"meta mark set meta mark & 0xffffbfff",
		"meta mark & 0x00004000 != 0 accept",
		"reject with icmp type host-unreachable",
		"reject with icmpx type admin-prohibited",
		"dnat to 10.0.0.1",
		"dnat ip to 10.0.0.1",
		"numgen random mod 4 offset 2 3 accept",
		"numgen inc mod 4 != { 0, 1 } drop",
		"jhash ip daddr mod 4 seed 0x00000001 offset 1 2 drop",
		"ip saddr . tcp dport { 10.0.0.1 . 80, 10.0.0.2 . 443 } accept",
		"ip saddr . ip daddr 10.0.0.1 . 10.0.0.0/24 accept",
		"tcp sport >= 1024 return",
		"udp dport <= 53 goto x",
		"meta l4proto 6 drop",
		"meta l4proto { tcp, udp } drop",
		"ct status dnat ct state new drop",
		`oifname "eth0" masquerade random persistent`,
		`iifname != { "eth0", "veth*" } return`,
		"fib saddr type { local, multicast } accept",
		"meta mark 0x4000 jump x",
		"ip daddr != @s ip saddr @t goto y",
	} {
		r, err := nftmodel.ParseRule("ip", text)
		if err != nil {
			t.Errorf("%s: %v", text, err)
			continue
		}
		if got := r.String(); got != text {
			t.Errorf("read %s, written %s", text, got)
		}
	}
	// Forms read into the same values as a canonical one, and written as it.
	for _, c := range [][2]string{
		{"meta iifname \"eth0\" accept", "iifname \"eth0\" accept"},
		{"ip daddr { 10.0.0.1, 10.0.0.2, } accept", "ip daddr { 10.0.0.1, 10.0.0.2 } accept"},
		{"ip daddr  10.0.0.1   accept", "ip daddr 10.0.0.1 accept"},
		{"ip saddr 10.0.0.1/8 drop", "ip saddr 10.0.0.0/8 drop"},
		{"jhash ip saddr mod 2 seed 7 0 drop", "jhash ip saddr mod 2 seed 0x00000007 0 drop"},
	} {
		r, err := nftmodel.ParseRule("ip", c[0])
		if err != nil {
			t.Errorf("%s: %v", c[0], err)
			continue
		}
		if got := r.String(); got != c[1] {
			t.Errorf("read %s, written %s, want %s", c[0], got, c[1])
		}
	}
}
