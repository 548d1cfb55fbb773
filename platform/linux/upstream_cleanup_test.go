package linux

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

type fakeIPSets struct {
	sets      []string
	missing   bool
	destroyed []string
}

func (f *fakeIPSets) List(context.Context) ([]string, error) {
	if f.missing {
		return nil, ErrNoIPSetTool
	}
	return f.sets, nil
}

func (f *fakeIPSets) Destroy(_ context.Context, name string) error {
	f.destroyed = append(f.destroyed, name)
	return nil
}

// TestCleanupUpstreamIPSets destroys only kube-proxy's KUBE-* sets and
// reports a missing ipset tool as ErrNoIPSetTool.
func TestCleanupUpstreamIPSets(t *testing.T) {
	f := &fakeIPSets{sets: []string{"OTHER", "KUBE-NODE-PORT-TCP", "KUBE-CLUSTER-IP", "cali40all-hosts"}}
	got, err := CleanupUpstreamIPSets(context.Background(), f)
	if err != nil || !slices.Equal(got, []string{"KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP"}) || !slices.Equal(f.destroyed, got) {
		t.Errorf("got %v %v, destroyed %v", got, err, f.destroyed)
	}
	if _, err := CleanupUpstreamIPSets(context.Background(), &fakeIPSets{missing: true}); !errors.Is(err, ErrNoIPSetTool) {
		t.Errorf("missing tool: %v, want ErrNoIPSetTool", err)
	}
}

// TestCleanupUpstreamNFTables deletes only the family's kube-proxy table.
func TestCleanupUpstreamNFTables(t *testing.T) {
	f := &FakeNFTables{Tables: []string{"ip kube-proxy", "ip6 kube-proxy", "inet kube-proxy-other", "ip nat"}}
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol, v1.IPv6Protocol} {
		if _, err := CleanupUpstreamNFTables(context.Background(), f, fam); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(f.Tables, []string{"inet kube-proxy-other", "ip nat"}) {
		t.Errorf("tables left: %v", f.Tables)
	}
}

// TestCleanupUpstreamIptables removes kube-proxy's chains of the iptables
// and ipvs modes with their jumps, and nothing else.
func TestCleanupUpstreamIptables(t *testing.T) {
	f := NewFakeIptables()
	err := f.Restore(context.Background(), []byte(`*nat
:KUBE-SERVICES - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:OTHER - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A PREROUTING -j OTHER
-A KUBE-SERVICES -j KUBE-LOAD-BALANCER
COMMIT
*filter
:KUBE-IPVS-FILTER - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-IPVS-FILTER
-A INPUT -j KUBE-FIREWALL
COMMIT
`))
	if err != nil {
		t.Fatal(err)
	}
	removed, err := CleanupUpstreamIptables(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nat/KUBE-LOAD-BALANCER", "nat/KUBE-SERVICES", "filter/KUBE-IPVS-FILTER"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	dump := f.Dump()
	for _, gone := range []string{"KUBE-SERVICES", "KUBE-LOAD-BALANCER", "KUBE-IPVS-FILTER"} {
		if strings.Contains(dump, gone) {
			t.Errorf("%s left:\n%s", gone, dump)
		}
	}
	for _, kept := range []string{"-A PREROUTING -j OTHER", "-A INPUT -j KUBE-FIREWALL"} {
		if !strings.Contains(dump, kept) {
			t.Errorf("%q removed:\n%s", kept, dump)
		}
	}
	if again, err := CleanupUpstreamIptables(context.Background(), f); err != nil || len(again) != 0 {
		t.Errorf("second cleanup: %v %v", again, err)
	}
}

// TestCountIPVSVirtualServers reads /proc/net/ip_vs as the kernel writes
// it: virtual servers (TCP, UDP, SCTP, firewall marks, IPv6 ones) counted,
// real servers and headers not.
func TestCountIPVSVirtualServers(t *testing.T) {
	const table = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A600001:01BB rr
  -> C0A8320B:192B      Masq    1      0          0
  -> C0A8320C:192B      Masq    1      2          0
UDP  0A60000A:0035 rr
  -> 0AF40105:0035      Masq    1      0          0
SCTP 0A60000B:0B54 sh
TCP  [fd00:0096:0000:0000:0000:0000:0000:0001]:01BB rr
FWM  00000001 rr
`
	if n := countIPVSVirtualServers([]byte(table)); n != 5 {
		t.Errorf("counted %d virtual servers, want 5", n)
	}
	if n := countIPVSVirtualServers([]byte("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n")); n != 0 {
		t.Errorf("an empty table: %d", n)
	}
}
