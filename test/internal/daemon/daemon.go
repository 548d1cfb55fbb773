// Package daemon is the plumbing the two local clusters share (make cluster
// in test/cluster, make netns-cluster in test/nscluster): a detached daemon
// that builds a cluster and runs until it is signalled, its pid file and
// log, waiting for its state file, and files written atomically.
package daemon

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// WriteAtomic writes data to a temporary file next to path, with mode, and
// renames it to path: a reader never sees a partial file.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // after the rename: no such file
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// WriteJSON writes v to path as indented JSON, atomically.
func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteAtomic(path, append(data, '\n'), 0o644)
}

// Prefixed writes to W with Prefix at the start of every line (a partial
// last line is written as is: a log is copied as it grows).
type Prefixed struct {
	W      io.Writer
	Prefix string
}

func (p Prefixed) Write(b []byte) (int, error) {
	out := p.Prefix + strings.ReplaceAll(string(b), "\n", "\n"+p.Prefix)
	out = strings.TrimSuffix(out, p.Prefix)
	if _, err := io.WriteString(p.W, out); err != nil {
		return 0, err
	}
	return len(b), nil
}
