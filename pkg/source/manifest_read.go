package source

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// maxManifestSize caps one manifest file (32 MiB). The API server stores
// objects of at most about 1.5 MiB; a file is a set of objects, and a
// directory of many files is the way to go beyond. A larger file is reported
// and skipped (its previous objects are kept), never read into memory.
const maxManifestSize = 32 << 20

// errNotRegular reports a manifest-named entry that is not a regular file
// (nor a symbolic link to one): a named pipe would block the reader for ever,
// a device could be endless, a socket cannot be read.
var errNotRegular = errors.New("not a regular file")

// checkManifestFile accepts the stat of a regular file (after following
// symbolic links) within maxManifestSize.
func checkManifestFile(fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w (mode %s): skipped", errNotRegular, fi.Mode().Type())
	}
	if fi.Size() > maxManifestSize {
		return fmt.Errorf("%d bytes, more than the %d-byte limit per manifest file: skipped", fi.Size(), maxManifestSize)
	}
	return nil
}

// readManifest reads a manifest file that checkManifestFile accepted. The
// file may have been replaced since: it is opened without blocking (a named
// pipe put in its place does not wait for a writer), checked again on the
// open descriptor, and read up to maxManifestSize.
func readManifest(path string) ([]byte, error) {
	f, err := openNonBlocking(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := checkManifestFile(fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxManifestSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxManifestSize {
		return nil, fmt.Errorf("more than the %d-byte limit per manifest file: skipped", maxManifestSize)
	}
	return data, nil
}
