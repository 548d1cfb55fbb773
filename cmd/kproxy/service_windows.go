package main

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sys/windows/svc"
	"k8s.io/klog/v2"
)

// serviceName is the name kproxy reports to the Service Control Manager
// (a process running one service may use any name).
const serviceName = "kproxy"

// runMain is run, under the Windows Service Control Manager when
// --windows-service is given (for nodes that run kproxy as a Windows
// service rather than as a HostProcess DaemonSet).
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := runSubcommand(ctx, args, stdout, stderr); ok {
		return code
	}
	o, code, done := parseArgs(args, stdout, stderr)
	if done {
		return code
	}
	if !o.WindowsService {
		return runOptions(ctx, o, stdout, stderr)
	}
	h := &serviceHandler{run: func(ctx context.Context) int { return runOptions(ctx, o, stdout, stderr) }, parent: ctx}
	if err := svc.Run(serviceName, h); err != nil {
		_, _ = fmt.Fprintf(stderr, "kproxy: running as a Windows service: %v\n", err)
		return 1
	}
	return h.code
}

// serviceHandler runs kproxy until the SCM asks it to stop or shut down.
type serviceHandler struct {
	run    func(ctx context.Context) int
	parent context.Context
	code   int
}

// Execute implements svc.Handler.
func (h *serviceHandler) Execute(_ []string, requests <-chan svc.ChangeRequest, status chan<- svc.Status) (bool, uint32) {
	const accepted = svc.AcceptStop | svc.AcceptShutdown
	ctx, cancel := context.WithCancel(h.parent)
	defer cancel()
	status <- svc.Status{State: svc.StartPending}
	done := make(chan int, 1)
	go func() { done <- h.run(ctx) }()
	status <- svc.Status{State: svc.Running, Accepts: accepted}
	for {
		select {
		case h.code = <-done:
			status <- svc.Status{State: svc.StopPending}
			return false, uint32(h.code)
		case r := <-requests:
			switch r.Cmd {
			case svc.Interrogate:
				status <- r.CurrentStatus
			case svc.Stop, svc.Shutdown:
				klog.Background().Info("Stopping: asked by the Windows Service Control Manager", "command", r.Cmd)
				status <- svc.Status{State: svc.StopPending}
				cancel()
				h.code = <-done
				return false, uint32(h.code)
			}
		}
	}
}
