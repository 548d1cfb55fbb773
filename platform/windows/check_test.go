package windows

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// liveObjects programs a "real" Service through a backend, as kproxy on the
// node would have, so the check can prove it leaves it alone.
func liveObjects(t *testing.T, f *FakeHNS, o CheckOptions) {
	t.Helper()
	b, err := New(Options{HNS: f, NetworkName: "vxlan0", SourceVIP: o.SourceVIP, NodeIP: o.NodeIP, Interfaces: o.Interfaces})
	if err != nil {
		t.Fatal(err)
	}
	s := snap(node(), svcPort("web", "TCP", "10.96.0.10", 80, nodePort(30080), eps(localEP("10.244.1.5", 8080), remoteEP("10.244.2.5", 8080))))
	if err := b.Sync(context.Background(), s, proxy.Changes{Full: true}); err != nil {
		t.Fatal(err)
	}
}

func TestCheckHNSAgainstExactFake(t *testing.T) {
	f, o := FakeNode(0)
	liveObjects(t, f, o)
	before := f.Dump()
	res, err := CheckHNS(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := res.Write(&out); err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("an exact HNS must pass:\n%s", out.String())
	}
	for _, want := range []string{
		"endpoint 10.244.2.254", "Policies.ProviderAddress       10.0.0.2",
		"load balancer v4 TCP *:32767", "PortMappings.Flags", "18",
		"load balancer v4 TCP 198.18.0.10:80", "load balancer v4 TCP 198.18.0.11:80",
		"load balancer v4 TCP 198.18.0.13:81", "SourceVIP", "10.244.1.250",
		"OK: HNS returned every field",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	mustEqual(t, "HNS after the check (everything it created deleted, the rest untouched)", f.Dump(), before)
}

// An HNS that does not return the un-echoed fields: the table shows each
// one, the exit status is non-zero, but the resync check passes (kproxy's
// record fills them in), and everything is cleaned up.
func TestCheckHNSAgainstDroppingFake(t *testing.T) {
	f, o := FakeNode(DropUnechoed)
	before := f.Dump()
	res, err := CheckHNS(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := res.Write(&out); err != nil {
		t.Fatal(err)
	}
	if res.OK() {
		t.Fatalf("fields left out must be reported:\n%s", out.String())
	}
	if len(res.Problems) != 0 {
		t.Errorf("a resync must change nothing even when HNS leaves fields out: %q", res.Problems)
	}
	var diff []string
	for _, r := range res.Rows {
		if !r.OK() {
			diff = append(diff, r.Field)
		}
	}
	got := strings.Join(uniq(diff), ",")
	if got != "Policies.ProviderAddress,SourceVIP,PortMappings.DistributionType,PortMappings.Flags,Flags" {
		t.Errorf("different fields: %s\n%s", got, out.String())
	}
	if !strings.Contains(out.String(), "(not returned)") || !strings.Contains(out.String(), "DIFFERENCES") {
		t.Errorf("output:\n%s", out.String())
	}
	mustEqual(t, "HNS after the check", f.Dump(), before)
}

// The check never deletes or changes what it did not create: an address it
// would use that already has a kproxy endpoint is used as it is.
func TestCheckHNSReusesExistingEndpoint(t *testing.T) {
	f, o := FakeNode(0)
	o.RemoteIP = netip.MustParseAddr("10.244.2.5")
	liveObjects(t, f, o) // holds a remote endpoint for 10.244.2.5
	before := f.Dump()
	res, err := CheckHNS(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 0 {
		t.Errorf("problems: %q", res.Problems)
	}
	mustEqual(t, "HNS after the check", f.Dump(), before)
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
