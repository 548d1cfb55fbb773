package windows

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/platform/windows/hns"
	"github.com/kproxy/kproxy/platform/windows/reconcile"
)

// The echoes HNS was seen to return changed (reconcile.Echoes.Learned) are
// kept in Options.EchoFile, per Windows build, so that a restart does not
// re-create the load balancers whose fields HNS rewrites: a field is then
// re-created at most once per Windows build, not once per kproxy start.

// echoFile is the content of Options.EchoFile.
type echoFile struct {
	// Build is the Windows build and HNS version the echoes were learned on.
	Build   string      `json:"build"`
	Learned []echoEntry `json:"learned"`
}

type echoEntry struct {
	Field string `json:"field"`
	Sent  string `json:"sent"`
	Read  string `json:"read"`
}

var fieldByName = func() map[string]hns.Fields {
	m := map[string]hns.Fields{}
	for f := hns.Fields(1); f <= hns.FieldsAll; f <<= 1 {
		m[f.String()] = f
	}
	return m
}()

// echoStore keeps the learned echoes in a file (Options.EchoFile).
type echoStore struct {
	file string // "" keeps them in memory only
	log  klog.Logger
	// loaded: the file was read; saved is what was last written (or read).
	loaded bool
	saved  string
}

// load sets e's learned echoes for build: those of the file when it was
// written on the same build, else none.
func (s *echoStore) load(e *reconcile.Echoes, build string) {
	if e.Build != build {
		e.Build, e.Learned = build, nil
	}
	if s.loaded || s.file == "" {
		return
	}
	s.loaded = true
	data, err := os.ReadFile(s.file)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var f echoFile
	if err == nil {
		err = json.Unmarshal(data, &f)
	}
	if err != nil {
		s.log.Info("Cannot read the learned HNS echoes; learning them again", "file", s.file, "err", err)
		return
	}
	s.saved = string(data)
	if f.Build != build {
		s.log.Info("Learned HNS echoes are of another Windows build; learning them again", "file", s.file,
			"fileBuild", f.Build, "build", build)
		return
	}
	for _, x := range f.Learned {
		field, ok := fieldByName[x.Field]
		if !ok {
			continue
		}
		if e.Learned == nil {
			e.Learned = make(map[reconcile.EchoKey]string)
		}
		e.Learned[reconcile.EchoKey{Field: field, Sent: x.Sent}] = x.Read
	}
	if len(e.Learned) > 0 {
		s.log.Info("Learned HNS echoes loaded", "file", s.file, "build", build, "echoes", len(e.Learned))
	}
}

// save writes the learned echoes when they changed. A failure is logged:
// the echoes are then learned again after a restart.
func (s *echoStore) save(e reconcile.Echoes) {
	if s.file == "" {
		return
	}
	f := echoFile{Build: e.Build, Learned: []echoEntry{}}
	for k, v := range e.Learned {
		f.Learned = append(f.Learned, echoEntry{Field: k.Field.String(), Sent: k.Sent, Read: v})
	}
	sort.Slice(f.Learned, func(i, j int) bool {
		a, c := f.Learned[i], f.Learned[j]
		if a.Field != c.Field {
			return a.Field < c.Field
		}
		return a.Sent < c.Sent
	})
	if len(f.Learned) == 0 && s.saved == "" {
		return
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil || string(data) == s.saved {
		return
	}
	if err := writeFileAtomic(s.file, data); err != nil {
		s.log.Error(err, "Cannot keep the learned HNS echoes; they are learned again after a restart", "file", s.file)
		return
	}
	s.saved = string(data)
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
