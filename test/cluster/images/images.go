// Package images writes the container images of make cluster and make
// conformance as OCI archives, offline: each is a Debian package closure
// (hack/image: apt-get into a private cache, dpkg-deb -x) plus programs
// built from Go modules (test/controlplane), under the exact names and tags
// upstream's e2e suite asks for (k8s.io/kubernetes
// test/utils/image/manifest.go), so that a kubelet with imagePullPolicy
// IfNotPresent finds them in its containerd and never pulls. What each
// image holds is in Specs; where it differs from upstream's is said there.
//
// Nothing here runs a container engine: the archives are imported into each
// node's containerd with "ctr -n k8s.io images import".
package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kproxy/kproxy/hack/image"
	"github.com/kproxy/kproxy/hack/image/oci"
)

// File is a file put into an image.
type File struct {
	// Src is a host path (a built binary), or empty when Data is set.
	Src  string
	Data []byte
	// Dst is the absolute path in the image.
	Dst  string
	Mode fs.FileMode
}

// Spec describes one image.
type Spec struct {
	// Name is the image's file name in the output directory (NAME.oci.tar).
	Name string
	// Refs are the image's names; the first is the archive's, the others are
	// tags ctr adds after the import (same content under another name).
	Refs []string
	// Packages are Debian packages installed with their dependency closure.
	Packages []string
	// Busybox adds a link to busybox for each of its applets that no
	// package provides (the image must have busybox-static in Packages).
	Busybox bool
	// Alternatives installs iptables' nft alternatives and the kproxy
	// DaemonSet's directories (hack/image.Unpack), for a proxy's image.
	Alternatives bool
	Files        []File
	// Symlinks maps a link (absolute path) to its target.
	Symlinks   map[string]string
	Dirs       []image.Dir
	Entrypoint []string
	Cmd        []string
	Env        []string
	// Why says how the image differs from upstream's, for the docs.
	Why string
}

// Ref is the image's main name.
func (s Spec) Ref() string { return s.Refs[0] }

// Options configure Build.
type Options struct {
	// Dir receives NAME.oci.tar and NAME.oci.tar.key per image.
	Dir string
	// DebCache is where apt-get downloads the .debs (shared with make images).
	DebCache string
	// Epoch is the images' created time and the files' latest mtime.
	Epoch time.Time
	// Logf receives progress lines (may be nil).
	Logf func(format string, args ...any)
}

// Built is one archive Build wrote or found.
type Built struct {
	Spec Spec
	Path string
	// Cached is true when the archive was already there for the same inputs.
	Cached bool
}

// Build writes each spec's archive unless one built from the same inputs
// (the spec, the contents of its files) is already in o.Dir.
func Build(ctx context.Context, o Options, specs []Spec) ([]Built, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	var out []Built
	for _, s := range specs {
		b, err := buildOne(ctx, o, s)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Ref(), err)
		}
		out = append(out, b)
	}
	return out, nil
}

// key hashes what an image is made of.
func key(s Spec) (string, error) {
	h := sha256.New()
	files := s.Files
	s.Files = nil
	if err := json.NewEncoder(h).Encode(s); err != nil {
		return "", err
	}
	for _, f := range files {
		fmt.Fprintf(h, "%s %o\n", f.Dst, f.Mode)
		if f.Src == "" {
			h.Write(f.Data)
			continue
		}
		r, err := os.Open(f.Src)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, r)
		_ = r.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func buildOne(ctx context.Context, o Options, s Spec) (Built, error) {
	path := filepath.Join(o.Dir, s.Name+".oci.tar")
	k, err := key(s)
	if err != nil {
		return Built{}, err
	}
	if old, err := os.ReadFile(path + ".key"); err == nil && string(old) == k {
		if _, err := os.Stat(path); err == nil {
			return Built{Spec: s, Path: path, Cached: true}, nil
		}
	}
	start := time.Now()
	work, err := os.MkdirTemp(o.Dir, ".rootfs-")
	if err != nil {
		return Built{}, err
	}
	defer func() { _ = os.RemoveAll(work) }()
	root := filepath.Join(work, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return Built{}, err
	}
	if len(s.Packages) > 0 {
		pkgs, err := image.Resolve(ctx, o.DebCache, s.Packages)
		if err != nil {
			return Built{}, err
		}
		debs, err := image.Download(ctx, o.DebCache, pkgs)
		if err != nil {
			return Built{}, err
		}
		unpack := image.Extract
		if s.Alternatives {
			unpack = image.Unpack
		}
		if err := unpack(ctx, root, debs); err != nil {
			return Built{}, err
		}
	} else if err := image.MakeDirs(root, image.Dir{Name: "proc", Mode: 0o555}, image.Dir{Name: "sys", Mode: 0o555},
		image.Dir{Name: "dev", Mode: 0o755}, image.Dir{Name: "etc", Mode: 0o755}, image.Dir{Name: "tmp", Mode: 0o777 | fs.ModeSticky}); err != nil {
		return Built{}, err
	}
	if err := image.MakeDirs(root, s.Dirs...); err != nil {
		return Built{}, err
	}
	if err := addFiles(root, s.Files); err != nil {
		return Built{}, err
	}
	if err := addSymlinks(root, s.Symlinks); err != nil {
		return Built{}, err
	}
	if s.Busybox {
		if err := linkBusybox(ctx, root); err != nil {
			return Built{}, err
		}
	}
	layer, err := oci.BuildLayer(root, o.Epoch)
	if err != nil {
		return Built{}, err
	}
	name, tag, err := splitRef(s.Ref())
	if err != nil {
		return Built{}, err
	}
	var buf bytes.Buffer
	if _, err := oci.WriteArchive(&buf, oci.Image{
		Ref:          tag,
		Annotations:  map[string]string{"io.containerd.image.name": name + ":" + tag},
		OS:           "linux",
		Architecture: "amd64",
		Entrypoint:   s.Entrypoint,
		Cmd:          s.Cmd,
		Env:          append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, s.Env...),
		Labels:       map[string]string{"org.opencontainers.image.source": "kproxy test/cluster/images (make cluster)"},
		Created:      o.Epoch,
		Layers:       []oci.Layer{layer},
	}); err != nil {
		return Built{}, err
	}
	if err := writeAtomic(path, buf.Bytes()); err != nil {
		return Built{}, err
	}
	if err := writeAtomic(path+".key", []byte(k)); err != nil {
		return Built{}, err
	}
	o.Logf("image %s: %.1f MB in %v", s.Ref(), float64(buf.Len())/1e6, time.Since(start).Round(100*time.Millisecond))
	return Built{Spec: s, Path: path}, nil
}

// splitRef splits "registry/name:tag" at the tag's colon.
func splitRef(ref string) (string, string, error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return "", "", fmt.Errorf("image reference %q has no tag", ref)
	}
	return ref[:i], ref[i+1:], nil
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// inRoot maps an absolute image path to the host path under root.
func inRoot(root, p string) (string, error) {
	if !filepath.IsAbs(p) || strings.Contains(p, "..") {
		return "", fmt.Errorf("image path %q: want an absolute path without ..", p)
	}
	return filepath.Join(root, filepath.FromSlash(p)), nil
}

func addFiles(root string, files []File) error {
	for _, f := range files {
		dst, err := inRoot(root, f.Dst)
		if err != nil {
			return err
		}
		data := f.Data
		if f.Src != "" {
			if data, err = os.ReadFile(f.Src); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		_ = os.Remove(dst) // a package's file is replaced
		if err := os.WriteFile(dst, data, f.Mode); err != nil {
			return err
		}
		if err := os.Chmod(dst, f.Mode); err != nil {
			return err
		}
	}
	return nil
}

func addSymlinks(root string, links map[string]string) error {
	names := make([]string, 0, len(links))
	for l := range links {
		names = append(names, l)
	}
	sort.Strings(names)
	for _, l := range names {
		p, err := inRoot(root, l)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p)
		if err := os.Symlink(links[l], p); err != nil {
			return err
		}
	}
	return nil
}

// linkBusybox links each busybox applet that is not already a command of
// the image to /bin/busybox (busybox-static is static: the host runs it to
// list its applets).
func linkBusybox(ctx context.Context, root string) error {
	bb := filepath.Join(root, "bin", "busybox")
	out, err := exec.CommandContext(ctx, bb, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("%s --list-full: %w", bb, err)
	}
	have := map[string]bool{}
	for _, dir := range []string{"bin", "sbin", "usr/bin", "usr/sbin"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, e := range entries {
			have[e.Name()] = true
		}
	}
	for _, applet := range strings.Fields(string(out)) {
		if have[filepath.Base(applet)] {
			continue
		}
		p := filepath.Join(root, filepath.FromSlash(applet))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		have[filepath.Base(applet)] = true
	}
	return nil
}
