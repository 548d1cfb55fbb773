//go:build !windows

package source

import (
	"os"
	"syscall"
)

// openNonBlocking opens a file for reading without waiting for a writer
// when it is a named pipe.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
