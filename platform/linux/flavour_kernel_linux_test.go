package linux

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// legacyTables lists the legacy (xtables) tables of family instantiated
// in the calling thread's network namespace.
func legacyTables(t *testing.T, family v1.IPFamily) []string {
	t.Helper()
	file := "/proc/thread-self/net/ip_tables_names"
	if family == v1.IPv6Protocol {
		file = "/proc/thread-self/net/ip6_tables_names"
	}
	data, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

// TestProbingLeavesNoLegacyTables: choosing the iptables flavour and
// cleaning kube-proxy's state (both read the legacy flavour too) create no
// iptables-legacy table on a node that has none: iptables-legacy-save -t
// TABLE instantiates the table it names, and the real cluster's chart test
// found empty legacy filter, nat and mangle tables left on its nodes.
func TestProbingLeavesNoLegacyTables(t *testing.T) {
	inNetns(t, func() {
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if got := legacyTables(t, fam); len(got) > 0 {
				t.Skipf("a new network namespace already has legacy %s tables %v (this kernel instantiates them eagerly)", fam, got)
			}
		}
		ctx := context.Background()
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if _, err := DetectFlavour(ctx, fam); err != nil {
				t.Fatal(err)
			}
			ipt, err := NewSystemIptables(fam, FlavourLegacy)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := CleanupUpstreamIptables(ctx, ipt); err != nil {
				t.Fatal(err)
			}
			if got := legacyTables(t, fam); len(got) > 0 {
				t.Errorf("%s: legacy tables %v appeared", fam, got)
			}
		}
		// The legacy flavour still reads a table that exists.
		ipt, err := NewSystemIptables(v1.IPv4Protocol, FlavourLegacy)
		if err != nil {
			t.Fatal(err)
		}
		if err := ipt.Restore(ctx, []byte("*nat\n:KPROXY-PROBE - [0:0]\nCOMMIT\n")); err != nil {
			t.Fatal(err)
		}
		save, err := ipt.Save(ctx, "nat")
		if err != nil || !slices.Contains(ChainNames(save), "KPROXY-PROBE") {
			t.Errorf("legacy nat table after a restore: %q, %v", save, err)
		}
	})
}
