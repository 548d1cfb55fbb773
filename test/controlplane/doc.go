// Package controlplane runs a real etcd and kube-apiserver for kproxy's
// integration tests.
//
// Both servers are built from Go modules by the wrapper modules under
// modules/ (each with its own go.mod, so kproxy's module never depends on
// k8s.io/kubernetes or etcd). EnsureBinaries builds them once into a cache
// directory keyed by version; Start runs them, normally inside a network
// namespace that the caller created, and waits until the API server is ready.
//
// Identities. The API server authenticates two static bearer tokens:
//
//   - Admin: user "kproxy-test-admin" in group "system:masters", for test setup.
//   - Kproxy: user "system:serviceaccount:kube-system:kproxy" in the groups a
//     real ServiceAccount token carries. RBAC matches ServiceAccount subjects by
//     that user name, so the ClusterRoleBinding from deploy/ (subject kind
//     ServiceAccount kube-system/kproxy) applies unchanged, while no token
//     controller or ServiceAccount object is needed.
//
// Reaching the servers. Start never listens in the caller's network namespace
// unless told to (Options.AllowCurrentNamespace). The processes run behind a
// command prefix such as NetnsExecPrefix("cp"); the caller reaches them with
// Options.Dial, for example NetnsDialer, which creates each socket inside the
// namespace from a locked OS thread and returns to the caller's namespace
// before the connection is used (a socket stays in the namespace it was made
// in, whichever thread uses it later).
//
// Authorization is RBAC only, and every request is written to an audit log at
// Metadata level, so tests can list every call an identity made
// (AuditRequests, ReadAudit) and assert that kproxy's was never denied
// (AuditDenials).
package controlplane
