package model_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"
)

// updateRenderedEnv, set to 1, makes TestRenderedText write its golden
// files again.
const updateRenderedEnv = "KPROXY_UPDATE_RENDERED"

// TestRenderedText pins the text the renderer writes, byte for byte: for
// the rich ports under every configuration, both families, a full
// transaction, then a partial one deleting a third of the ports and one
// adding them back. The renderer's text is
// what nft -f reads; a change of how it is built (typed rules) must not
// change it. KPROXY_UPDATE_RENDERED=1 writes testdata/rendered again.
func TestRenderedText(t *testing.T) {
	update := os.Getenv(updateRenderedEnv) == "1"
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		fa := addrsOf(fam)
		for _, tc := range traceConfigs(fa) {
			t.Run(string(fam)+"/"+tc.name, func(t *testing.T) {
				got := renderedText(t, fam, tc, richPorts(t, fa, tc))
				path := filepath.Join("testdata", "rendered", strings.ToLower(string(fam))+"-"+tc.name+".nft.gz")
				if update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					writeGz(t, path, []byte(got))
					return
				}
				want := string(readGz(t, path))
				if got != want {
					g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
					for i := range min(len(g), len(w)) {
						if g[i] != w[i] {
							t.Fatalf("%s: line %d:\n\tgot  %s\n\twant %s", path, i+1, g[i], w[i])
						}
					}
					t.Fatalf("%s: %d lines, want %d", path, len(g), len(w))
				}
			})
		}
	}
}

// renderedText renders ports in full, then deletes a third of the ports
// and adds them back, and returns every transaction's text, each under a
// "#" heading.
func renderedText(t *testing.T, fam v1.IPFamily, tc traceConfig, ports map[proxy.ServicePortName]*intent.Port) string {
	t.Helper()
	var b strings.Builder
	r := nfttest.Renderer(t, tc.cfg)
	f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
	plan, applied := r.Render(nftables.Input{Full: true, Ports: ports, Node: tc.node}, nil)
	fmt.Fprintf(&b, "# full\n%s", plan.Tx)
	nfttest.Run(t, f, plan)
	names := slices.SortedFunc(maps.Keys(ports), func(a, b proxy.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
	gone, back := map[proxy.ServicePortName]*intent.Port{}, map[proxy.ServicePortName]*intent.Port{}
	for i, n := range names {
		if i%3 == 0 {
			gone[n], back[n] = nil, ports[n]
		}
	}
	for _, step := range []struct {
		name  string
		ports map[proxy.ServicePortName]*intent.Port
	}{{"delete a third of the ports", gone}, {"add them back", back}} {
		plan, applied = r.Render(nftables.Input{Ports: step.ports, Node: tc.node}, applied)
		if plan.Full {
			t.Fatalf("%s: a full render", step.name)
		}
		fmt.Fprintf(&b, "# partial: %s\n%s", step.name, plan.Tx)
		nfttest.Run(t, f, plan)
	}
	return b.String()
}
