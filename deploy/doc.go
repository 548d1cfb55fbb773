// Package deploy holds kproxy's Kubernetes manifests, images and
// configuration (see docs/install.md); its only Go API is Decode, the
// manifest decoder its tests and the integration tests share. Its tests render
// the kustomizations, decode every manifest strictly, check the invariants
// the DaemonSets depend on, load the configuration files with kproxy's own
// loader, and check the RBAC rules against the API calls kproxy makes.
package deploy
