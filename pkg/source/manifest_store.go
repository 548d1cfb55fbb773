package source

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/logging"
)

const (
	// pollInterval is how often the manifest directory is checked.
	pollInterval = 250 * time.Millisecond
	// racyWindow: a file modified less than this before it was read may be
	// modified again without its size or timestamp changing (coarse file
	// system timestamps); it is read again at the next poll.
	racyWindow = 2 * time.Second
	// historySize bounds the events kept for resuming watches.
	historySize = 1024
)

// fileState is what the scanner knows about one manifest file.
type fileState struct {
	// read is the stat of the content last read; racy tells that it was
	// modified too shortly before it was read to be trusted.
	read statKey
	racy bool
	// seen is the stat at the previous scan, to let a changing file settle.
	seen statKey
	// hash is the content last parsed (parsed tells whether there was one).
	hash   [sha256.Size]byte
	parsed bool
	// objects are from the last content that parsed.
	objects []manifestObject
	// ioErr is the last read error reported, to report each one once.
	ioErr string
}

// statKey is what a stat tells about a file's content.
type statKey struct {
	size    int64
	modTime int64 // UnixNano
}

// storedObject is one object served by the store. obj has no resourceVersion
// and is never modified: everything served is a copy.
type storedObject struct {
	obj runtime.Object
	rv  uint64
}

// storeEvent is one change of the served objects: old is nil for an
// addition, cur is nil for a deletion.
type storeEvent struct {
	rv       uint64
	key      objectKey
	old, cur runtime.Object
}

// mergedObject is an object of the merged directory view and where it is defined.
type mergedObject struct {
	obj  runtime.Object
	file string
	line int
}

// manifestStore serves the objects of a manifest directory to the
// ListerWatchers of every kind. scan reads the directory; list and watch
// serve the result.
type manifestStore struct {
	dir    string
	logger klog.Logger
	now    func() time.Time

	// Scanner state, owned by the one goroutine calling scan.
	files      map[string]*fileState
	duplicates map[objectKey]string // reported duplicate definitions
	dirErr     string               // last directory error reported
	// strict: parse errors of whole files are collected in fileErrs
	// instead of logged (the initial scan of a dry run, which fails on
	// them).
	strict   bool
	fileErrs []error

	mu       sync.Mutex
	rev      uint64
	objects  map[objectKey]*storedObject
	history  []storeEvent
	floor    uint64 // events with rv <= floor have left history
	watchers map[*manifestWatch]struct{}
}

func newManifestStore(dir string, logger klog.Logger) *manifestStore {
	return &manifestStore{
		dir:        dir,
		logger:     logger,
		now:        time.Now,
		files:      map[string]*fileState{},
		duplicates: map[objectKey]string{},
		objects:    map[objectKey]*storedObject{},
		watchers:   map[*manifestWatch]struct{}{},
	}
}

// isManifestName tells whether a directory entry name is a manifest file.
func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// poll scans the directory every interval until ctx is done. A directory
// error is reported once (until it changes or clears) and keeps the objects.
func (s *manifestStore) poll(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.scan(true)
		switch {
		case err != nil && err.Error() != s.dirErr:
			s.dirErr = err.Error()
			s.logger.Error(err, "Cannot read the manifest directory; keeping the last objects", "dir", s.dir)
		case err == nil && s.dirErr != "":
			s.dirErr = ""
			s.logger.Info("Manifest directory readable again", "dir", s.dir)
		}
	}
}

// scan checks every manifest file of the directory, re-parses those that
// changed and publishes the resulting changes. With settle, a file whose
// size or timestamp changed since the previous scan is left for the next one,
// so that a file being written (truncated, then filled) is not served half
// written. It returns an error only when the directory itself cannot be read;
// problems with files are reported and leave the file's previous objects in
// place.
func (s *manifestStore) scan(settle bool) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("reading manifest directory %q: %w", s.dir, err)
	}
	seen := make(map[string]bool, len(entries))
	dirty := false
	for _, e := range entries {
		name := e.Name()
		if !isManifestName(name) {
			continue
		}
		path := filepath.Join(s.dir, name)
		fi, err := os.Stat(path) // follows symbolic links
		if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.IsDir()) {
			continue // gone since ReadDir, a dangling link, or a directory
		}
		seen[name] = true
		st := s.files[name]
		if st == nil {
			st = &fileState{}
			s.files[name] = st
		}
		if err == nil {
			err = checkManifestFile(fi)
		}
		if err != nil {
			s.reportIOError(st, path, err)
			continue
		}
		cur := statKey{size: fi.Size(), modTime: fi.ModTime().UnixNano()}
		prev := st.seen
		st.seen = cur
		if st.parsed && !st.racy && st.read == cur {
			continue
		}
		if settle && prev != cur {
			continue
		}
		readAt := s.now()
		data, err := readManifest(path)
		if err != nil {
			s.reportIOError(st, path, err)
			continue
		}
		st.ioErr = ""
		st.read = cur
		st.racy = readAt.Sub(fi.ModTime()) < racyWindow
		sum := sha256.Sum256(data)
		if st.parsed && sum == st.hash {
			continue
		}
		st.hash, st.parsed = sum, true
		if s.parseInto(st, path, data) {
			dirty = true
		}
	}
	for name, st := range s.files {
		if !seen[name] {
			delete(s.files, name)
			if len(st.objects) > 0 {
				dirty = true
			}
		}
	}
	if dirty {
		s.apply(s.merge())
	}
	return nil
}

// parseInto parses a file's new content into st, reporting problems. It
// returns whether st's objects were replaced.
func (s *manifestStore) parseInto(st *fileState, path string, data []byte) bool {
	objs, skipped, err := parseManifest(path, data)
	if err != nil && s.strict {
		s.fileErrs = append(s.fileErrs, err)
		return false
	}
	if err != nil {
		kv := []any{"file", path}
		var fe *fileError
		if errors.As(err, &fe) && fe.Line > 0 {
			kv = append(kv, "line", fe.Line)
		}
		kv = append(kv, "keptObjects", len(st.objects))
		s.logger.Error(err, "Manifest file does not parse; keeping its previous objects", kv...)
		return false
	}
	for _, p := range skipped {
		s.logger.Error(p, "Skipping manifest object", "file", p.File, "line", p.Line)
	}
	st.objects = objs
	return true
}

func (s *manifestStore) reportIOError(st *fileState, path string, err error) {
	if err.Error() == st.ioErr {
		return
	}
	st.ioErr = err.Error()
	s.logger.Error(err, "Cannot read manifest file; keeping its previous objects", "file", path, "keptObjects", len(st.objects))
}

// merge combines the objects of every file: for an object defined more than
// once, the file last in name order wins (within a file, the later
// definition). New or changed duplicates are reported.
func (s *manifestStore) merge() map[objectKey]mergedObject {
	names := make([]string, 0, len(s.files))
	for name := range s.files {
		names = append(names, name)
	}
	sort.Strings(names)
	merged := map[objectKey]mergedObject{}
	dups := map[objectKey]string{}
	for _, name := range names {
		path := filepath.Join(s.dir, name)
		for _, o := range s.files[name].objects {
			if prev, ok := merged[o.key]; ok {
				d := dups[o.key]
				if d == "" {
					d = fmt.Sprintf("%s:%d", prev.file, prev.line)
				}
				dups[o.key] = fmt.Sprintf("%s, %s:%d", d, path, o.line)
			}
			merged[o.key] = mergedObject{obj: o.obj, file: path, line: o.line}
		}
	}
	for key, where := range dups {
		if s.duplicates[key] != where {
			w := merged[key]
			logging.Warning(s.logger, "Object defined more than once in the manifest directory; the last definition wins",
				"object", key.String(), "definitions", where, "winner", fmt.Sprintf("%s:%d", w.file, w.line))
		}
	}
	s.duplicates = dups
	return merged
}

// apply makes the served objects equal to merged, publishing one event per
// added, changed or removed object, in key order.
func (s *manifestStore) apply(merged map[objectKey]mergedObject) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]objectKey, 0, len(merged)+len(s.objects))
	for k := range merged {
		keys = append(keys, k)
	}
	for k := range s.objects {
		if _, ok := merged[k]; !ok {
			keys = append(keys, k)
		}
	}
	sortKeys(keys)
	for _, k := range keys {
		old := s.objects[k]
		m, ok := merged[k]
		ev := storeEvent{key: k}
		switch {
		case old == nil:
			ev.cur = m.obj
		case !ok:
			ev.old = old.obj
		case !equality.Semantic.DeepEqual(old.obj, m.obj):
			ev.old, ev.cur = old.obj, m.obj
		default:
			continue
		}
		s.rev++
		ev.rv = s.rev
		if ev.cur == nil {
			delete(s.objects, k)
		} else {
			s.objects[k] = &storedObject{obj: ev.cur, rv: ev.rv}
		}
		s.history = append(s.history, ev)
		if n := len(s.history) - historySize; n > 0 {
			s.floor = s.history[n-1].rv
			s.history = s.history[n:]
		}
		for w := range s.watchers {
			w.offer(ev)
		}
	}
}

func sortKeys(keys []objectKey) {
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		if a.namespace != b.namespace {
			return a.namespace < b.namespace
		}
		return a.name < b.name
	})
}
