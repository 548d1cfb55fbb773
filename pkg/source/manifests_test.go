package source

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
)

// startManifestSource runs RunManifests over dir until the test ends.
func startManifestSource(t *testing.T, dir, node string) (*recorder, *logBuffer) {
	t.Helper()
	rec := newRecorder()
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logs.logger()))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := RunManifests(ctx, dir, node, rec); err != nil {
			t.Errorf("RunManifests: %v", err)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		rec.check(t)
		if t.Failed() {
			t.Logf("source log:\n%s", logs.String())
		}
	})
	return rec, logs
}

func TestRunManifestsExamples(t *testing.T) {
	rec, logs := startManifestSource(t, "testdata/example", "node-1")
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })
	_, atSync := rec.syncState()
	want := []string{
		"EndpointSlice demo/web-v4",
		"EndpointSlice demo/web-v6",
		"EndpointSlice kube-system/dns-1",
		"Node node-1", // in manifest mode the Node is delivered before OnSynced
		"Service demo/web",
		"Service kube-system/dns",
	}
	if d := diffKeys(atSync, want); d != "" {
		t.Errorf("objects before OnSynced:\n%s", d)
	}
	if l := logs.find("Manifest"); len(l) > 0 {
		t.Errorf("the examples produce manifest warnings:\n%s", strings.Join(l, "\n"))
	}
	es := rec.get("EndpointSlice demo/web-v4").(*discovery.EndpointSlice)
	if es.ResourceVersion == "" || es.Annotations[v1.EndpointsLastChangeTriggerTime] == "" || len(es.Endpoints) != 2 {
		t.Errorf("slice as delivered: %+v", es)
	}
}

func TestRunManifestsFollowsFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", svc("a", "a", 80)+"---\n"+
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: a-1\n  labels: {kubernetes.io/service-name: a}\naddressType: IPv4\n")
	writeFile(t, dir, "list.yaml", "apiVersion: v1\nkind: List\nitems:\n- "+strings.ReplaceAll(strings.TrimSpace(svc("b", "list", 80)), "\n", "\n  ")+"\n")
	writeFile(t, dir, "nodes.json", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}
{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"}}`)
	writeFile(t, dir, "other.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: c\n  labels: {service.kubernetes.io/service-proxy-name: other}\n")

	rec, logs := startManifestSource(t, dir, "n1")
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })
	_, atSync := rec.syncState()
	if d := diffKeys(atSync, []string{"EndpointSlice default/a-1", "Node n1", "Service default/a", "Service default/b"}); d != "" {
		t.Errorf("initial objects:\n%s", d)
	}

	port := func(key string) int32 {
		s, _ := rec.get(key).(*v1.Service)
		if s == nil || len(s.Spec.Ports) == 0 {
			return 0
		}
		return s.Spec.Ports[0].Port
	}
	// Edit a file.
	writeFile(t, dir, "a.yaml", svc("a", "a", 81)+"---\n"+
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: a-1\n  labels: {kubernetes.io/service-name: a}\naddressType: IPv4\n")
	eventually(t, "the edit", func() bool { return port("Service default/a") == 81 })

	// A new file.
	writeFile(t, dir, "d.yml", svc("d", "d", 80))
	eventually(t, "the new file", func() bool { return rec.get("Service default/d") != nil })

	// A deleted file.
	if err := os.Remove(filepath.Join(dir, "list.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletion", func() bool { return rec.get("Service default/b") == nil })

	// A broken file is reported with its line and keeps its objects...
	writeFile(t, dir, "a.yaml", svc("a", "a", 82)+"---\napiVersion: v1\nkind: Service\nmetadata:\n  name: x\n\tbroken: true\n")
	eventually(t, "the parse error report", func() bool {
		return len(logs.find("does not parse", filepath.Join(dir, "a.yaml"), `"line"=14`)) == 1
	})
	if port("Service default/a") != 81 || rec.get("EndpointSlice default/a-1") == nil {
		t.Errorf("objects of the broken file changed: port %d, slice %v", port("Service default/a"), rec.get("EndpointSlice default/a-1"))
	}
	// ...until it is fixed.
	writeFile(t, dir, "a.yaml", svc("a", "a", 83))
	eventually(t, "the fix", func() bool { return port("Service default/a") == 83 && rec.get("EndpointSlice default/a-1") == nil })

	// The same object in a later file wins.
	writeFile(t, dir, "z.yaml", svc("a", "z", 90))
	eventually(t, "the later file's definition", func() bool { return port("Service default/a") == 90 }) // only z.yaml says 90
	if len(logs.find("defined more than once", "Service default/a")) != 1 {
		t.Errorf("duplicate not reported once:\n%s", logs.String())
	}

	// A label change makes an ignored Service appear, and the Node field
	// selector keeps n2 out.
	writeFile(t, dir, "other.yaml", svc("c", "c", 80))
	eventually(t, "the relabelled service", func() bool { return rec.get("Service default/c") != nil })
	if rec.get("Node n2") != nil {
		t.Error("another node was delivered")
	}
	if n, _ := rec.syncState(); n != 1 {
		t.Errorf("OnSynced called %d times", n)
	}
}

// TestRunManifestsStrict: with Strict (a dry run) the first read fails when
// a file does not parse, naming each such file, its line and the problem;
// without it, the same directory is served (the bad files logged).
func TestRunManifestsStrict(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, "testdata/example", dir)
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x\n  spec: [\n")
	write("broken.json", `{"apiVersion": "v1", "kind": `)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := RunManifestsWith(ctx, dir, "node-1", newRecorder(), ManifestOptions{Strict: true})
	if err == nil {
		t.Fatal("strict: no error for a directory with files that do not parse")
	}
	for _, want := range []string{filepath.Join(dir, "broken.yaml") + ":3: ", filepath.Join(dir, "broken.json"), "2 manifest file(s)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("strict: error %q lacks %q", err, want)
		}
	}

	// Not strict: served, the examples delivered.
	rec, logs := startManifestSource(t, dir, "node-1")
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })
	if len(logs.find("does not parse")) != 2 {
		t.Errorf("not strict: want both bad files logged:\n%s", logs.String())
	}
}

// TestRunManifestsStrictGoodDirectory: Strict does not fail a directory
// whose files all parse.
func TestRunManifestsStrictGoodDirectory(t *testing.T) {
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- RunManifestsWith(ctx, "testdata/example", "node-1", rec, ManifestOptions{Strict: true})
	}()
	eventually(t, "OnSynced", func() bool { n, _ := rec.syncState(); return n == 1 })
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("strict over good files: %v", err)
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
