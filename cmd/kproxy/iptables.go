package main

import (
	"errors"
	"os/exec"

	"github.com/kproxy/kproxy/pkg/metrics"
)

// classifyIPTablesError names the cause of an iptables backend's sync
// error: a tool (iptables-restore, iptables-save) that ran and exited with
// an error status rejected what kproxy asked; other errors are left to
// metrics.Classify.
func classifyIPTablesError(err error) metrics.Cause {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return metrics.CauseRejected
	}
	return ""
}
