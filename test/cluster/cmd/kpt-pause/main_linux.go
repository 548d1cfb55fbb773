// Command kpt-pause is the pod sandbox ("pause") process of make cluster's
// nodes, in the image named registry.k8s.io/pause:3.10.2: it holds the pod's
// namespaces, reaps the zombies of a pod that shares its process namespace
// (it is then PID 1), and exits 0 on SIGINT or SIGTERM. Upstream's pause is a
// C program; this one does the same job without a C toolchain.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("kpt-pause (make cluster's pod sandbox)")
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
