//go:build !kproxy_fault_ignore_etp

package source

import v1 "k8s.io/api/core/v1"

// faultService does nothing. A build with the tag kproxy_fault_ignore_etp
// (fault_ignore_etp.go) replaces it with a deliberate bug, for make
// conformance-fault: proof that upstream's e2e suite catches a proxy that
// ignores externalTrafficPolicy. Product builds never set the tag.
func faultService(*v1.Service) {}
