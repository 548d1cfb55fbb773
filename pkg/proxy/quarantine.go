package proxy

import (
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// QuarantinedPort is a service port a backend left out because the platform
// (the kernel, HNS) rejected what it takes to program it. Everything else is
// programmed; the backend retries the port with backoff and lifts the
// quarantine once the platform accepts it.
type QuarantinedPort struct {
	Name   ServicePortName
	Family v1.IPFamily
	// Reason is the platform's error, in words.
	Reason string
	// Since is when the port was first left out; Retry is when the backend
	// tries it again.
	Since, Retry time.Time
}

// Quarantiner is implemented by backends that isolate rejected service
// ports instead of failing the whole sync.
type Quarantiner interface {
	// Quarantined lists the service ports the last sync left out, sorted by
	// name then family.
	Quarantined() []QuarantinedPort
}

// SortQuarantined sorts ports by name, then family.
func SortQuarantined(ports []QuarantinedPort) {
	slices.SortFunc(ports, func(a, b QuarantinedPort) int {
		if c := strings.Compare(a.Name.String(), b.Name.String()); c != 0 {
			return c
		}
		return strings.Compare(string(a.Family), string(b.Family))
	})
}
