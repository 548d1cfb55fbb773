package main

import (
	logsapi "k8s.io/component-base/logs/api/v1"
)

// applyLogging switches the process's logger to the configured format.
// The text format is klog's own (nothing to do); "json" is component-base's
// JSON logger, as in kube-proxy (--logging-format=json, logging.format).
// Validate has refused any other format, as upstream does.
func applyLogging(c *logsapi.LoggingConfiguration) error {
	if c.Format != "json" {
		return nil // text (or unset)
	}
	logsapi.SetRecommendedLoggingConfiguration(c) // fills what is unset (flush frequency)
	return logsapi.ValidateAndApply(c, nil)
}
