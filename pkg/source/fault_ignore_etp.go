//go:build kproxy_fault_ignore_etp

package source

import v1 "k8s.io/api/core/v1"

// faultService is a deliberate bug, built only with the tag
// kproxy_fault_ignore_etp (make conformance-fault, never a product build):
// every Service is seen with externalTrafficPolicy Cluster, as if the field
// were ignored, so external traffic goes to endpoints on any node, is
// masqueraded, and no health check node port is served.
func faultService(s *v1.Service) {
	if s.Spec.ExternalTrafficPolicy != "" {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	}
}
