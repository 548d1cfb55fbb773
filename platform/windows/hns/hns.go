package hns

// HNS is the narrow seam between the backend and the Host Networking Service.
// The Windows implementation (NewHNS, hns_windows.go) calls hcsshim's hcn
// package; FakeHNS implements it in memory with the same rules. Every error is
// an *Error carrying HNS's code and its Class.
//
// Methods are synchronous and may block for a while on a busy host (or hang
// when HNS does); the backend calls them from one goroutine, each bounded by
// Options.CallTimeout.
type HNS interface {
	// Version returns the HNS version, from which Capabilities derive.
	Version() (Version, error)
	// ListNetworks returns every network on the host.
	ListNetworks() ([]Network, error)
	// GetNetwork returns the network with this name (ClassNotFound if none).
	GetNetwork(name string) (*Network, error)
	// ListEndpoints returns the endpoints of a network.
	ListEndpoints(networkID string) ([]Endpoint, error)
	// CreateEndpoint creates an endpoint on a network and returns it with its ID.
	CreateEndpoint(networkID string, ep *Endpoint) (*Endpoint, error)
	// DeleteEndpoint deletes an endpoint (ClassNotFound if it does not exist).
	DeleteEndpoint(id string) error
	// ListLoadBalancers returns every load balancer on the host.
	ListLoadBalancers() ([]LoadBalancer, error)
	// CreateLoadBalancer creates a load balancer and returns it with its ID.
	CreateLoadBalancer(lb *LoadBalancer) (*LoadBalancer, error)
	// UpdateLoadBalancer replaces the settings of an existing load balancer
	// (ClassNotImplemented before HNS 15.4).
	UpdateLoadBalancer(id string, lb *LoadBalancer) (*LoadBalancer, error)
	// DeleteLoadBalancer deletes a load balancer (ClassNotFound if it does not exist).
	DeleteLoadBalancer(id string) error
}

// HNS operation names, used in errors, call counts and metrics.
const (
	OpVersion            = "Version"
	OpListNetworks       = "ListNetworks"
	OpGetNetwork         = "GetNetwork"
	OpListEndpoints      = "ListEndpoints"
	OpCreateEndpoint     = "CreateEndpoint"
	OpDeleteEndpoint     = "DeleteEndpoint"
	OpListLoadBalancers  = "ListLoadBalancers"
	OpCreateLoadBalancer = "CreateLoadBalancer"
	OpUpdateLoadBalancer = "UpdateLoadBalancer"
	OpDeleteLoadBalancer = "DeleteLoadBalancer"
)
