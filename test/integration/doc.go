// Package integration runs kproxy against a real control plane: etcd and
// kube-apiserver built from Go modules (test/controlplane), running
// in a "control-plane" network namespace on the node network of a
// test/netns topology, and kproxy as a real process in node1's
// namespace, authenticated as ServiceAccount kube-system/kproxy and
// authorized only by the ClusterRole and ClusterRoleBinding in deploy/
// (read from the repository at run time, never copied):
//
//	lan bridge (node network 192.168.50.0/24, fd00:50::/64)
//	├── node1 .1    kproxy --kubeconfig (token of kube-system:kproxy)
//	│               /metrics 127.0.0.1:10249, /healthz /livez :10256
//	├── node2 .2
//	├── outside .100
//	└── control-plane .10   kube-apiserver 192.168.50.10:6443
//	                        etcd 127.0.0.1:2379 (in its namespace)
//
// The test process reaches the API server with sockets made inside the
// control-plane namespace and kproxy's HTTP servers with sockets made
// inside node1's (controlplane.NetnsDialer); nothing listens in the
// machine's own namespace.
//
// The untagged files are pure and build everywhere: the deploy/ RBAC and a
// rule evaluator (rbac.go), an audit log reader (audit.go), EndpointSlices
// written the way the EndpointSlice controller writes them (slices.go), and
// a Prometheus text reader (promtext.go). env_linux.go builds the
// environment used by the tests (make test-integration) and by the
// benchmark (make bench-cluster).
//
// The drop-in tests (dropin_linux_test.go) run upstream kube-proxy v1.37.2,
// built from Go modules by the same builder, in node1 with the same
// arguments as kproxy: a live swap in both directions under client load
// (TestDropInSwap) and the behaviour table's rows against both proxies
// (TestDifferential; a row kube-proxy answers differently must match a
// documented difference of test/differential, whose randomized
// differential runs on this package's environment too).
package integration
