package controlplane

import "syscall"

// sysProcAttr makes the kernel kill a server when the thread that started it
// exits (startProcess keeps that thread alive until the server exits), so a
// crashed or killed test binary does not leave servers running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
