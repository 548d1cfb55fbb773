// Package e2e proves the Linux backend on a real kernel: it runs the kproxy
// binary inside node1's namespace of a netns.Cluster, feeds it manifests
// (kproxy --manifests DIR), and checks real TCP and UDP traffic against the
// shared behaviour table (test/proxytest) and the scenarios of issue 3:
// distribution, endpoint churn, UDP conntrack, restart, flushed chains,
// --cleanup and take-over from upstream kube-proxy.
//
// The tests run when KPROXY_KERNEL_TESTS=1 (make test-kernel) and need root,
// iproute2 and iptables; without them they skip, and under CI=true they
// fail. KPROXY_E2E_FLAVOUR=legacy runs them on iptables-legacy instead of
// iptables-nft: node1 gets a host firewall rule in that flavour, kproxy
// must follow it and leave the other flavour untouched. When the tests run
// with -race, kproxy is built with -race too, so a data race inside kproxy
// fails them. The helpers here (Proxy, Sentinel, WaitReady,
// WriteManifest) are also used by the demo (test/e2e/demo).
package e2e
