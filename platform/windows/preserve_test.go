package windows

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
	"github.com/kproxy/kproxy/platform/windows/plan"
)

// The preserve-destination annotation against the fake HNS, as upstream
// programs it: the NodePort and the LoadBalancer IP only to endpoints on
// this node, the LoadBalancer IP with DSR, UseMux and PreserveDIP, its
// forwarded health check with UseMux and PreserveDIP (no DSR); the
// ClusterIP unchanged. Then without a local endpoint, without the
// annotation, across a restart on an HNS that leaves the flags out, and on
// an HNS without DSR.
func TestBackendPreserveDestination(t *testing.T) {
	withHC := func(o *Options) { o.ForwardHealthCheckVIP = true }
	h := newHarness(t, l2bridgeNet, wt.HNSModern, withHC)
	h.f.AddLocalEndpoint(h.net, wt.MustAddr("10.244.1.2"), "cbr0") // the root endpoint health checks go to
	svc := func(preserve bool, list ...proxy.Endpoint) *proxy.Snapshot {
		opts := []wt.PortOpt{wt.NodePort(30036), wt.LBIPs("192.168.70.7"), wt.HealthCheckNodePort(32036), wt.Eps(list...)}
		if preserve {
			opts = append(opts, wt.PreserveDestination())
		}
		return wt.Snap(node(), wt.SvcPort("keep-dip", v1.ProtocolTCP, "10.96.0.36", 80, opts...))
	}
	both := []proxy.Endpoint{wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080)}

	expectCalls(t, "first sync", h.mustSync(svc(true, both...), proxy.Changes{Full: true}), "CreateEndpoint=1 CreateLoadBalancer=4 "+listCalls+" Version=1")
	const endpoints = `ep 10.244.1.2 local name=cbr0
ep 10.244.1.5 local name=pod-a
ep 10.244.1.6 local name=pod-b
`
	want := `lb TCP *:30036 -> 8080 flags=0 pflags=18 dist=0 eps=10.244.1.5
lb TCP 10.96.0.36:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.1.5,10.244.2.5
lb TCP 192.168.70.7:32036 -> 32036 flags=0 pflags=12 dist=0 eps=10.244.1.2
lb TCP 192.168.70.7:80 -> 8080 flags=1 pflags=28 dist=0 eps=10.244.1.5
` + endpoints + "ep 10.244.2.5 remote name=kproxy-remote-10.244.2.5\n"
	wt.MustEqual(t, "preserve-destination", h.f.Dump(), want)

	// The restart of kproxy on an HNS that does not return the flags.
	h.f.DropOnRead(hns.FieldsUnechoed)
	h.b = h.newBackend(withHC)
	expectCalls(t, "restart", h.mustSync(svc(true, both...), proxy.Changes{Full: true}), listCalls+" Version=1")
	wt.MustEqual(t, "after the restart", h.f.Dump(), want)
	h.f.DropOnRead(0)

	// No endpoint here: no NodePort or LoadBalancer IP load balancer, the
	// health check stays (it tells the cloud load balancer to avoid this node).
	calls := h.mustSync(svc(true, wt.RemoteEP("10.244.2.5", 8080)), changed)
	expectCalls(t, "no local endpoint", calls, "DeleteLoadBalancer=2 UpdateLoadBalancer=1")
	wt.MustEqual(t, "no local endpoint", h.f.Dump(), `lb TCP 10.96.0.36:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.2.5
lb TCP 192.168.70.7:32036 -> 32036 flags=0 pflags=12 dist=0 eps=10.244.1.2
`+endpoints+"ep 10.244.2.5 remote name=kproxy-remote-10.244.2.5\n")

	// The annotation removed: every endpoint, the usual flags.
	h.mustSync(svc(false, both...), changed)
	wt.MustEqual(t, "without the annotation", h.f.Dump(), `lb TCP *:30036 -> 8080 flags=0 pflags=18 dist=0 eps=10.244.1.5,10.244.2.5
lb TCP 10.96.0.36:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.1.5,10.244.2.5
lb TCP 192.168.70.7:32036 -> 32036 flags=0 pflags=0 dist=0 eps=10.244.1.2
lb TCP 192.168.70.7:80 -> 8080 flags=0 pflags=16 dist=0 eps=10.244.1.5,10.244.2.5
`+endpoints+"ep 10.244.2.5 remote name=kproxy-remote-10.244.2.5\n")

	// Without DSR in HNS the destination cannot be kept: the NodePort and
	// the load balancer IP still serve only this node's endpoints (the
	// routing mesh stays off), without DSR, mux or PreserveDIP, with a
	// warning. (Upstream ignores the annotation there.)
	old := newHarness(t, l2bridgeNet, hns.Version{Major: 9, Minor: 0}, withHC)
	old.f.AddLocalEndpoint(old.net, wt.MustAddr("10.244.1.2"), "cbr0")
	old.mustSync(svc(true, both...), proxy.Changes{Full: true})
	wt.MustEqual(t, "without DSR", old.f.Dump(), `lb TCP *:30036 -> 8080 flags=0 pflags=18 dist=0 eps=10.244.1.5
lb TCP 10.96.0.36:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.1.5,10.244.2.5
lb TCP 192.168.70.7:32036 -> 32036 flags=0 pflags=0 dist=0 eps=10.244.1.2
lb TCP 192.168.70.7:80 -> 8080 flags=0 pflags=16 dist=0 eps=10.244.1.5
`+endpoints+"ep 10.244.2.5 remote name=kproxy-remote-10.244.2.5\n")
	if len(old.warns) != 1 || old.warns[0] != "ns/keep-dip "+plan.ReasonPreserveDestinationUnsupported {
		t.Errorf("warnings %v, want one %s", old.warns, plan.ReasonPreserveDestinationUnsupported)
	}
}
