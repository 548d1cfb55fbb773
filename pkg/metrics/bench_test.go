package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// BenchmarkCountNoLocalEndpoints counts over 10,000 service ports, a third
// with a Local policy, as every successful sync does per family.
func BenchmarkCountNoLocalEndpoints(b *testing.B) {
	ports := map[proxy.ServicePortName]*proxy.ServicePort{}
	for i := range 10000 {
		p := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}, Protocol: v1.ProtocolTCP},
			HasAnyEndpoints: true, InternalPolicyLocal: i%3 == 0}
		if i%2 == 0 {
			p.LocalEndpoints = []proxy.Endpoint{{IP: netip.MustParseAddr("10.0.0.1"), Port: 80, Ready: true, Local: true}}
		}
		ports[p.Name] = p
	}
	view := proxy.NewFamilyView(v1.IPv4Protocol, ports)
	b.ReportAllocs()
	for b.Loop() {
		if in, _ := CountNoLocalEndpoints(view); in == 0 {
			b.Fatal("nothing counted")
		}
	}
}

// BenchmarkSyncRecording is what the sync loop records per family and sync:
// the duration, the timestamp, 5 trigger times and the change counts.
func BenchmarkSyncRecording(b *testing.B) {
	m := New(Options{})
	now := time.Now()
	triggers := []time.Time{now, now.Add(-time.Second), now.Add(-2 * time.Second), now.Add(-3 * time.Second), now.Add(-4 * time.Second)}
	b.ReportAllocs()
	for b.Loop() {
		m.Synced(v1.IPv4Protocol, false, 3*time.Millisecond)
		m.Programmed(v1.IPv4Protocol, triggers)
		m.ChangesProgrammed(1, 5)
	}
}

// BenchmarkScrape serves /metrics once (text format) with every kproxy
// series populated for two families.
func BenchmarkScrape(b *testing.B) {
	m := New(Options{Pending: func() (int, int) { return 0, 0 }})
	m.Families(v1.IPv4Protocol, v1.IPv6Protocol)
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		m.Synced(f, true, time.Millisecond)
		m.Synced(f, false, time.Millisecond)
		m.Programmed(f, []time.Time{time.Now()})
		m.IPTables(f).Rules("nat", 1000, 10)
		m.IPTables(f).Rules("filter", 100, 1)
	}
	h := m.Handler()
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		if _, err := io.Copy(io.Discard, w.Body); err != nil || w.Code != 200 {
			b.Fatal(w.Code, err)
		}
	}
}
