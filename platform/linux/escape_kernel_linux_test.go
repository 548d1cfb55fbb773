package linux

import (
	"bytes"
	"fmt"
	"math/rand"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/platform/linux/facts"
	"github.com/kproxy/kproxy/platform/linux/iptables"
	"github.com/kproxy/kproxy/platform/linux/iptables/rulesfuzz"
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
						cfg := facts.DefaultConfig(fam)
						p, err := iptables.NewPlanner(cfg)
						if err != nil {
							t.Fatal(err)
						}
						plan := p.Plan(iptables.Input{View: fullView(cfg, view, node, local, nil), Full: true})
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
						// Every table: a hostile name that ended its rule, its
						// table's section or the restore could add a rule, a
						// chain or a table anywhere, not only in nat.
						saved, err := exec.Command(cmds.Save).CombinedOutput()
						if err != nil {
							t.Fatalf("%s: %v\n%s", cmds.Save, err, saved)
						}
						if problems := committedProblems(saved, plan.Restore); len(problems) > 0 {
							t.Fatalf("seed %d: the kernel does not hold exactly the planned rules (a hostile name became a rule?): %s\n%s\nplan:\n%s",
								i, strings.Join(problems, "; "), saved, plan.Restore)
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

// rulesPerChain counts the rules ("-A CHAIN ...") of iptables-save output
// or iptables-restore input per table and chain.
func rulesPerChain(data []byte) map[string]map[string]int {
	out := map[string]map[string]int{}
	table := ""
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case l == "COMMIT":
			table = ""
		case strings.HasPrefix(l, "-A "):
			chain, _, _ := strings.Cut(l[len("-A "):], " ")
			if out[table] == nil {
				out[table] = map[string]int{}
			}
			out[table][chain]++
		}
	}
	return out
}

// committedProblems compares iptables-save of every table with the restore
// input that was committed into otherwise empty tables: each chain of each
// table must hold exactly the rules the input has for it (no rule, chain or
// table more), and no rule may be the one a hostile seed tries to inject.
func committedProblems(saved, restore []byte) []string {
	var problems []string
	got, want := rulesPerChain(saved), rulesPerChain(restore)
	tables := map[string]bool{}
	for t := range got {
		tables[t] = true
	}
	for t := range want {
		tables[t] = true
	}
	for t := range tables {
		chains := map[string]bool{}
		for c := range got[t] {
			chains[c] = true
		}
		for c := range want[t] {
			chains[c] = true
		}
		for c := range chains {
			if got[t][c] != want[t][c] {
				problems = append(problems, fmt.Sprintf("table %q chain %s: %d rules in the kernel, %d planned", t, c, got[t][c], want[t][c]))
			}
		}
	}
	if countLines(saved, "-A KPROXY-SERVICES -j ACCEPT") > 0 {
		problems = append(problems, "the injected rule \"-A KPROXY-SERVICES -j ACCEPT\" is in the kernel")
	}
	slices.Sort(problems)
	return problems
}

// TestCommittedProblems: the comparison of TestKernelRestoreAcceptsFuzzedPlans
// finds a rule injected into another table, an extra chain and an extra
// rule, and accepts the tables as planned.
func TestCommittedProblems(t *testing.T) {
	restore := []byte("*nat\n:KPROXY-SERVICES - [0:0]\n-A KPROXY-SERVICES -d 10.96.0.1/32 -j KPROXY-SVC-X\nCOMMIT\n" +
		"*filter\n:KPROXY-INPUT - [0:0]\n-A KPROXY-INPUT -j ACCEPT\nCOMMIT\n")
	saved := func(natExtra, filterExtra string) []byte {
		return []byte("# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n:KPROXY-INPUT - [0:0]\n-A KPROXY-INPUT -j ACCEPT\n" + filterExtra + "COMMIT\n" +
			"*nat\n:PREROUTING ACCEPT [0:0]\n:KPROXY-SERVICES - [0:0]\n-A KPROXY-SERVICES -d 10.96.0.1/32 -j KPROXY-SVC-X\n" + natExtra + "COMMIT\n")
	}
	if p := committedProblems(saved("", ""), restore); len(p) > 0 {
		t.Errorf("as planned: %v", p)
	}
	for name, s := range map[string][]byte{
		"a filter rule":       saved("", "-A KPROXY-INPUT -j DROP\n"),
		"a chain":             saved("-A EVIL -j ACCEPT\n", ""),
		"the injected rule":   saved("-A KPROXY-SERVICES -j ACCEPT\n", ""),
		"another table":       append(saved("", ""), "*mangle\n-A PREROUTING -j ACCEPT\nCOMMIT\n"...),
		"a rule in a builtin": saved("", "-A INPUT -j ACCEPT\n"),
	} {
		if p := committedProblems(s, restore); len(p) == 0 {
			t.Errorf("%s more in the kernel: not found", name)
		}
	}
}
