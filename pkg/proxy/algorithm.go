package proxy

// AnnotationLoadBalancing is the Service annotation that picks the
// load-balancing algorithm of all its ports.
const AnnotationLoadBalancing = "kproxy.io/load-balancing"

// Algorithm is how a service port spreads new connections over its endpoints.
// The cache parses it once per Service from the kproxy.io/load-balancing
// annotation; every backend renders the same value. Session affinity
// (ClientIP), when set, wins over it (as IPVS persistence does): see
// ServicePort.EffectiveAlgorithm.
type Algorithm string

const (
	// AlgorithmRandom picks an endpoint at random for each new connection
	// (upstream kube-proxy's only choice in its iptables and nftables modes).
	AlgorithmRandom Algorithm = "random"
	// AlgorithmRoundRobin hands successive new connections to the endpoints
	// in turn, per node, across clients.
	AlgorithmRoundRobin Algorithm = "round-robin"
	// AlgorithmSourceHash sends each client address to one endpoint through a
	// consistent table that depends only on the endpoint set (the same on
	// every node and across restarts).
	AlgorithmSourceHash Algorithm = "source-hash"
	// AlgorithmLeastConnection prefers the endpoints with the fewest
	// established connections.
	AlgorithmLeastConnection Algorithm = "least-connection"
)

// Algorithms lists every algorithm, in display order.
var Algorithms = []Algorithm{AlgorithmRandom, AlgorithmRoundRobin, AlgorithmSourceHash, AlgorithmLeastConnection}

// ParseAlgorithm returns the algorithm named s and whether s names one.
// The empty string is random.
func ParseAlgorithm(s string) (Algorithm, bool) {
	if s == "" {
		return AlgorithmRandom, true
	}
	for _, a := range Algorithms {
		if string(a) == s {
			return a, true
		}
	}
	return AlgorithmRandom, false
}

// EffectiveAlgorithm is the algorithm the backends render for the port:
// random when the port has session affinity (the affinity rules pick the
// endpoint of a known client; a new client is placed at random, as before)
// or when no algorithm was set; otherwise Algorithm.
func (p *ServicePort) EffectiveAlgorithm() Algorithm {
	if p.AffinityTimeoutSeconds > 0 || p.Algorithm == "" {
		return AlgorithmRandom
	}
	return p.Algorithm
}
