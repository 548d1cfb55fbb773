package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// TestHostileManifestDirectory is the operator's report from issue 11: a
// named pipe called x.yaml and a Service whose name holds a newline (an
// iptables-restore command after it) next to a normal Service in the
// manifest directory. kproxy must start, program the normal Service, and
// still program a later endpoint removal: the removed endpoint stops
// receiving connections.
func TestHostileManifestDirectory(t *testing.T) {
	all := []string{proxytest.PodA1, proxytest.PodB1, proxytest.PodB2}
	top := proxytest.Default()
	svc := top.Service("hygiene", 104)
	evil := top.Service("evil\n-A KPROXY-SERVICES -j ACCEPT", 105)
	objects := func(pods ...string) []any {
		slices, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		evilSlices, err := top.Slices(evil, proxytest.Ready(proxytest.PodA1)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{svc, slices[0], slices[1], evil, evilSlices[0], evilSlices[1]}
	}
	var fifo string
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objects(all...), before: func(e *env) {
		fifo = filepath.Join(e.dir, "x.yaml")
		if err := unix.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		// Registered after newEnv's own cleanup, so it runs first: a kproxy
		// stuck reading the pipe (the code before the fix) is released and
		// can be stopped.
		t.Cleanup(func() {
			for range 20 {
				if f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
					_ = f.Close()
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}})
	ctx := e.ctx(2 * time.Minute)
	const victim = proxytest.PodB2
	addrs := []netip.AddrPort{clusterIP(svc, v1.IPv4Protocol), clusterIP(svc, v1.IPv6Protocol)}
	if _, ok := e.until(ctx, addrs, 10*time.Second, func(r echo.Result) bool { return r.Reply.Name == victim }); !ok {
		t.Fatalf("%s never answered before the change", victim)
	}

	e.write("objects.yaml", objects(proxytest.PodA1, proxytest.PodB1)...)
	t0 := time.Now()
	// The removal is programmed when 30 connections in a row avoid the victim.
	clean := 0
	for i := 0; clean < 30; i++ {
		if time.Since(t0) > 15*time.Second {
			t.Fatalf("the removed endpoint still received connections 15 s after the change")
		}
		r := e.probe(ctx, "tcp", addrs[i%2], echo.ProbeOptions{Timeout: 500 * time.Millisecond})
		switch {
		case r.Outcome != echo.Answer:
			t.Errorf("connection %d after the removal: %v", i, r)
			clean = 0
		case r.Reply.Name == victim:
			clean = 0
		default:
			clean++
		}
	}
	t.Logf("endpoint removal programmed within %v", time.Since(t0).Round(time.Millisecond))
	for _, fam := range families() {
		if save := e.save(fam, "nat"); countRule(save, "-A KPROXY-SERVICES -j ACCEPT") > 0 {
			t.Errorf("%s: the hostile name became a rule:\n%s", fam, save)
		}
	}
	out := e.p.Process().Output()
	for _, want := range []string{"x.yaml", "not a regular file", "Ignoring bad input"} {
		if !strings.Contains(out, want) {
			t.Errorf("kproxy's log does not mention %q", want)
		}
	}
}

func countRule(save, line string) int {
	n := 0
	for _, l := range strings.Split(save, "\n") {
		if l == line {
			n++
		}
	}
	return n
}
