package plan

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

func algorithm(a proxy.Algorithm) wt.PortOpt {
	return func(p *proxy.ServicePort) { p.Algorithm = a }
}

// TestPlanAlgorithms checks the HNS objects per load-balancing algorithm:
// source-hash is HNS's source IP distribution on every load balancer of the
// port (HNS 12.0+); round robin and least connection do not exist in HNS:
// default distribution and one warning (an Event on the Service); session
// affinity wins over the algorithm.
func TestPlanAlgorithms(t *testing.T) {
	cases := []struct {
		name    string
		opts    []wt.PortOpt
		oldHNS  bool
		want    hns.Distribution
		warning string
	}{
		{"random", nil, false, hns.DistributionNone, ""},
		{"source-hash", []wt.PortOpt{algorithm(proxy.AlgorithmSourceHash)}, false, hns.DistributionSourceIP, ""},
		{"source-hash before HNS 12", []wt.PortOpt{algorithm(proxy.AlgorithmSourceHash)}, true, hns.DistributionNone, ReasonAlgorithmUnsupported},
		{"round-robin", []wt.PortOpt{algorithm(proxy.AlgorithmRoundRobin)}, false, hns.DistributionNone, ReasonAlgorithmUnsupported},
		{"least-connection", []wt.PortOpt{algorithm(proxy.AlgorithmLeastConnection)}, false, hns.DistributionNone, ReasonAlgorithmUnsupported},
		{"affinity wins over round-robin", []wt.PortOpt{algorithm(proxy.AlgorithmRoundRobin), wt.Affinity(10800)}, false, hns.DistributionSourceIP, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := baseFacts(wt.L2Bridge)
			if tc.oldHNS {
				f.Caps.SessionAffinity = false
			}
			opts := append([]wt.PortOpt{wt.NodePort(30080), wt.Eps(wt.RemoteEP("10.244.2.5", 8080), wt.LocalEP("10.244.1.5", 8080))}, tc.opts...)
			p := Build(f, wt.IPv4View(wt.Snap(nil, wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, opts...))), nil)
			if p.Err != nil {
				t.Fatal(p.Err)
			}
			if len(p.LoadBalancers) < 2 {
				t.Fatalf("want the ClusterIP and NodePort load balancers, got:\n%s", p)
			}
			for _, lb := range p.LoadBalancers {
				if lb.Distribution != tc.want {
					t.Errorf("%s load balancer: distribution %d, want %d", lb.Kind, lb.Distribution, tc.want)
				}
				if got := lb.HNS(nil).PortMappings[0].DistributionType; got != tc.want {
					t.Errorf("%s HNS object: DistributionType %d, want %d", lb.Kind, got, tc.want)
				}
			}
			var reasons []string
			for _, w := range p.Warnings {
				reasons = append(reasons, w.Reason)
			}
			switch {
			case tc.warning == "" && len(reasons) > 0:
				t.Errorf("warnings %v, want none", reasons)
			case tc.warning != "" && (len(reasons) != 1 || reasons[0] != tc.warning || p.Warnings[0].Service.Name != "web"):
				t.Errorf("warnings %+v, want one %s on ns/web", p.Warnings, tc.warning)
			}
		})
	}
}
