package compare

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The kproxy half alone: every scenario programs without an error or a
// quarantined port, and compared with itself nothing differs.
func TestKproxyScenarios(t *testing.T) {
	scenarios, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	if len(scenarios) < 40 {
		t.Fatalf("%d scenarios", len(scenarios))
	}
	for i := range scenarios {
		s := &scenarios[i]
		t.Run(s.Name, func(t *testing.T) {
			k, err := NewKproxy(s)
			if err != nil {
				t.Fatal(err)
			}
			for step := range s.Steps {
				if err := k.Step(context.Background(), step); err != nil {
					t.Fatal(err)
				}
				o := k.Objects()
				if len(o.LBs) == 0 {
					t.Errorf("step %d: no load balancer", step)
				}
				if r := Compare(s, step, o, k.Objects()); len(r.Unexplained) > 0 || len(r.Explained) > 0 {
					t.Errorf("step %d: kproxy differs from itself: %v", step, r.Unexplained)
				}
			}
		})
	}
}

// The comparison sees a planner decision changed: the DSR flag of
// kproxy's ClusterIP load balancers flipped is an unexplained difference.
func TestCompareSeesDSRFlipped(t *testing.T) {
	scenarios, err := Scenarios()
	if err != nil {
		t.Fatal(err)
	}
	s := &scenarios[0]
	ref, err := NewKproxy(s)
	if err != nil {
		t.Fatal(err)
	}
	flipped, err := NewKproxy(s)
	if err != nil {
		t.Fatal(err)
	}
	flipped.Mutate = FlipDSR
	for _, k := range []*Kproxy{ref, flipped} {
		if err := k.Step(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
	}
	r := Compare(s, 0, ref.Objects(), flipped.Objects())
	if len(r.Unexplained) == 0 {
		t.Fatalf("a flipped DSR flag went unseen")
	}
	t.Logf("%d differences, e.g. %s", len(r.Unexplained), r.Unexplained[0])
}

// Every intended difference is in docs/compatibility.md with its ID.
func TestDifferencesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range Differences {
		if !strings.Contains(string(doc), "`"+d.ID+"`") {
			t.Errorf("docs/compatibility.md does not list the intended difference `%s`", d.ID)
		}
	}
}

// The oracle's upstream is the Kubernetes release the rest of the tests
// build (test/controlplane): a bump there must come here too (go.mod, then
// refresh.sh copies the new version's package).
func TestKubernetesVersionMatchesControlPlane(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	versions, err := os.ReadFile("../../controlplane/versions.go")
	if err != nil {
		t.Fatal(err)
	}
	find := func(text, re string) string {
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no %s", re)
		}
		return m[1]
	}
	k8s := find(string(mod), `(?m)^\s*k8s\.io/kubernetes (v\S+)`)
	staging := find(string(mod), `(?m)^\s*k8s\.io/api => k8s\.io/api (v\S+)`)
	if want := find(string(versions), `KubernetesVersion = "(v[^"]+)"`); k8s != want {
		t.Errorf("go.mod requires k8s.io/kubernetes %s, test/controlplane builds %s", k8s, want)
	}
	if want := find(string(versions), `StagingVersion = "(v[^"]+)"`); staging != want {
		t.Errorf("go.mod pins the staging modules to %s, test/controlplane to %s", staging, want)
	}
}
