package trace

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestRoute(t *testing.T) {
	node, remote := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.244.2.5")
	h := Host{LocalAddrs: []netip.Addr{node}}
	for _, c := range []struct {
		local     bool
		dst       netip.Addr
		delivered string
		hooks     string
	}{
		{false, node, DeliveredLocal, "input"},
		{false, netip.MustParseAddr("127.0.0.1"), DeliveredLocal, "input"},
		{false, remote, DeliveredForward, "forward postrouting"},
		{true, node, DeliveredLocal, "postrouting input"},
		{true, remote, DeliveredOut, "postrouting"},
	} {
		d, hooks := Route(h, Packet{Local: c.local}, c.dst)
		if d != c.delivered || strings.Join(hooks, " ") != c.hooks {
			t.Errorf("local %v to %s: %s %v, want %s %s", c.local, c.dst, d, hooks, c.delivered, c.hooks)
		}
	}
}

func TestBranchVerdict(t *testing.T) {
	dnat := State{DNAT: true}
	for _, c := range []struct {
		b    Branch
		want Verdict
	}{
		{Branch{}, VerdictAccept},
		{Branch{End: EndAccept}, VerdictAccept},
		{Branch{St: dnat, End: EndAccept}, VerdictDNAT},
		{Branch{St: dnat}, VerdictDNAT},
		{Branch{St: dnat, End: EndDrop}, VerdictDrop},
		{Branch{St: dnat, End: EndReject}, VerdictReject},
		{Branch{St: dnat, End: EndUnknown}, VerdictUnknown},
	} {
		if got := c.b.Verdict(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.b, got, c.want)
		}
		if final := c.want == VerdictDrop || c.want == VerdictReject || c.want == VerdictUnknown; c.b.End.Final() != final {
			t.Errorf("%+v: Final %v, want %v", c.b, !final, final)
		}
	}
	o := Branch{St: State{Dst: netip.MustParseAddr("10.0.0.2"), DstPort: 80, DNAT: true, Prob: 0.5}, End: EndDrop}.Outcome("")
	if o.Verdict != VerdictDrop || !o.DNAT || o.Dst.String() != "10.0.0.2:80" || o.Probability != 0.5 {
		t.Errorf("outcome %+v", o)
	}
}

// TestStateBranchesShareNothing: a note, step or affinity added to one
// branch never shows in another made from the same state.
func TestStateBranchesShareNothing(t *testing.T) {
	h := Host{Counters: map[string]uint32{"c #1": 2}}
	base := NewState(h, Packet{Dst: netip.MustParseAddr("10.0.0.1"), DstPort: 80})
	h.Counters["c #1"] = 7
	if base.Counters["c #1"] != 2 || base.Prob != 1 || base.DstPort != 80 {
		t.Fatalf("NewState: %+v", base)
	}
	base.Note("a")
	base.Path = slices.Grow(base.Path, 4) // room to append in place
	a, b := base, base.Clone()
	a.Note("x %d", 1)
	b.Note("y")
	base.Note("z")
	a.AddStep(Step{Chain: "A"})
	a.AddAffinity("aff-1")
	if got := strings.Join(a.Path, ","); got != "a,x 1" {
		t.Errorf("a path %q", got)
	}
	if got := strings.Join(b.Path, ","); got != "a,y" {
		t.Errorf("b path %q", got)
	}
	if got := strings.Join(base.Path, ","); got != "a,z" {
		t.Errorf("base path %q", got)
	}
	if len(base.Steps) != 0 || len(base.Affinity) != 0 || len(b.Steps) != 0 {
		t.Errorf("steps or affinity leaked: base %+v b %+v", base, b)
	}
}

func TestCheckDepth(t *testing.T) {
	if err := CheckDepth(MaxDepth, "x"); err != nil {
		t.Error(err)
	}
	if err := CheckDepth(MaxDepth+1, "nat/L1"); err == nil || err.Error() != "jump depth over 64 at nat/L1 (loop?)" {
		t.Errorf("over the limit: %v", err)
	}
}
