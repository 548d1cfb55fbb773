// Package differential compares kproxy with upstream kube-proxy v1.37.2 on
// random Services and EndpointSlices (issue 27): the oracle is upstream,
// not a hand-written expectation.
//
// Each seed draws a scenario (proxytest.RandomScenario: Service types,
// families, ports, traffic policies, affinity, endpoints in every
// condition on either node, split slices, port mismatches). The scenarios
// go through the integration suite's kube-apiserver (test/integration) on
// its namespace topology (test/netns); upstream kube-proxy, then kproxy,
// runs in node1 in the same mode with the same arguments, one at a time,
// and every frontend of every service port (Plan: the ClusterIP, the
// NodePort on node1's addresses and 127.0.0.1, externalIPs, LoadBalancer
// IPs) is probed from a pod on node1, node1 itself, the outside client and
// a pod on node2, plus a backend pod reaching its own ClusterIP.
//
// A probe makes attempts (Sampler) with sockets that ask for ICMP errors,
// so each attempt tells the endpoint that answered and the source address
// it saw, a refusal and how (TCP reset, which ICMP error, EPERM at send on
// the client's own host), or a timeout. Under session affinity, a probe
// from a pod or the outside client uses many client addresses (which
// endpoint one address sticks to is a draw; the set over many addresses
// is not). The distinct outcomes of a probe's attempts are its facets;
// kproxy's must equal upstream's, or the difference must match an entry
// of intentionalDifferences (a predicate over the case, mirrored in
// docs/compatibility.md).
//
// make test runs the fixed seeds (fixedSeeds); make test-differential
// SEEDS=N [MODE=iptables|nftables] runs N fresh ones, and SEED=a,b runs
// given ones again. A failing seed prints its differing probes and its
// manifests.
package differential
