package windows

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/windows/hns"
	wt "github.com/kproxy/kproxy/platform/windows/internal/wintest"
)

var errRefused = errors.New("the parameter is incorrect")

func rejectUDP(lb *hns.LoadBalancer) error {
	if lb.PortMappings[0].Protocol == hns.ProtocolUDP {
		return hns.NewError(hns.OpCreateLoadBalancer, hns.CodeInvalidArg, errRefused)
	}
	return nil
}

func quarantineString(q []proxy.QuarantinedPort, now time.Time) string {
	var parts []string
	for _, p := range q {
		parts = append(parts, fmt.Sprintf("%s/%s since=%s retry=+%s", p.Name, p.Family, now.Sub(p.Since), p.Retry.Sub(now)))
	}
	return strings.Join(parts, "; ")
}

var dnsPort = proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "dns"}, Port: "p", Protocol: v1.ProtocolUDP}

// One load balancer HNS refuses for good: the others are programmed, the
// sync succeeds (health stays up), the port is reported and retried with a
// doubling backoff, and programmed as soon as HNS accepts it.
func TestBackendIsolatesRejectedLoadBalancer(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern)
	h.f.RejectLoadBalancers(rejectUDP)
	s := webAndDNS()

	h.mustSync(s, proxy.Changes{Full: true})
	noDNS := `lb TCP *:30080 -> 8080 flags=0 pflags=18 dist=0 eps=10.244.1.5,10.244.2.5,10.244.3.5
lb TCP 10.96.0.10:80 -> 8080 flags=0 pflags=0 dist=0 eps=10.244.1.5,10.244.2.5,10.244.3.5
`
	if got := h.f.Dump(); !strings.HasPrefix(got, noDNS) || strings.Contains(got, "lb UDP") {
		t.Fatalf("the other load balancers must be programmed:\n%s", got)
	}
	q := h.b.Quarantined()
	wt.MustEqual(t, "quarantined", quarantineString(q, h.clock.Now())+"\n", "ns/dns:p/IPv4 since=0s retry=+1s\n")
	if len(q) == 1 && !strings.Contains(q[0].Reason, "the parameter is incorrect") {
		t.Errorf("reason %q does not carry HNS's error", q[0].Reason)
	}

	// Before the retry time: a sync with no change makes no call.
	expectCalls(t, "held", h.mustSync(s, proxy.Changes{}), "")
	// Retry due: tried again (refused again), the backoff doubles.
	h.clock.Step(time.Second)
	expectCalls(t, "first retry", h.mustSync(s, proxy.Changes{}), "CreateLoadBalancer=1")
	wt.MustEqual(t, "after the first retry", quarantineString(h.b.Quarantined(), h.clock.Now())+"\n", "ns/dns:p/IPv4 since=1s retry=+2s\n")
	// A change of another Service does not retry it early.
	expectCalls(t, "other change", h.mustSync(s, changed), "")

	// HNS accepts it now: programmed at the next retry, quarantine lifted.
	h.f.RejectLoadBalancers(nil)
	h.clock.Step(2 * time.Second)
	expectCalls(t, "accepted", h.mustSync(s, proxy.Changes{}), "CreateLoadBalancer=1")
	wt.MustEqual(t, "after acceptance", h.f.Dump(), webAndDNSDump)
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("still quarantined: %+v", q)
	}
}

func TestQuarantineBackoffIsCapped(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern)
	h.f.RejectLoadBalancers(rejectUDP)
	s := webAndDNS()
	h.mustSync(s, proxy.Changes{Full: true})
	for range 12 {
		q := h.b.Quarantined()
		if len(q) != 1 {
			t.Fatalf("quarantine: %+v", q)
		}
		h.clock.SetTime(q[0].Retry)
		h.mustSync(s, proxy.Changes{})
	}
	q := h.b.Quarantined()
	if d := q[0].Retry.Sub(h.clock.Now()); d != QuarantineMaxBackoff {
		t.Errorf("backoff after 12 rejections: %s, want the cap %s", d, QuarantineMaxBackoff)
	}
}

// An update HNS refuses keeps the load balancer that is there (its old
// endpoints) rather than deleting it.
func TestBackendRejectedUpdateKeepsOldLoadBalancer(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern)
	h.mustSync(webAndDNS(), proxy.Changes{Full: true})
	h.f.RejectLoadBalancers(func(lb *hns.LoadBalancer) error {
		if lb.PortMappings[0].ExternalPort == 53 {
			return hns.NewError(hns.OpUpdateLoadBalancer, hns.CodeInvalidArg, errRefused)
		}
		return nil
	})
	s := wt.Snap(node(),
		wt.SvcPort("web", v1.ProtocolTCP, "10.96.0.10", 80, wt.NodePort(30080), wt.Eps(wt.LocalEP("10.244.1.5", 8080), wt.RemoteEP("10.244.2.5", 8080), wt.RemoteEP("10.244.3.5", 8080))),
		wt.SvcPort("dns", v1.ProtocolUDP, "10.96.0.53", 53, wt.Eps(wt.LocalEP("10.244.1.6", 53))),
	)
	h.mustSync(s, changed)
	if !strings.Contains(h.f.Dump(), "lb UDP 10.96.0.53:53 -> 53 flags=0 pflags=0 dist=0 eps=10.244.1.6,10.244.2.9\n") {
		t.Errorf("the refused update must leave the old load balancer:\n%s", h.f.Dump())
	}
	if q := h.b.Quarantined(); len(q) != 1 || q[0].Name != dnsPort {
		t.Errorf("quarantined: %+v", q)
	}
	// Held: a sync before the retry changes nothing.
	expectCalls(t, "held", h.mustSync(s, changed), "")
}

// A remote endpoint HNS refuses for good: the load balancers are programmed
// without it, and the ports that wanted it are reported.
func TestBackendIsolatesRejectedEndpoint(t *testing.T) {
	h := newHarness(t, l2bridgeNet, wt.HNSModern)
	h.f.RejectEndpoints(func(ep *hns.Endpoint) error {
		if ep.IPConfigurations[0].IPAddress == "10.244.3.5" {
			return hns.NewError(hns.OpCreateEndpoint, hns.CodeInvalidArg, errRefused)
		}
		return nil
	})
	s := webAndDNS()
	h.mustSync(s, proxy.Changes{Full: true})
	wt.MustEqual(t, "without the refused endpoint", h.f.Dump(), strings.NewReplacer(
		",10.244.3.5\n", "\n", "ep 10.244.3.5 remote name=kproxy-remote-10.244.3.5\n", "").Replace(webAndDNSDump))
	wt.MustEqual(t, "quarantined", quarantineString(h.b.Quarantined(), h.clock.Now())+"\n", "ns/web:p/IPv4 since=0s retry=+1s\n")
	expectCalls(t, "held", h.mustSync(s, changed), "")
	h.f.RejectEndpoints(nil)
	h.clock.Step(time.Second)
	h.mustSync(s, proxy.Changes{})
	wt.MustEqual(t, "after acceptance", h.f.Dump(), webAndDNSDump)
	if q := h.b.Quarantined(); len(q) != 0 {
		t.Errorf("still quarantined: %+v", q)
	}
}
