package source

import "os"

// openNonBlocking opens a file for reading. Windows has no named pipes in
// the file system namespace of a directory (they live under \\.\pipe\), so
// a plain open cannot block on one.
func openNonBlocking(path string) (*os.File, error) {
	return os.Open(path)
}
