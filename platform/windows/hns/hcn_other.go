//go:build !windows

package hns

// NewHNS returns the host's HNS. There is none on this operating system: it
// returns ErrUnsupportedPlatform. Dry runs (a Backend without HNS) work here.
func NewHNS() (HNS, error) { return nil, ErrUnsupportedPlatform }
