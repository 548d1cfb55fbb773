// Package nscluster is make netns-cluster: a local Kubernetes cluster in network
// namespaces, with kproxy as its Service proxy, that keeps running until
// make netns-cluster-down.
//
//	lan bridge (node network 192.168.50.0/24, fd00:50::/64)
//	├── control-plane .10  kube-apiserver :6443 + etcd (built from Go modules)
//	├── node1 .1           kproxy --proxy-mode iptables
//	│   └── pods pod-a1 pod-a2 client-1
//	├── node2 .2           kproxy --proxy-mode nftables
//	│   └── pods pod-b1 pod-b2 pod-b3 client-2
//	└── outside .100
//
// It is the integration tests' environment (test/integration:
// the control plane with self-made PKI, deploy/'s RBAC, the topology's
// Nodes; test/netns: the namespaces, with an echo server in every
// pod) owned by a long-running daemon instead of a test:
//
//   - Up (make netns-cluster) builds kproxy and kpt-echo into <dir>/bin, makes
//     sure the control-plane binaries and kubectl are built
//     (test/controlplane), starts the daemon in its own session with
//     its output in <dir>/cluster.log, prints that log until the daemon
//     says it is ready, then the KUBECONFIG and the commands to try.
//   - Run is the daemon: it builds the namespaces, starts the control plane
//     and a kproxy per node, writes <dir>/state.json, and tears everything
//     down on SIGTERM. Every process it starts dies with it (parent-death
//     signal), so a daemon killed with SIGKILL leaves only namespaces.
//   - Down (make netns-cluster-down) stops the daemon, deletes the cluster's
//     namespaces (also after a crash) and removes <dir>.
//   - Shell (make netns-shell POD=...) and Kubectl (<dir>/bin/kubectl) exec a
//     shell or kubectl inside a namespace of the cluster: the API server is
//     only reachable there.
//
// Nothing is created in, or listens in, the machine's own network namespace:
// namespaces are made and entered only through package netns, which refuses
// the initial one.
//
// No controller manager runs, and the pods are namespaces, not Pod objects,
// so a Service's EndpointSlice is written by hand: ExampleManifest
// (docs/examples/cluster/echo.yaml) carries one.
package nscluster
