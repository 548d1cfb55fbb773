package source

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// recorder is a Handler that records every call and keeps the current
// objects per kind, checking that the calls make sense (no add of a known
// object, no update or delete of an unknown one, OnSynced once).
type recorder struct {
	mu       sync.Mutex
	calls    []string
	objects  map[string]any // "Kind ns/name" -> current object
	synced   int
	atSync   []string // keys known when OnSynced was called
	problems []string
}

var _ Handler = (*recorder)(nil)

func newRecorder() *recorder { return &recorder{objects: map[string]any{}} }

func objKey(kind string, obj any) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return kind + " ?"
	}
	if m.GetNamespace() == "" {
		return kind + " " + m.GetName()
	}
	return kind + " " + m.GetNamespace() + "/" + m.GetName()
}

func record[T any](r *recorder, kind string, old, cur *T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case old == nil && cur == nil:
		r.problems = append(r.problems, kind+": call with old and cur nil")
	case old == nil:
		k := objKey(kind, cur)
		if _, ok := r.objects[k]; ok {
			r.problems = append(r.problems, "add of known "+k)
		}
		r.objects[k] = cur
		r.calls = append(r.calls, "add "+k)
	case cur == nil:
		k := objKey(kind, old)
		if _, ok := r.objects[k]; !ok {
			r.problems = append(r.problems, "delete of unknown "+k)
		}
		delete(r.objects, k)
		r.calls = append(r.calls, "delete "+k)
	default:
		k := objKey(kind, cur)
		if _, ok := r.objects[k]; !ok {
			r.problems = append(r.problems, "update of unknown "+k)
		}
		if objKey(kind, old) != k {
			r.problems = append(r.problems, "update from "+objKey(kind, old)+" to "+k)
		}
		r.objects[k] = cur
		r.calls = append(r.calls, "update "+k)
	}
}

func (r *recorder) OnService(old, cur *v1.Service) { record(r, "Service", old, cur) }
func (r *recorder) OnEndpointSlice(old, cur *discovery.EndpointSlice) {
	record(r, "EndpointSlice", old, cur)
}
func (r *recorder) OnNode(old, cur *v1.Node) { record(r, "Node", old, cur) }

func (r *recorder) OnSynced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced++
	r.atSync = r.keysLocked()
}

func (r *recorder) keysLocked() []string {
	keys := make([]string, 0, len(r.objects))
	for k := range r.objects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// get returns the current object with this key (nil if none).
func (r *recorder) get(key string) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.objects[key]
}

func (r *recorder) syncState() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced, append([]string(nil), r.atSync...)
}

// check fails the test on any inconsistent call.
func (r *recorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.problems {
		t.Errorf("handler: %s", p)
	}
	if r.synced > 1 {
		t.Errorf("OnSynced called %d times", r.synced)
	}
}

// eventually polls cond until it holds, failing the test after a 5s
// deadline. It checks behaviour, not speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logBuffer captures log lines for assertions.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		b.mu.Lock()
		b.lines = append(b.lines, time.Now().Format("15:04:05.000")+" "+prefix+" "+args)
		b.mu.Unlock()
	}, funcr.Options{Verbosity: 10})
}

// find returns the captured lines holding every one of parts.
func (b *logBuffer) find(parts ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
next:
	for _, l := range b.lines {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

func diffKeys(got, want []string) string {
	if strings.Join(got, "\n") == strings.Join(want, "\n") {
		return ""
	}
	return fmt.Sprintf("got  %q\nwant %q", got, want)
}
