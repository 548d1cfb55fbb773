package iptables

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	iptmodel "github.com/kproxy/kproxy/platform/linux/iptables/model"
	"github.com/kproxy/kproxy/platform/linux/iptables/rulesfuzz"
	"github.com/kproxy/kproxy/platform/linux/iptables/syntax"
)

// FuzzPlanner plans arbitrary service ports (names of any bytes, any
// addresses, ports and counts; see rulesfuzz) and checks that the restore
// input is well formed: the ruleset parser accepts it, no line carries a
// control character, every comment fits the kernel's limit. The seed corpus
// (hostile names) runs with every go test; the kernel test
// TestKernelRestoreAcceptsFuzzedPlans feeds the same inputs to
// iptables-restore --test in a network namespace.
func FuzzPlanner(f *testing.F) {
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, s := range rulesfuzz.Seeds(fam) {
			f.Add(fam == v1.IPv6Protocol, s)
		}
	}
	f.Fuzz(func(t *testing.T, v6 bool, data []byte) {
		fam := v1.IPv4Protocol
		if v6 {
			fam = v1.IPv6Protocol
		}
		view, node, local := rulesfuzz.Input(data, fam)
		p := mustPlanner(t, testConfig(fam))
		plan := planned(p, testInput{View: view, Node: node, LocalAddrs: local, Changes: proxy.Changes{Full: true}})
		if err := checkRestore(plan.Restore); err != nil {
			t.Fatalf("%v\n%s", err, plan.Restore)
		}
		rs := iptmodel.New()
		if err := rs.Restore(plan.Restore, true); err != nil {
			t.Fatalf("the ruleset parser rejects the plan: %v\n%s", err, plan.Restore)
		}
		for _, j := range plan.Jumps {
			if err := checkRestore([]byte(strings.Join(j.Spec, " "))); err != nil {
				t.Fatalf("jump %v: %v", j, err)
			}
		}
		// A second, partial plan of the same view is well formed too (and
		// empty: nothing changed).
		plan2 := planned(p, testInput{View: view, Node: node, LocalAddrs: local})
		if err := rs.Restore(plan2.Restore, true); err != nil {
			t.Fatalf("the ruleset parser rejects the follow-up plan: %v\n%s", err, plan2.Restore)
		}
		if len(plan2.Restore) > 0 {
			t.Fatalf("a plan of an unchanged view rewrites:\n%s", plan2.Restore)
		}
	})
}

// TestCommentText: object data in comments is printable ASCII, cut to the
// kernel's limit, and quoted so that it never ends the string or the line.
func TestCommentText(t *testing.T) {
	for in, want := range map[string]string{
		"ns/web:http":                           `"ns/web:http"`,
		"ns/evil\n-A KPROXY-SERVICES -j ACCEPT": `"ns/evil?-A KPROXY-SERVICES -j ACCEPT"`,
		`ns/a"b`:                                `"ns/a\"b"`,
		`ns/a\`:                                 `"ns/a\\"`,
		"ns/x\x00y\r\t\xff":                     `"ns/x?y???"`,
	} {
		n := proxyName(in)
		if got := commentOf(n); got != want {
			t.Errorf("commentOf(%q) = %s, want %s", in, got, want)
		}
	}
	if got := commentText(strings.Repeat("a", 1000)); len(got) != maxComment {
		t.Errorf("long comment kept %d bytes, want %d", len(got), maxComment)
	}
}

func proxyName(s string) proxy.ServicePortName {
	ns, rest, _ := strings.Cut(s, "/")
	var n proxy.ServicePortName
	n.Namespace, n.Name = ns, rest
	return n
}

// checkRestore checks restore input line by line: printable ASCII only (a
// control character from object data could end a line, and a NUL ends the C
// string iptables-restore reads), arguments that split, comments within the
// kernel's limit.
func checkRestore(data []byte) error {
	for i, line := range strings.Split(string(data), "\n") {
		for j := 0; j < len(line); j++ {
			if c := line[j]; c < 0x20 || c > 0x7e {
				return fmt.Errorf("line %d: byte %#x at %d: %q", i+1, c, j, line)
			}
		}
		args, err := syntax.Split(line)
		if err != nil {
			return fmt.Errorf("line %d: %v: %q", i+1, err, line)
		}
		for k, a := range args {
			if k > 0 && args[k-1] == "--comment" && len(a) > maxComment {
				return fmt.Errorf("line %d: comment of %d bytes", i+1, len(a))
			}
		}
	}
	return nil
}
