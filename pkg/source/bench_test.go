package source

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkScanUnchanged measures one poll of a directory of 100 files of
// 10 Services each when nothing changed: the cost paid every pollInterval.
func BenchmarkScanUnchanged(b *testing.B) {
	dir := b.TempDir()
	for f := range 100 {
		var sb strings.Builder
		for i := range 10 {
			sb.WriteString("---\n" + svc(fmt.Sprintf("s-%d-%d", f, i), "b", 80))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.yaml", f)), []byte(sb.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	s := newManifestStore(dir, logBufferLogger())
	s.now = func() time.Time { return time.Now().Add(time.Hour) } // files are settled
	if err := s.scan(false); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.scan(false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseManifest measures parsing one file of 1,000 Services.
func BenchmarkParseManifest(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString("---\n" + svc(fmt.Sprintf("s-%d", i), "b", 80))
	}
	data := []byte(sb.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		objs, _, err := parseManifest("f.yaml", data)
		if err != nil || len(objs) != 1000 {
			b.Fatal(err, len(objs))
		}
	}
}

// apiService builds a Service as the API server returns it after a kubectl
// apply: managedFields and the last-applied annotation included.
func apiService(i int) *v1.Service {
	name := fmt.Sprintf("service-%05d", i)
	applied := fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app":"%s"},"name":"%s","namespace":"default"},"spec":{"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}],"selector":{"app":"%s"}}}`, name, name, name)
	fields := `{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name, UID: "0d7e3b38-8c43-4c4e-9a1e-6b0f0c1d2e3f", ResourceVersion: "123456",
			Labels:      map[string]string{"app": name},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": applied},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)},
			}},
		},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.12.34", ClusterIPs: []string{"10.96.12.34"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, Selector: map[string]string{"app": name},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
}

// BenchmarkTransformService reports the heap one Service holds with and
// without the transform (average over 10,000 Services); the time per op is
// building one API Service and transforming it.
func BenchmarkTransformService(b *testing.B) {
	const n = 10000
	heldPerService := func(transform bool) float64 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		objs := make([]*v1.Service, n)
		for i := range objs {
			objs[i] = apiService(i)
			if transform {
				_, _ = newTransformer().transform(objs[i])
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(objs)
		return float64(after.HeapAlloc-before.HeapAlloc) / n
	}
	raw, stripped := heldPerService(false), heldPerService(true)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = newTransformer().transform(apiService(1))
	}
	b.ReportMetric(raw, "B/svc-raw")
	b.ReportMetric(stripped, "B/svc-stripped")
}
