package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/proxytest"
)

// RestartServicesEnv sets the number of Services of TestRestartAtScale
// (default 2,000 in the test suite; docs/benchmarks.md reports 10,000).
const RestartServicesEnv = "KPROXY_RESTART_SERVICES"

func restartServices(t *testing.T) int {
	n := 2000
	if s := os.Getenv(RestartServicesEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 10 || v > 60000 {
			t.Fatalf("%s=%q: want a number of Services from 10 to 60000", RestartServicesEnv, s)
		}
		n = v
	}
	return n
}

// declared matches the chain declarations of iptables-save and of the
// restore input kproxy's dry run prints.
var declared = regexp.MustCompile(`(?m)^:(KPROXY-[A-Z0-9-]+) `)

// nftDeclared matches the chains of kproxy's tables in the nft -f input
// kproxy's nftables dry run prints ("add chain ip kproxy NAME").
var nftDeclared = regexp.MustCompile(`(?m)^add chain (ip6?) kproxy (\S+)`)

// nftListed matches the chains of an "nft list table" ("chain NAME {").
var nftListed = regexp.MustCompile(`(?m)^\s*chain (\S+) \{`)

// plannedChains lists the chains a dry run's output declares (the
// nftables mode's prefixed with their family).
func plannedChains(dryRun string) []string {
	if !nftMode() {
		return kproxyChains(dryRun)
	}
	var out []string
	for _, m := range nftDeclared.FindAllStringSubmatch(dryRun, -1) {
		out = append(out, m[1]+" "+m[2])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// kernelChains lists kproxy's chains in node1's kernel, as plannedChains.
func (e *env) kernelChains() []string {
	var got []string
	for _, fam := range families() {
		if nftMode() {
			for _, m := range nftListed.FindAllStringSubmatch(e.nftTable(fam), -1) {
				got = append(got, nftFamily(fam)+" "+m[1])
			}
			continue
		}
		got = append(got, kproxyChains(e.save(fam, "nat"))...)
		got = append(got, kproxyChains(e.save(fam, "filter"))...)
	}
	slices.Sort(got)
	return slices.Compact(got)
}

// programChild is what kproxy runs to program the kernel in the test's
// mode, as it appears in /proc/PID/cmdline.
func programChild() string {
	if nftMode() {
		return "nft\x00-f"
	}
	return "restore"
}

func kproxyChains(s string) []string {
	var out []string
	for _, m := range declared.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestRestartAtScale: N Services (KPROXY_RESTART_SERVICES, default 2,000)
// with endpoint churn all along; kproxy is stopped with SIGTERM, killed
// with SIGKILL to its process group (kproxy and its children, as a
// container runtime kills the kproxy container), killed that way in the
// middle of its first restore after a restart (the iptables-restore child
// dies too), and killed alone in the middle of that restore (as the OOM
// killer does: the orphaned iptables-restore goes on), and started again
// each time, while a client opens new connections to a ClusterIP (both
// families, from a pod) and a NodePort (from outside): none may fail.
// Afterwards the kernel holds exactly the chains a full plan of the final
// state has, and exactly the rules a fresh kproxy programs on empty tables
// (checkRulesLikeFresh).
func TestRestartAtScale(t *testing.T) {
	n := restartServices(t)
	top := proxytest.Default()
	probed := top.Service("probed", 1, proxytest.WithNodePort())
	probedSlices, err := top.Slices(probed, proxytest.Ready(proxytest.PodA1, proxytest.PodB1)...)
	if err != nil {
		t.Fatal(err)
	}
	const churned = 50
	bulk := []any{probed, probedSlices[0], probedSlices[1]}
	for i := churned + 2; i < n+2; i++ {
		svc := top.Service(fmt.Sprintf("bulk-%d", i), i)
		s, err := top.Slices(svc, proxytest.Ready(proxytest.PodA1, proxytest.PodB2)...)
		if err != nil {
			t.Fatal(err)
		}
		bulk = append(bulk, svc, s[0], s[1])
	}
	churn := func(round int) []any {
		var out []any
		for i := 2; i < churned+2; i++ {
			svc := top.Service(fmt.Sprintf("churn-%d", i), i)
			pods := []string{proxytest.PodA1}
			if (round+i)%2 == 0 {
				pods = append(pods, proxytest.PodB1)
			}
			s, err := top.Slices(svc, proxytest.Ready(pods...)...)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, svc, s[0], s[1])
		}
		return out
	}
	begin := time.Now()
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), noStart: true, before: func(e *env) {
		e.write("bulk.yaml", bulk...)
		e.write("churn.yaml", churn(0)...)
	}})
	e.readyWait = 5 * time.Minute
	e.start()
	t.Logf("%d Services: manifests written and first start programmed in %v", n, time.Since(begin).Round(time.Millisecond))
	ctx := e.ctx(15 * time.Minute)

	connecting := e.connectAllAlong(ctx, probed)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // endpoint churn all along
		defer wg.Done()
		for round := 1; ; round++ {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			if err := WriteObjects(e.dir, "churn.yaml", churn(round)...); err != nil {
				t.Error(err)
				return
			}
		}
	}()

	const (
		term       = "SIGTERM"
		killGroup  = "SIGKILL of the process group"
		killRestor = "SIGKILL of the process group during the first restore"
		killAlone  = "SIGKILL of kproxy alone during the first restore"
	)
	for _, how := range []string{term, killGroup, killRestor, killAlone} {
		var err error
		switch how {
		case term:
			err = e.p.Stop(30 * time.Second)
		case killGroup:
			err = e.p.KillGroup()
		default:
			if err = e.p.KillGroup(); err != nil {
				break
			}
			time.Sleep(time.Second)
			if err = e.p.Start(); err != nil {
				break
			}
			pid := e.p.Process().Pid()
			if !waitRestoreChild(pid, 2*time.Minute) {
				t.Errorf("%s: never saw kproxy run %s", how, strings.ReplaceAll(programChild(), "\x00", " "))
			}
			if how == killRestor {
				err = e.p.KillGroup() // fails if any process of the group survives
				break
			}
			child := childRunning(pid, programChild())
			err = e.p.Kill()
			if child > 0 {
				t.Logf("%s: iptables-restore %d orphaned; still running after the kill: %v", how, child, processAlive(child))
			}
		}
		if err != nil {
			t.Errorf("%s: %v", how, err)
		}
		time.Sleep(time.Second)
		t0 := time.Now()
		e.start()
		t.Logf("after %s: programmed again in %v", how, time.Since(t0).Round(time.Millisecond))
		time.Sleep(2 * time.Second)
	}
	close(stop)
	wg.Wait()
	count, failures := connecting()
	t.Logf("%d Services: %d new connections during four restarts with churn, %d failed", n, count, len(failures))
	for _, f := range failures {
		t.Errorf("new connection failed: %s", f)
	}

	// Consistent afterwards: the kernel holds exactly the chains of a full
	// plan of the final state (kproxy's dry run of the same manifests).
	time.Sleep(3 * time.Second)
	args := append(e.p.Argv(), "--dry-run")
	out, err := e.c.Exec(ctx, proxytest.Node1, append([]string{kproxyBin}, args...)...)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, LastLines(string(out), 20))
	}
	want := plannedChains(string(out))
	got := e.kernelChains()
	if len(want) == 0 {
		t.Fatalf("the dry run declares no chain:\n%s", LastLines(string(out), 20))
	}
	if !slices.Equal(got, want) {
		t.Errorf("kernel chains differ from a full plan: %d in the kernel, %d planned; extra %v; missing %v",
			len(got), len(want), diff(got, want, 10), diff(want, got, 10))
	}
	if strings.Contains(strings.Join(got, " "), "KPROXY-PROBE") {
		t.Error("probe chains left in the kernel")
	}
	// And rule for rule: what a fresh kproxy programs for the same objects.
	e.checkRulesLikeFresh(ctx)
}

// processAlive reports whether process pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// waitRestoreChild waits until process pid has an iptables-restore child
// (it is in the middle of a restore) and reports whether it saw one.
func waitRestoreChild(pid int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if childRunning(pid, programChild()) > 0 {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// childRunning returns the pid of a child of process pid whose command line
// contains substr, or 0.
func childRunning(pid int, substr string) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			cmdline, _ := os.ReadFile("/proc/" + c + "/cmdline") // comm is cut at 15 bytes
			if strings.Contains(string(cmdline), substr) {
				if n, err := strconv.Atoi(c); err == nil {
					return n
				}
			}
		}
	}
	return 0
}

// diff lists up to max elements of a not in b.
func diff(a, b []string, max int) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
			if len(out) == max {
				break
			}
		}
	}
	return out
}
