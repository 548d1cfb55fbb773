package cache

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func TestNameValidation(t *testing.T) {
	long := strings.Repeat("a", 64)
	tests := []struct {
		name string
		svc  *v1.Service              // nil: not part of the case
		es   *discovery.EndpointSlice // nil: not part of the case
		// wantField is the field of the single problem expected ("" when valid).
		wantField string
		// wantPorts are the port names kept (Services), nil to skip.
		wantPorts []string
	}{
		{name: "valid Service", svc: svc("ns/web", []string{"10.96.0.1"}, []string{"http:80", "https:443"}), wantPorts: []string{"http", "https"}},
		{name: "Service name starting with a digit (relaxed rule)", svc: svc("ns/1web", []string{"10.96.0.1"}, []string{"80"}), wantPorts: []string{""}},
		{name: "Service name with a newline", svc: svc("ns/web\nx", []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.name"},
		{name: "Service name with a quote", svc: svc(`ns/we"b`, []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.name"},
		{name: "Service name upper case", svc: svc("ns/Web", []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.name"},
		{name: "Service name too long", svc: svc("ns/"+long, []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.name"},
		{name: "Service name empty", svc: svc("ns/", []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.name"},
		{name: "namespace with a tab", svc: svc("n\ts/web", []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.namespace"},
		{name: "namespace with a dot", svc: svc("n.s/web", []string{"10.96.0.1"}, []string{"80"}), wantField: "metadata.namespace"},
		{name: "ExternalName with a bad name still reported", svc: svc("ns/a b", nil, nil, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }), wantField: "metadata.name"},
		{name: "port name with a newline dropped, the rest kept", svc: svc("ns/web", []string{"10.96.0.1"}, []string{"ht\ntp:80", "ok:81"}), wantField: "spec.ports[0].name", wantPorts: []string{"ok"}},
		{name: "port name with a quote", svc: svc("ns/web", []string{"10.96.0.1"}, []string{`a"b:80`}), wantField: "spec.ports[0].name", wantPorts: []string{}},
		{name: "port name longer than IANA's 15 is legal for Services", svc: svc("ns/web", []string{"10.96.0.1"}, []string{"a-very-long-port-name:80"}), wantPorts: []string{"a-very-long-port-name"}},
		{name: "valid slice", es: slice("ns/web-abc.1", "web", discovery.AddressTypeIPv4, []string{"http:80"}, "10.0.1.1")},
		{name: "slice name with a newline", es: slice("ns/web\n1", "web", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1"), wantField: "metadata.name"},
		{name: "slice namespace upper case", es: slice("NS/web-1", "web", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1"), wantField: "metadata.namespace"},
		{name: "slice Service label with a control character", es: slice("ns/web-1", "we\x01b", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1"), wantField: "metadata.labels[kubernetes.io/service-name]"},
		{name: "slice port name with a quote", es: slice("ns/web-1", "web", discovery.AddressTypeIPv4, []string{`h"t:80`, "ok:81"}, "10.0.1.1"), wantField: "ports[0].name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var problems []Problem
			var svcPorts []string
			var parsed bool
			if tc.svc != nil {
				info, p := parseService(tc.svc)
				problems, parsed = p, info != nil
				if info != nil {
					svcPorts = []string{}
					for _, sp := range info.ports {
						svcPorts = append(svcPorts, sp.name)
					}
				}
			} else {
				info, p := parseSlice(tc.es)
				problems, parsed = p, info != nil
			}
			var fields []string
			for _, p := range problems {
				fields = append(fields, p.Field)
				if strings.ContainsAny(p.String(), "\n\t\x01") {
					t.Errorf("problem carries a control character: %q", p.String())
				}
			}
			switch {
			case tc.wantField == "" && len(problems) > 0:
				t.Errorf("problems %v, want none", problems)
			case tc.wantField != "" && !slices.Equal(fields, []string{tc.wantField}):
				t.Errorf("problem fields %v, want exactly [%s]", fields, tc.wantField)
			}
			rejected := tc.wantField != "" && !strings.Contains(tc.wantField, "ports[")
			if rejected && parsed {
				t.Errorf("object with a bad name accepted")
			}
			if tc.wantPorts != nil && !slices.Equal(svcPorts, tc.wantPorts) {
				t.Errorf("ports %q, want %q", svcPorts, tc.wantPorts)
			}
		})
	}
}

// TestBadNamesRejectedWithOneWarningAndOthersKept goes through the cache as a
// source would: hostile names get one warning each, naming the object on one
// line, and the good Service sharing the namespace keeps its endpoints.
func TestBadNamesRejectedWithOneWarningAndOthersKept(t *testing.T) {
	var buf bytes.Buffer
	log := funcr.New(func(prefix, args string) { buf.WriteString(args + "\n") }, funcr.Options{})
	c := New(Options{NodeName: thisNode, Logger: &log})
	c.OnService(nil, svc("ns/good", []string{"10.96.0.1"}, []string{"80"}))
	c.OnEndpointSlice(nil, slice("ns/good-1", "good", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.1"))
	c.OnService(nil, svc("ns/evil\n-A KPROXY-SERVICES -j ACCEPT", []string{"10.96.0.2"}, []string{"80"}))
	c.OnEndpointSlice(nil, slice("ns/evil-1", "evil\n", discovery.AddressTypeIPv4, []string{"80"}, "10.0.1.2"))
	snap, _ := c.Snapshot()
	if got := portNames(snap.IPv4); !slices.Equal(got, []string{"ns/good/TCP"}) {
		t.Fatalf("ports %v, want only ns/good", got)
	}
	if got := epList(snap.IPv4.Sorted()[0].ClusterEndpoints); got != "10.0.1.1:80" {
		t.Errorf("good Service endpoints %q", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 warning lines (one per bad object), got %d:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], `evil\\n-A KPROXY-SERVICES`) || !strings.Contains(lines[1], `evil\\n`) {
		t.Errorf("warnings do not name the objects:\n%s", buf.String())
	}
}
