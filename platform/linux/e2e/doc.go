// Package e2e proves the Linux backend on a real kernel: it runs the kproxy
// binary inside node1's namespace of a netns.Cluster, feeds it manifests
// (kproxy --manifests DIR), and checks real TCP and UDP traffic against the
// shared behaviour table (pkg/proxytest) and the scenarios of issue 3:
// distribution, endpoint churn, UDP conntrack, restart, flushed chains,
// --cleanup and take-over from upstream kube-proxy.
//
// The tests need root, iproute2 and iptables; without them they skip, and
// under CI=true they fail. The helpers here (Proxy, Sentinel, WaitReady,
// WriteManifest) are also used by the demo (platform/linux/e2e/demo).
package e2e
