package main

import (
	"context"

	"k8s.io/klog/v2"
)

// The Windows Service Control Manager's side of --windows-service, without
// its types (golang.org/x/sys/windows/svc builds on Windows only), so that
// the loop is tested on every OS; service_windows.go adapts svc's requests
// and statuses to it.

// serviceCommand is what the SCM asks of a running service, as far as
// kproxy cares.
type serviceCommand int

const (
	// serviceIgnored is any command kproxy does not accept (pause, ...).
	serviceIgnored serviceCommand = iota
	// serviceInterrogate asks for the current status again.
	serviceInterrogate
	// serviceStop is Stop or Shutdown: stop kproxy and report its exit code.
	serviceStop
)

// serviceState is a state the service reports to the SCM.
type serviceState int

const (
	serviceStartPending serviceState = iota
	serviceRunning
	serviceStopPending
)

// serviceLoop runs run (kproxy) as a service: it reports StartPending, then
// Running while run runs, answers interrogations, and on a stop request
// cancels run's context, reports StopPending and waits for run to return.
// When run returns by itself (an error, a changed config file), it reports
// StopPending too. It returns run's exit code. classify names each request;
// interrogate answers one; setState reports a state.
func serviceLoop[R any](parent context.Context, run func(context.Context) int, requests <-chan R,
	classify func(R) serviceCommand, interrogate func(R), setState func(serviceState)) int {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	setState(serviceStartPending)
	done := make(chan int, 1)
	go func() { done <- run(ctx) }()
	setState(serviceRunning)
	for {
		select {
		case code := <-done:
			setState(serviceStopPending)
			return code
		case r, ok := <-requests:
			if !ok {
				requests = nil // no more requests: wait for run
				continue
			}
			switch classify(r) {
			case serviceInterrogate:
				interrogate(r)
			case serviceStop:
				klog.Background().Info("Stopping: asked by the Windows Service Control Manager")
				setState(serviceStopPending)
				cancel()
				return <-done
			}
		}
	}
}
