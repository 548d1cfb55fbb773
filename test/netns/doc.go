// Package netns is the real-kernel test harness of the Linux backend: it
// builds a throwaway topology of network namespaces from a
// proxytest.Topology, runs echo servers in the pods, starts programs (kproxy)
// inside a node, and probes Service addresses from any host.
//
// Safety: every namespace is named "kpt-<pid>-<random>-<host>" and created
// with "ip netns add"; interfaces are created directly inside harness
// namespaces (veth peers are placed with "netns"), so nothing is ever added
// to the machine's own namespace. Every operation first checks that its
// target namespace is neither PID 1's nor this process's (device and inode
// of the nsfs file) and fails with ErrInitialNamespace otherwise. Addresses
// are private (10/8, 192.168/16, fd00::/8) and exist only inside the
// namespaces.
//
// Cleanup: New registers Close with t.Cleanup, so a failing test still
// removes its namespaces; processes are started from a dedicated thread with
// Pdeathsig, so they die with the test binary even if it crashes; and Setup
// first sweeps namespaces left by runs whose process is gone.
//
// Privileges: New and Require skip the test without root or without the
// tools (ip, and e.g. iptables for callers that need it); under CI=true they
// fail instead.
//
// The package builds on every OS (only this file and build.go are untagged);
// the harness itself is Linux-only.
package netns
