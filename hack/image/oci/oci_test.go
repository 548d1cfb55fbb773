package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

var epoch = time.Unix(1700000000, 0)

// fixture writes a fixed tree: files, a directory, a symbolic link, an
// executable and a file newer than the epoch (its mtime must be clamped).
func fixture(t *testing.T, mtime time.Time) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"usr/local/bin/kproxy": "#!binary\n",
		"etc/protocols":        "tcp 6 TCP\n",
		"usr/share/b":          "b\n",
		"usr/share/a":          "a\n",
	}
	for name, data := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "usr/local/bin/kproxy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" {
		if err := os.Symlink("kproxy", filepath.Join(root, "usr/local/bin/kube-proxy")); err != nil {
			t.Fatal(err)
		}
	}
	// Every path gets mtime (some after the epoch, some before).
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return err
		}
		return os.Chtimes(p, mtime, mtime)
	})
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func build(t *testing.T, root string) ([]byte, Result) {
	t.Helper()
	l, err := BuildLayer(root, epoch)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	res, err := WriteArchive(&buf, Image{
		Ref: "v1.2.3", OS: "linux", Architecture: "amd64",
		Entrypoint: []string{"/usr/local/bin/kproxy"},
		Labels:     map[string]string{AnnotationVersion: "v1.2.3"},
		Created:    epoch,
		Layers:     []Layer{l},
	})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), res
}

// TestReproducible: the same tree and epoch give the same archive bytes and
// manifest digest, twice from the same directory and once from a copy made
// later with other modification times (all after the epoch, hence clamped).
func TestReproducible(t *testing.T) {
	later := epoch.Add(48 * time.Hour)
	a1, r1 := build(t, fixture(t, later))
	a2, r2 := build(t, fixture(t, later.Add(time.Hour+time.Millisecond*300)))
	if r1.Manifest.Digest != r2.Manifest.Digest || !bytes.Equal(a1, a2) {
		t.Fatalf("two builds differ: %s vs %s", r1.Manifest.Digest, r2.Manifest.Digest)
	}
	// Another epoch, another digest (created and the clamped mtimes).
	l, err := BuildLayer(fixture(t, later), epoch.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	r3, err := WriteArchive(&buf, Image{Ref: "v1.2.3", OS: "linux", Architecture: "amd64", Created: epoch.Add(time.Second), Layers: []Layer{l}})
	if err != nil {
		t.Fatal(err)
	}
	if r3.Manifest.Digest == r1.Manifest.Digest {
		t.Errorf("another SOURCE_DATE_EPOCH gave the same digest %s", r1.Manifest.Digest)
	}
	// A changed file changes the digest.
	root := fixture(t, later)
	if err := os.WriteFile(filepath.Join(root, "usr/share/a"), []byte("A\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(root, "usr/share/a"), later, later); err != nil {
		t.Fatal(err)
	}
	if _, r4 := build(t, root); r4.Manifest.Digest == r1.Manifest.Digest {
		t.Errorf("a changed file gave the same digest")
	}
}

// TestLayerEntries: what the layer holds, entry by entry.
func TestLayerEntries(t *testing.T) {
	old := epoch.Add(-time.Hour)
	root := fixture(t, epoch.Add(time.Hour))
	if err := os.Chtimes(filepath.Join(root, "etc/protocols"), old, old); err != nil {
		t.Fatal(err)
	}
	l, err := BuildLayer(root, epoch)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(l.Blob))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header has mtime %v, name %q", zr.ModTime, zr.Name)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if Digest(raw) != l.DiffID {
		t.Errorf("diff_id %s, uncompressed digest %s", l.DiffID, Digest(raw))
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner %d:%d (%q:%q)", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s: atime %v ctime %v", h.Name, h.AccessTime, h.ChangeTime)
		}
		want := epoch
		if h.Name == "etc/protocols" {
			want = old
		}
		if !h.ModTime.Equal(want) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, want)
		}
		if h.Name == "usr/local/bin/kproxy" && h.Mode != 0o755 {
			t.Errorf("kproxy: mode %o", h.Mode)
		}
		if h.Name == "usr/local/bin/kube-proxy" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "kproxy") {
			t.Errorf("kube-proxy: type %c -> %q", h.Typeflag, h.Linkname)
		}
	}
	want := []string{"etc/", "etc/protocols", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/kproxy", "usr/local/bin/kube-proxy", "usr/share/", "usr/share/a", "usr/share/b"}
	if runtime.GOOS == "windows" {
		want = append(want[:6], want[7:]...)
	}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("entries\n %v\nwant\n %v", names, want)
	}
}

// TestArchiveRoundTrip: the archive's index names the tag, its manifest and
// config are what was asked, and the layer unpacks to the same files.
func TestArchiveRoundTrip(t *testing.T) {
	root := fixture(t, epoch)
	archive, res := build(t, root)
	tr := tar.NewReader(bytes.NewReader(archive))
	var idx Index
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "index.json" {
			if err := json.NewDecoder(tr).Decode(&idx); err != nil {
				t.Fatal(err)
			}
		}
		if !h.ModTime.Equal(epoch) || h.Uid != 0 {
			t.Errorf("%s: mtime %v uid %d", h.Name, h.ModTime, h.Uid)
		}
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations[AnnotationRefName] != "v1.2.3" || idx.Manifests[0].Digest != res.Manifest.Digest {
		t.Fatalf("index.json: %+v", idx)
	}
	man, cfg, layers, err := ReadArchive(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if man.Digest != res.Manifest.Digest {
		t.Errorf("read manifest %s, wrote %s", man.Digest, res.Manifest.Digest)
	}
	if cfg.Created != "2023-11-14T22:13:20Z" || cfg.OS != "linux" || cfg.Architecture != "amd64" ||
		strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/kproxy" || cfg.Config.Labels[AnnotationVersion] != "v1.2.3" {
		t.Errorf("config: %+v", cfg)
	}
	dst := t.TempDir()
	if err := ExtractLayer(layers[0], cfg.RootFS.DiffIDs[0], dst); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dst, "usr/local/bin/kproxy"))
	if err != nil || string(got) != "#!binary\n" {
		t.Errorf("kproxy: %q, %v", got, err)
	}
	if runtime.GOOS != "windows" {
		if l, err := os.Readlink(filepath.Join(dst, "usr/local/bin/kube-proxy")); err != nil || l != "kproxy" {
			t.Errorf("kube-proxy: %q, %v", l, err)
		}
	}
	// A wrong diff_id is caught.
	if err := ExtractLayer(layers[0], "sha256:00", t.TempDir()); err == nil || !strings.Contains(err.Error(), "diff_id") {
		t.Errorf("wrong diff_id: %v", err)
	}
	// A corrupted blob is caught by ReadArchive.
	bad := bytes.Replace(archive, layers[0][20:60], bytes.Repeat([]byte{'x'}, 40), 1)
	if _, _, _, err := ReadArchive(bytes.NewReader(bad)); err == nil {
		t.Error("corrupted layer blob read without error")
	}
}

// TestExtractRefusesEscapes: entries leaving the root, or going through a
// symbolic link, are refused.
func TestExtractRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []tar.Header
	}{
		{"dotdot", []tar.Header{{Name: "../evil", Typeflag: tar.TypeReg}}},
		{"absolute", []tar.Header{{Name: "/evil", Typeflag: tar.TypeReg}}},
		{"through-symlink", []tar.Header{{Name: "lib", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "lib/evil", Typeflag: tar.TypeReg}}},
		{"whiteout", []tar.Header{{Name: "etc/.wh.passwd", Typeflag: tar.TypeReg}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if runtime.GOOS == "windows" && tc.name == "through-symlink" {
				t.Skip("symbolic links need privileges on Windows")
			}
			var raw bytes.Buffer
			tw := tar.NewWriter(&raw)
			for _, h := range tc.entries {
				h.Mode = 0o644
				if err := tw.WriteHeader(&h); err != nil {
					t.Fatal(err)
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			_, _ = zw.Write(raw.Bytes())
			_ = zw.Close()
			err := ExtractLayer(gz.Bytes(), Digest(raw.Bytes()), t.TempDir())
			if err == nil {
				t.Fatal("extracted without error")
			}
			t.Log(err)
		})
	}
}
