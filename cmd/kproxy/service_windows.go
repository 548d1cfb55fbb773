package main

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sys/windows/svc"
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

// Execute implements svc.Handler with serviceLoop.
func (h *serviceHandler) Execute(_ []string, requests <-chan svc.ChangeRequest, status chan<- svc.Status) (bool, uint32) {
	h.code = serviceLoop(h.parent, h.run, requests, classifySCMRequest,
		func(r svc.ChangeRequest) { status <- r.CurrentStatus },
		func(s serviceState) { status <- scmStatus(s) })
	return false, uint32(h.code)
}

// classifySCMRequest names an SCM request for serviceLoop.
func classifySCMRequest(r svc.ChangeRequest) serviceCommand {
	switch r.Cmd {
	case svc.Interrogate:
		return serviceInterrogate
	case svc.Stop, svc.Shutdown:
		return serviceStop
	}
	return serviceIgnored
}

// scmStatus is the SCM status of a serviceLoop state: only a running
// kproxy accepts Stop and Shutdown.
func scmStatus(s serviceState) svc.Status {
	switch s {
	case serviceRunning:
		return svc.Status{State: svc.Running, Accepts: svc.AcceptStop | svc.AcceptShutdown}
	case serviceStopPending:
		return svc.Status{State: svc.StopPending}
	}
	return svc.Status{State: svc.StartPending}
}
