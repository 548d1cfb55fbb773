//go:build !linux

package linux

func raiseHashsize(int) error { return errNotLinux }

func maxWritable() bool { return false }

// SetOOMScoreAdj sets the OOM score adjustment of the kproxy process (Linux only).
func SetOOMScoreAdj(int) error { return errNotLinux }
