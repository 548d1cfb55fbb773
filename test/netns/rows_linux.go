package netns

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// RowOptions tune RunRows.
type RowOptions struct {
	// Timeout of each attempt (default 1.5 s): silence that long is "dropped".
	Timeout time.Duration
	// Parallel is the number of rows probed at once (default 8).
	Parallel int
}

// RowResult is the outcome of one behaviour-table row.
type RowResult struct {
	Row          proxytest.Row
	Observations []proxytest.Observation
	// Err is nil when the row held (proxytest.Row.Check), or explains why not.
	Err error
}

// Observe converts an echo result to a behaviour-table observation. A
// harness failure (no route, bad reply) keeps its own outcome name, which
// never matches an expectation.
func Observe(r echo.Result) proxytest.Observation {
	o := proxytest.Observation{Outcome: proxytest.Outcome(r.Outcome)}
	if r.Outcome == echo.Answer {
		o.Backend = r.Reply.Name
		o.Source = r.Source.Addr()
	}
	if r.Err != nil {
		o.Detail = r.Err.Error()
	}
	return o
}

// RunRow makes the row's attempts (each a new connection from a fresh source
// port) from the row's client and checks them.
func (c *Cluster) RunRow(ctx context.Context, row proxytest.Row, timeout time.Duration) RowResult {
	res := RowResult{Row: row}
	addr, err := row.Address(c.Topology)
	if err != nil {
		res.Err = err
		return res
	}
	proto := strings.ToLower(string(row.Protocol))
	for i := 0; i < max(row.Attempts, 1); i++ {
		if ctx.Err() != nil {
			res.Err = fmt.Errorf("row %s: %w", row.Name, ctx.Err())
			return res
		}
		r := c.Probe(ctx, row.From, proto, addr, echo.ProbeOptions{Timeout: timeout})
		res.Observations = append(res.Observations, Observe(r))
	}
	res.Err = row.Check(c.Topology, res.Observations)
	return res
}

// RunRows runs rows concurrently (bounded) and returns their results in input order.
func (c *Cluster) RunRows(ctx context.Context, rows []proxytest.Row, opts RowOptions) []RowResult {
	if opts.Timeout <= 0 {
		opts.Timeout = 1500 * time.Millisecond
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 8
	}
	out := make([]RowResult, len(rows))
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	for i, row := range rows {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = c.RunRow(ctx, row, opts.Timeout)
		}()
	}
	wg.Wait()
	return out
}
