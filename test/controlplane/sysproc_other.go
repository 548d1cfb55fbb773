//go:build !linux

package controlplane

import "syscall"

// sysProcAttr has nothing to add where there is no parent-death signal; Stop
// is then the only way servers end.
func sysProcAttr() *syscall.SysProcAttr { return nil }
