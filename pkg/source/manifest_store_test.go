package source

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// svc renders a Service manifest; src is recorded in a label to tell which
// definition won.
func svc(name, src string, port int) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  labels: {src: %s}\nspec:\n  ports:\n  - port: %d\n", name, src, port)
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// served lists the store's objects of every kind as "key src=label port=N rv=N".
func servedObjects(t *testing.T, s *manifestStore) []string {
	t.Helper()
	var out []string
	for _, k := range []kind{kindService, kindEndpointSlice, kindNode} {
		l, err := s.list(k, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range items {
			m, _ := meta.Accessor(o)
			d := fmt.Sprintf("%s %s/%s src=%s", k, m.GetNamespace(), m.GetName(), m.GetLabels()["src"])
			if svc, ok := o.(*v1.Service); ok && len(svc.Spec.Ports) > 0 {
				d += fmt.Sprintf(" port=%d", svc.Spec.Ports[0].Port)
			}
			out = append(out, d+" rv="+m.GetResourceVersion())
		}
	}
	return out
}

func TestManifestStoreScan(t *testing.T) {
	type step struct {
		name string
		// files to write; "" deletes the file.
		files map[string]string
		// want is the served objects after the scan (rv=N: exact resourceVersions).
		want []string
		// logs are substrings expected in one new log line each.
		logs [][]string
	}
	tests := []struct {
		name  string
		steps []step
	}{{
		name: "add, edit, untouched, delete",
		steps: []step{{
			name:  "initial",
			files: map[string]string{"a.yaml": svc("a", "a", 80), "b.yaml": svc("b", "b", 80), "notes.txt": "ignored", ".hidden.yaml": svc("h", "h", 1)},
			want:  []string{"Service default/a src=a port=80 rv=1", "Service default/b src=b port=80 rv=2"},
		}, {
			name:  "edit one file, rewrite the other unchanged",
			files: map[string]string{"a.yaml": svc("a", "a", 81), "b.yaml": svc("b", "b", 80)},
			want:  []string{"Service default/a src=a port=81 rv=3", "Service default/b src=b port=80 rv=2"},
		}, {
			name:  "new file",
			files: map[string]string{"c.json": `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"src":"c"}}}`},
			want:  []string{"Service default/a src=a port=81 rv=3", "Service default/b src=b port=80 rv=2", "Node /n1 src=c rv=4"},
		}, {
			name:  "delete a file",
			files: map[string]string{"a.yaml": ""},
			want:  []string{"Service default/b src=b port=80 rv=2", "Node /n1 src=c rv=4"},
		}},
	}, {
		name: "a broken file keeps its objects until fixed",
		steps: []step{{
			name:  "initial",
			files: map[string]string{"a.yaml": svc("a", "a", 80) + "---\n" + svc("a2", "a", 80)},
			want:  []string{"Service default/a src=a port=80 rv=1", "Service default/a2 src=a port=80 rv=2"},
		}, {
			name:  "break it",
			files: map[string]string{"a.yaml": svc("a", "a", 81) + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: a2\n   oops: 1\n"},
			want:  []string{"Service default/a src=a port=80 rv=1", "Service default/a2 src=a port=80 rv=2"},
			logs:  [][]string{{"does not parse", `"file"="DIR/a.yaml"`, `"line"=14`, "mapping values are not allowed", `"keptObjects"=2`}},
		}, {
			name:  "fix it",
			files: map[string]string{"a.yaml": svc("a", "a", 81)},
			want:  []string{"Service default/a src=a port=81 rv=3"},
		}},
	}, {
		name: "a new broken file serves nothing, and one bad object does not poison the file",
		steps: []step{{
			name:  "initial",
			files: map[string]string{"a.yaml": "kind: [", "b.yaml": svc("b", "b", 80) + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"},
			want:  []string{"Service default/b src=b port=80 rv=1"},
			logs: [][]string{
				{"does not parse", "DIR/a.yaml", `"line"=1`},
				{"Skipping manifest object", "DIR/b.yaml", `"line"=10`, `unsupported kind \"Secret\"`},
			},
		}},
	}, {
		name: "the same object in two files: the last file by name wins",
		steps: []step{{
			name:  "initial",
			files: map[string]string{"10-a.yaml": svc("x", "10-a", 80), "20-b.yaml": svc("x", "20-b", 81)},
			want:  []string{"Service default/x src=20-b port=81 rv=1"},
			logs:  [][]string{{"defined more than once", "Service default/x", "DIR/10-a.yaml:1, DIR/20-b.yaml:1", `"winner"="DIR/20-b.yaml:1"`}},
		}, {
			name:  "the winner goes away",
			files: map[string]string{"20-b.yaml": ""},
			want:  []string{"Service default/x src=10-a port=80 rv=2"},
		}, {
			name:  "defined twice in one file: the later one wins",
			files: map[string]string{"10-a.yaml": svc("x", "first", 80) + "---\n" + svc("x", "second", 82)},
			want:  []string{"Service default/x src=second port=82 rv=3"},
			logs:  [][]string{{"defined more than once", "DIR/10-a.yaml:1, DIR/10-a.yaml:10"}},
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var logs logBuffer
			s := newManifestStore(dir, logs.logger())
			for _, st := range tc.steps {
				for name, content := range st.files {
					if content == "" {
						if err := os.Remove(filepath.Join(dir, name)); err != nil {
							t.Fatal(err)
						}
						continue
					}
					writeFile(t, dir, name, content)
				}
				before := len(logs.find())
				if err := s.scan(false); err != nil {
					t.Fatalf("%s: scan: %v", st.name, err)
				}
				if d := diffKeys(servedObjects(t, s), st.want); d != "" {
					t.Errorf("%s: served objects:\n%s", st.name, d)
				}
				newLogs := logs.find()[before:]
				for _, want := range st.logs {
					found := false
					for _, l := range newLogs {
						l = strings.ReplaceAll(l, dir, "DIR")
						if containsAll(l, want) {
							found = true
						}
					}
					if !found {
						t.Errorf("%s: no log line with %q in:\n%s", st.name, want, strings.Join(newLogs, "\n"))
					}
				}
				if len(st.logs) == 0 && len(newLogs) > 0 {
					t.Errorf("%s: unexpected log lines:\n%s", st.name, strings.Join(newLogs, "\n"))
				}
			}
			// Scanning again without changes publishes nothing and logs nothing.
			rev, nlogs := s.rev, len(logs.find())
			if err := s.scan(false); err != nil {
				t.Fatal(err)
			}
			if s.rev != rev || len(logs.find()) != nlogs {
				t.Errorf("a scan without changes moved the revision %d -> %d or logged:\n%s", rev, s.rev, logs.String())
			}
		})
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestManifestStoreChangeCheck shows when a file is read again: a file whose
// timestamp is recent is re-read at every scan, so an edit that keeps its size
// and timestamp is still seen; a settled file is trusted by its stat.
func TestManifestStoreChangeCheck(t *testing.T) {
	tests := []struct {
		name     string
		now      func() time.Time
		wantPort string
	}{
		{"recent file is re-read", time.Now, "port=81"},
		{"settled file is trusted by stat", func() time.Time { return time.Now().Add(time.Hour) }, "port=80"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newManifestStore(dir, logBufferLogger())
			s.now = tc.now
			writeFile(t, dir, "a.yaml", svc("a", "a", 80))
			fi, err := os.Stat(filepath.Join(dir, "a.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.scan(false); err != nil {
				t.Fatal(err)
			}
			// Same size, same timestamp, different content.
			writeFile(t, dir, "a.yaml", svc("a", "a", 81))
			if err := os.Chtimes(filepath.Join(dir, "a.yaml"), fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
			if err := s.scan(false); err != nil {
				t.Fatal(err)
			}
			got := servedObjects(t, s)
			if len(got) != 1 || !strings.Contains(got[0], tc.wantPort) {
				t.Errorf("served %q, want %s", got, tc.wantPort)
			}
		})
	}
}

// TestManifestStoreSettle: when polling, a changed file is read once its
// stat held still for one scan, so a file caught between truncation and
// write is never served empty.
func TestManifestStoreSettle(t *testing.T) {
	dir := t.TempDir()
	s := newManifestStore(dir, logBufferLogger())
	steps := []struct {
		name    string
		content string // written before the scan; "-" writes nothing
		want    []string
	}{
		{"new file seen", svc("a", "a", 80), nil},
		{"new file settled", "-", []string{"Service default/a src=a port=80 rv=1"}},
		{"truncated", "", []string{"Service default/a src=a port=80 rv=1"}},
		{"filled", svc("a", "a", 81), []string{"Service default/a src=a port=80 rv=1"}},
		{"settled", "-", []string{"Service default/a src=a port=81 rv=2"}},
		{"unchanged", "-", []string{"Service default/a src=a port=81 rv=2"}},
	}
	for _, st := range steps {
		if st.content != "-" {
			writeFile(t, dir, "a.yaml", st.content)
		}
		if err := s.scan(true); err != nil {
			t.Fatal(err)
		}
		if d := diffKeys(servedObjects(t, s), st.want); d != "" {
			t.Errorf("%s:\n%s", st.name, d)
		}
	}
}

func logBufferLogger() logr.Logger {
	var b logBuffer
	return b.logger()
}

func TestManifestStoreDirectoryErrors(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "m")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, sub, "a.yaml", svc("a", "a", 80))
	var logs logBuffer
	s := newManifestStore(sub, logs.logger())
	if err := s.scan(false); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(sub, sub+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := s.scan(false); err == nil {
		t.Fatal("scan of a missing directory succeeded")
	}
	if got := servedObjects(t, s); len(got) != 1 {
		t.Errorf("objects after a directory error: %q, want the last ones kept", got)
	}
}

// newTestWatch starts a watch and returns a function reading its next event.
func newTestWatch(t *testing.T, s *manifestStore, k kind, o metav1.ListOptions) (watch.Interface, func() string) {
	t.Helper()
	w, err := s.watch(context.Background(), k, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	next := func() string {
		t.Helper()
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return "closed"
			}
			m, _ := meta.Accessor(ev.Object)
			return fmt.Sprintf("%s %s/%s rv=%s", ev.Type, m.GetNamespace(), m.GetName(), m.GetResourceVersion())
		case <-time.After(5 * time.Second):
			t.Fatal("no watch event")
			return ""
		}
	}
	return w, next
}

// noEvent checks that the watch has nothing queued right after a change (the
// store queues synchronously, so a pending event is already in the queue).
func noEvent(t *testing.T, w watch.Interface) {
	t.Helper()
	mw := w.(*manifestWatch)
	mw.mu.Lock()
	defer mw.mu.Unlock()
	if len(mw.queue) > 0 {
		t.Errorf("unexpected watch events %v", mw.queue)
	}
}

func setServices(s *manifestStore, objs ...*v1.Service) {
	m := map[objectKey]mergedObject{}
	for _, o := range objs {
		m[objectKey{kind: kindService, namespace: o.Namespace, name: o.Name}] = mergedObject{obj: o}
	}
	s.apply(m)
}

func labelled(name string, labels map[string]string, port int32) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Port: port}}},
	}
}

func TestManifestWatchSelectors(t *testing.T) {
	s := newManifestStore(t.TempDir(), logBufferLogger())
	other := map[string]string{LabelServiceProxyName: "other"}
	setServices(s, labelled("a", nil, 80), labelled("b", other, 80)) // rv 1, 2

	w, next := newTestWatch(t, s, kindService, metav1.ListOptions{LabelSelector: ProxiedSelector, ResourceVersion: "0"})
	if got := next(); got != "ADDED ns/a rv=1" {
		t.Errorf("initial event %q", got)
	}
	noEvent(t, w)

	steps := []struct {
		name string
		set  []*v1.Service
		want string // "" for no event
	}{
		{"modify a", []*v1.Service{labelled("a", nil, 81), labelled("b", other, 80)}, "MODIFIED ns/a rv=3"},
		{"b starts matching", []*v1.Service{labelled("a", nil, 81), labelled("b", nil, 80)}, "ADDED ns/b rv=4"},
		{"a stops matching", []*v1.Service{labelled("a", other, 81), labelled("b", nil, 80)}, "DELETED ns/a rv=5"},
		{"unmatched a changes", []*v1.Service{labelled("a", other, 82), labelled("b", nil, 80)}, ""},
		{"unmatched a goes", []*v1.Service{labelled("b", nil, 80)}, ""},
		{"b goes", nil, "DELETED ns/b rv=8"},
	}
	for _, st := range steps {
		setServices(s, st.set...)
		if st.want == "" {
			noEvent(t, w)
			continue
		}
		if got := next(); got != st.want {
			t.Errorf("%s: event %q, want %q", st.name, got, st.want)
		}
		noEvent(t, w)
	}

	// A field selector on the name, from a resourceVersion in the history:
	// the changes after it are replayed.
	_, next2 := newTestWatch(t, s, kindService, metav1.ListOptions{FieldSelector: "metadata.name=b", ResourceVersion: "3"})
	for _, want := range []string{"MODIFIED ns/b rv=4", "DELETED ns/b rv=8"} {
		if got := next2(); got != want {
			t.Errorf("replayed %q, want %q", got, want)
		}
	}

	if _, err := s.watch(context.Background(), kindService, metav1.ListOptions{LabelSelector: "a b c"}); !apierrors.IsBadRequest(err) {
		t.Errorf("bad selector: %v, want BadRequest", err)
	}
	w.Stop()
	for range w.ResultChan() {
	}
}

func TestManifestWatchExpired(t *testing.T) {
	s := newManifestStore(t.TempDir(), logBufferLogger())
	for i := range historySize + 10 {
		setServices(s, labelled("a", nil, int32(i+1)))
	}
	if _, err := s.watch(context.Background(), kindService, metav1.ListOptions{ResourceVersion: "5"}); !apierrors.IsResourceExpired(err) {
		t.Errorf("watch from an expired version: %v, want 410 Expired", err)
	}
	rv := strconv.FormatUint(s.rev-1, 10)
	_, next := newTestWatch(t, s, kindService, metav1.ListOptions{ResourceVersion: rv})
	if got, want := next(), fmt.Sprintf("MODIFIED ns/a rv=%d", s.rev); got != want {
		t.Errorf("event %q, want %q", got, want)
	}
}

func TestManifestWatchStopsWithContext(t *testing.T) {
	s := newManifestStore(t.TempDir(), logBufferLogger())
	ctx, cancel := context.WithCancel(context.Background())
	w, err := s.watch(ctx, kindService, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range w.ResultChan() {
	}
	eventually(t, "watcher removal", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.watchers) == 0
	})
}
