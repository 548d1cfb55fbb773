package e2e

import (
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestBehaviourTable runs every row of the shared behaviour table against
// kproxy on a real kernel: one kproxy run per configuration the rows need,
// with all of that configuration's cases loaded at once.
func TestBehaviourTable(t *testing.T) {
	requireKernel(t)
	tb, err := proxytest.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range tb.Configs() {
		t.Run(cfg.String(), func(t *testing.T) {
			nodes, svcs, slices := tb.Objects(cfg)
			e := newEnv(t, envOptions{config: cfg, objects: proxytest.ObjectList(nodes[:0], svcs, slices)})
			var rows []proxytest.Row
			for _, r := range tb.RowsFor(cfg) {
				if reason := r.Skip(proxytest.Linux); reason != "" {
					t.Logf("%s: not supported on Linux: %s", r.Name, reason)
					continue
				}
				rows = append(rows, r)
			}
			start := time.Now()
			results := e.c.RunRows(e.ctx(3*time.Minute), rows, netns.RowOptions{})
			t.Logf("%d rows in %v", len(rows), time.Since(start).Round(time.Millisecond))
			for _, res := range results {
				t.Run(res.Row.Name, func(t *testing.T) {
					if res.Err != nil {
						t.Errorf("%s\n  semantic: %s", res.Err, res.Row.Case.Semantic)
					}
				})
			}
		})
	}
}
