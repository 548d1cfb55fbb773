// Package proxytest is the platform-neutral behaviour table every kproxy
// backend must satisfy: "a client at X sends TCP or UDP to a Service address
// → one of these pods answers, seeing this source; or the client is refused at
// once; or nothing comes back".
//
// It is plain data and pure helpers, with no kernel or HNS code, so the same
// rows run against a real Linux kernel (test/e2e, in network
// namespaces) and against the Windows fake-HNS resolver (platform/windows).
// The Service and EndpointSlice objects of the table go through the shared
// cache (cache.Build, or kproxy's --manifests source) on every platform:
// endpoint selection is never re-derived by a runner.
//
// # Topology
//
// Default returns the fixed topology: node1 (where the proxy under test runs)
// and node2 on a "node network" (192.168.50.0/24, fd00:50::/64), pods on each
// node with IPv4 and IPv6 addresses from the node's pod CIDR, two client-only
// pods (client-1 on node1, client-2 on node2) and an outside client on the
// node network. Every pod runs an echo server on EchoPort (TCP and UDP) that
// answers with its own name and the client address it saw.
//
// # Cases and rows
//
// A Case is one semantic (ClusterIP, NodePort, externalTrafficPolicy Local,
// ...): a dual-stack Service built by Topology.Service from a unique index
// (which fixes its ClusterIPs, NodePort, externalIPs and LoadBalancer IPs),
// its EndpointSlices built by Topology.Slices, and the proxy Config it needs
// (--cluster-cidr, --masquerade-all, --nodeport-addresses). Cases never share names, indexes or
// addresses, so a runner may load every case of one Config at once.
//
// A Row is one probe of a case:
//
//	Name      "<case>/<from>-><target>/<protocol>/<family>", unique
//	Case      the objects (shared by the case's rows; read-only)
//	From      client host: client-1 (pod on node1), client-2 (pod on node2),
//	          node1 (the node itself), outside, or a backend pod (hairpin)
//	Protocol  TCP or UDP; each Service has one port of each (ServicePort)
//	Family    IPv4 or IPv6
//	Target    clusterip | nodeport (node1's IP) | localhost-nodeport
//	          (127.0.0.1, IPv4 only) | secondary-nodeport (node1's pod
//	          gateway address) | externalip | lbip; Row.Address resolves it
//	          to ip:port from the case's Service
//	Attempts  new connections to make, each from a fresh source port
//	Expect    Outcome answer | rejected | dropped; for answer, Backends (the
//	          pods that may answer every attempt), Source (client: not
//	          masqueraded; node: one of node1's addresses; any) and Sticky
//	          (all attempts reach one pod)
//	Unsupported  platform → reason; that platform's runner skips the row and
//	          reports the reason
//
// Most cases expand each probe over both families and both protocols.
// "Rejected" means refused at once (TCP RST, ICMP port unreachable); a runner
// should give answers a generous timeout and treat silence within a short
// bounded wait (about a second) as "dropped".
//
// A runner: for each Config in Table.Configs, start the proxy with that
// configuration on node1 with the objects of Table.Objects (or the YAML of
// Table.Manifest), then for each row of Table.RowsFor make Attempts
// connections, record one Observation per attempt and call Row.Check.
package proxytest
