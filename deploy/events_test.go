package deploy

import "testing"

// eventCalls are the API calls of kproxy's event recorder.
//
// PENDING: kproxy's events ("Starting kproxy" on the Node, platform warnings
// on Services) are being added to pkg/app. Until they land, this declares
// the calls client-go's events.k8s.io/v1 recorder makes (create, and patch
// for a repeated event's series) instead of observing them; replace it with
// the recorder run against a fake clientset.
func eventCalls(t *testing.T) []apiCall {
	t.Helper()
	return []apiCall{
		{"create", "events.k8s.io", "events"},
		{"patch", "events.k8s.io", "events"},
	}
}
