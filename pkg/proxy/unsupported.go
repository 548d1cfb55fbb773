package proxy

import (
	"cmp"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Unsupported says that part of a Service is not programmed as asked: its
// input is invalid (an address of the wrong family, a port out of range:
// left out), or the platform cannot express it (HNS has no source ranges,
// the iptables cluster match has at most 32 slots). Every layer reports it
// the same way — the intent layer for invalid input, each renderer for what
// its platform lacks — and the app turns each into one log line, one
// Warning Event on the Service (once per Service and reason) and the
// kproxy_unsupported_service_ports gauge, on every OS.
type Unsupported struct {
	// Service is the Service concerned; Port names its port when the
	// problem is one port's ("" for the whole Service or an unnamed port).
	Service types.NamespacedName
	Port    string
	Family  v1.IPFamily
	// Reason is a short UpperCamelCase word (the Event's reason).
	Reason string
	// Message says what is not done and what happens instead, naming the
	// object's field.
	Message string
}

// Reasons shared by every platform.
const (
	// ReasonInvalidField: a field's value cannot be programmed (left out).
	ReasonInvalidField = "InvalidField"
	// ReasonInvalidServicePort: the service port cannot be programmed at
	// all (its ClusterIP, port or protocol is invalid).
	ReasonInvalidServicePort = "InvalidServicePort"
	// ReasonInvalidEndpoint: an endpoint's address or port cannot be
	// programmed (left out).
	ReasonInvalidEndpoint = "InvalidEndpoint"
)

// UnsupportedReporter is implemented by backends that leave out part of a
// Service: Unsupported lists what the last successful sync left out, for
// the app to report.
type UnsupportedReporter interface {
	Unsupported() []Unsupported
}

// SortUnsupported sorts by Service, port, family, reason, then message.
func SortUnsupported(us []Unsupported) {
	slices.SortFunc(us, func(a, b Unsupported) int {
		return cmp.Or(
			cmp.Compare(a.Service.Namespace, b.Service.Namespace),
			cmp.Compare(a.Service.Name, b.Service.Name),
			cmp.Compare(a.Port, b.Port),
			cmp.Compare(a.Family, b.Family),
			cmp.Compare(a.Reason, b.Reason),
			cmp.Compare(a.Message, b.Message),
		)
	})
}
