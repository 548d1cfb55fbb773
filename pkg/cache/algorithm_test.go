package cache

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

func lbAnnotation(v string) func(*v1.Service) {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[AnnotationLoadBalancing] = v
	}
}

// TestLoadBalancingAnnotation: the annotation is parsed once into every port
// of every family; an unknown value is a problem naming the Service and the
// field and means random; session affinity wins at render time.
func TestLoadBalancingAnnotation(t *testing.T) {
	affinity := func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }
	tests := []struct {
		name      string
		mods      []func(*v1.Service)
		field     proxy.Algorithm
		effective proxy.Algorithm
		problem   string
	}{
		{"no annotation", nil, "", proxy.AlgorithmRandom, ""},
		// Set explicitly (random too, and what is unknown): it wins over
		// the node's default algorithm.
		{"empty", []func(*v1.Service){lbAnnotation("")}, proxy.AlgorithmRandom, proxy.AlgorithmRandom, ""},
		{"random", []func(*v1.Service){lbAnnotation("random")}, proxy.AlgorithmRandom, proxy.AlgorithmRandom, ""},
		{"round-robin", []func(*v1.Service){lbAnnotation("round-robin")}, proxy.AlgorithmRoundRobin, proxy.AlgorithmRoundRobin, ""},
		{"source-hash", []func(*v1.Service){lbAnnotation("source-hash")}, proxy.AlgorithmSourceHash, proxy.AlgorithmSourceHash, ""},
		{"least-connection", []func(*v1.Service){lbAnnotation("least-connection")}, proxy.AlgorithmLeastConnection, proxy.AlgorithmLeastConnection, ""},
		{"unknown", []func(*v1.Service){lbAnnotation("rr")}, proxy.AlgorithmRandom, proxy.AlgorithmRandom,
			`Service ns/a: metadata.annotations[kproxy.io/load-balancing]: unknown algorithm "rr" (want random, round-robin, source-hash or least-connection), using random`},
		{"case matters", []func(*v1.Service){lbAnnotation("Round-Robin")}, proxy.AlgorithmRandom, proxy.AlgorithmRandom, "unknown algorithm"},
		{"affinity wins", []func(*v1.Service){lbAnnotation("round-robin"), affinity}, proxy.AlgorithmRoundRobin, proxy.AlgorithmRandom, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := svc("ns/a", []string{"10.96.0.10", "fd00::10"}, []string{"a:80", "b:53/UDP"}, tc.mods...)
			info, problems := parseService(s)
			var got []string
			for _, p := range problems {
				got = append(got, p.String())
			}
			if tc.problem == "" && len(got) > 0 || tc.problem != "" && (len(got) != 1 || !strings.Contains(got[0], tc.problem)) {
				t.Fatalf("problems %q, want %q", got, tc.problem)
			}
			snap := Build(thisNode, nil, []*v1.Service{s}, nil)
			for _, view := range []*proxy.FamilyView{snap.IPv4, snap.IPv6} {
				if view.Len() != 2 {
					t.Fatalf("%s: %d ports", view.Family, view.Len())
				}
				for _, p := range view.Sorted() {
					if p.Algorithm != tc.field || p.EffectiveAlgorithm() != tc.effective {
						t.Errorf("%s: Algorithm %q effective %q, want %q and %q", p, p.Algorithm, p.EffectiveAlgorithm(), tc.field, tc.effective)
					}
				}
			}
			_ = info
		})
	}
}

// TestLoadBalancingChangeRepublishes: changing only the annotation gives a
// new ServicePort (backends compare by identity) and marks the port changed.
func TestLoadBalancingChangeRepublishes(t *testing.T) {
	c := New(Options{NodeName: thisNode})
	s1 := svc("ns/a", []string{"10.96.0.10"}, []string{"80"})
	c.OnService(nil, s1)
	snap1, _ := c.Snapshot()
	s2 := svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, lbAnnotation("source-hash"))
	c.OnService(s1, s2)
	snap2, ch := c.Snapshot()
	p1, p2 := snap1.IPv4.Sorted()[0], snap2.IPv4.Sorted()[0]
	if p1 == p2 || p2.Algorithm != proxy.AlgorithmSourceHash {
		t.Fatalf("port not republished: same pointer %v, algorithm %q", p1 == p2, p2.Algorithm)
	}
	if !ch.Changed(p2.Name) {
		t.Errorf("changes %+v do not name %s", ch, p2.Name)
	}
}

// TestUnknownLoadBalancingWarns: an unknown value reaches the warning hook
// (log + Event in kproxy) with the Service's name.
func TestUnknownLoadBalancingWarns(t *testing.T) {
	var got []string
	c := New(Options{NodeName: thisNode, Conflict: func(svc types.NamespacedName, reason, message string) {
		got = append(got, svc.String()+" "+reason+" "+message)
	}})
	c.OnService(nil, svc("ns/a", []string{"10.96.0.10"}, []string{"80"}, lbAnnotation("fastest")))
	c.OnService(nil, svc("ns/b", []string{"10.96.0.11"}, []string{"80"}, lbAnnotation("round-robin")))
	want := `ns/a UnknownLoadBalancing metadata.annotations[kproxy.io/load-balancing]: unknown algorithm "fastest"`
	if len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Fatalf("warnings %q, want one starting %q", got, want)
	}
}
