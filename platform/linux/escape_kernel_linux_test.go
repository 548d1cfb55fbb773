package linux

import (
	"bytes"
	"math/rand"
	"os/exec"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux/rules"
	"github.com/kproxy/kproxy/platform/linux/rules/rulesfuzz"
)

// TestKernelRestoreAcceptsFuzzedPlans feeds the planner's fuzz inputs
// (rulesfuzz: the hostile-name seeds plus a fixed-seed sample of random
// inputs) to iptables-restore --test of both flavours, inside a network
// namespace the test creates. The seeds (TCP only) are also committed for
// real, and the saved tables are checked: a hostile name stays inside its
// comment and adds no rule.
func TestKernelRestoreAcceptsFuzzedPlans(t *testing.T) {
	const randomInputs = 150
	for _, f := range flavours {
		for _, fam := range families {
			t.Run(string(f)+"/"+string(fam), func(t *testing.T) {
				inNetns(t, func() {
					cmds := CommandsFor(fam, f)
					inputs := rulesfuzz.Seeds(fam)
					seeds := len(inputs)
					rng := rand.New(rand.NewSource(11))
					for range randomInputs {
						b := make([]byte, rng.Intn(600))
						rng.Read(b)
						inputs = append(inputs, b)
					}
					for i, in := range inputs {
						view, node, local := rulesfuzz.Input(in, fam)
						cfg := rules.DefaultConfig(fam)
						p, err := rules.NewPlanner(cfg)
						if err != nil {
							t.Fatal(err)
						}
						plan := p.Plan(rules.Input{View: view, Node: node, LocalAddrs: local, Changes: proxy.Changes{Full: true}})
						if out, err := restore(cmds.Restore, plan.Restore, "--test", "--noflush"); err != nil {
							t.Fatalf("input %d (%q): %s --test rejects the plan: %v\n%s\nplan:\n%s", i, in, cmds.Restore, err, out, plan.Restore)
						}
						if i >= seeds {
							continue
						}
						// Seeds: commit for real (flushing kproxy's earlier chains), then
						// check that the kernel holds exactly the planned rules.
						if out, err := restore(cmds.Restore, plan.Restore); err != nil {
							t.Fatalf("seed %d: %s rejects the plan: %v\n%s\nplan:\n%s", i, cmds.Restore, err, out, plan.Restore)
						}
						saved, err := exec.Command(cmds.Save, "-t", "nat").CombinedOutput()
						if err != nil {
							t.Fatalf("%s: %v\n%s", cmds.Save, err, saved)
						}
						if got, want := countLines(saved, "-A "), countLines(natSection(plan.Restore), "-A "); got != want {
							t.Fatalf("seed %d: the kernel holds %d nat rules, the plan %d:\n%s\nplan:\n%s", i, got, want, saved, plan.Restore)
						}
						if countLines(saved, "-A KPROXY-SERVICES -j ACCEPT") > 0 || countLines(saved, "*filter") > 0 {
							t.Fatalf("seed %d: a hostile name became a rule:\n%s", i, saved)
						}
					}
					t.Logf("%d inputs accepted by %s --test (%d seeds also committed)", len(inputs), cmds.Restore, seeds)
				})
			})
		}
	}
}

func restore(tool string, data []byte, args ...string) ([]byte, error) {
	cmd := exec.Command(tool, append([]string{"-w"}, args...)...)
	cmd.Stdin = bytes.NewReader(data)
	return cmd.CombinedOutput()
}

func countLines(data []byte, prefix string) int {
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// natSection returns the *nat part of restore input.
func natSection(data []byte) []byte {
	s := string(data)
	i := strings.Index(s, "*nat\n")
	if i < 0 {
		return nil
	}
	s = s[i:]
	if j := strings.Index(s, "\nCOMMIT\n"); j >= 0 {
		s = s[:j]
	}
	return []byte(s)
}
