package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// BuildLayer makes a gzipped layer of everything under root (root itself
// is the layer's "/", not an entry): entries in lexical order (fs.WalkDir's),
// directories, regular files and symbolic links only (anything else is an
// error), owned by 0:0 with no user or group name, permission and
// setuid/setgid/sticky bits kept, modification times truncated to the
// second and clamped to epoch, no access or change times. Hard links are
// stored as separate copies.
func BuildLayer(root string, epoch time.Time) (Layer, error) {
	epoch = epoch.UTC().Truncate(time.Second)
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mt := fi.ModTime().UTC().Truncate(time.Second)
		if mt.After(epoch) {
			mt = epoch
		}
		h := &tar.Header{Name: name, Mode: tarMode(fi.Mode()), ModTime: mt, Format: tar.FormatPAX}
		switch {
		case fi.Mode().IsDir():
			h.Typeflag, h.Name = tar.TypeDir, name+"/"
		case fi.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, filepath.ToSlash(target)
		default:
			return fmt.Errorf("%s: unsupported file type %v", name, fi.Mode().Type())
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		n, err := io.Copy(tw, f)
		if err == nil && n != h.Size {
			err = fmt.Errorf("%s changed while read", name)
		}
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return Layer{}, fmt.Errorf("oci: layer of %s: %w", root, err)
	}
	diffID := Digest(raw.Bytes())
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if err != nil {
		return Layer{}, fmt.Errorf("oci: gzip: %w", err)
	}
	// No name, no modification time, OS "unknown": the header is the same
	// on every build.
	zw.OS = 255
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return Layer{}, fmt.Errorf("oci: gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return Layer{}, fmt.Errorf("oci: gzip: %w", err)
	}
	return Layer{Blob: gz.Bytes(), DiffID: diffID}, nil
}

func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// ExtractLayer unpacks a gzipped layer into dst (an existing directory),
// checking the uncompressed digest against diffID. It refuses entries that
// would land outside dst: absolute or ".." paths, and paths through a
// symbolic link the layer created. Whiteouts (".wh." entries) and file
// types other than directories, regular files, symbolic links and hard
// links are refused: the layers WriteArchive writes have none.
func ExtractLayer(blob []byte, diffID, dst string) error {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return fmt.Errorf("oci: layer: %w", err)
	}
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(zr, h))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("oci: layer: %w", err)
		}
		if err := extractEntry(tr, hdr, dst); err != nil {
			return fmt.Errorf("oci: layer: %s: %w", hdr.Name, err)
		}
	}
	// The tar reader stops at the end-of-archive blocks; the digest covers
	// the whole stream.
	if _, err := io.Copy(h, zr); err != nil {
		return fmt.Errorf("oci: layer: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return fmt.Errorf("oci: layer: diff_id %s, config says %s", got, diffID)
	}
	return nil
}

// safeJoin returns dst/name after checking that name stays inside dst and
// that no existing parent on the way is a symbolic link.
func safeJoin(dst, name string) (string, error) {
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errors.New("path leaves the root")
		}
	}
	clean := path.Clean("/" + name)
	if strings.HasPrefix(name, "/") || clean == "/" {
		return "", errors.New("absolute path or the root itself")
	}
	if strings.HasPrefix(path.Base(clean), ".wh.") {
		return "", errors.New("whiteouts are not supported")
	}
	parts := strings.Split(strings.TrimPrefix(clean, "/"), "/")
	cur := dst
	for _, p := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, p)
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return "", fmt.Errorf("parent %s is a symbolic link", cur)
		}
	}
	return filepath.Join(dst, filepath.FromSlash(clean)), nil
}

func extractEntry(r io.Reader, hdr *tar.Header, dst string) error {
	p, err := safeJoin(dst, hdr.Name)
	if err != nil {
		return err
	}
	mode := fs.FileMode(hdr.Mode & 0o777)
	if hdr.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if hdr.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(p, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return os.Chmod(p, mode)
	case tar.TypeReg:
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	case tar.TypeSymlink:
		return os.Symlink(hdr.Linkname, p)
	case tar.TypeLink:
		target, err := safeJoin(dst, hdr.Linkname)
		if err != nil {
			return err
		}
		return os.Link(target, p)
	}
	return fmt.Errorf("unsupported entry type %q", hdr.Typeflag)
}
