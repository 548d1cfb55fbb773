// Package windows is kproxy's Windows backend ("kernelspace" mode): it
// programs HNS (the Host Networking Service) load balancers and remote
// endpoints so that traffic to Service addresses reaches the endpoints the
// shared cache selected.
//
// # Layers (one package per role)
//
//	hns/        the seam: HNS's schema as plain types, the HNS interface, classified
//	            errors, call timeouts and metrics; hcn_windows.go is the only file
//	            naming hcsshim's hcn (elsewhere NewHNS returns ErrUnsupportedPlatform)
//	fakehns/    an in-memory HNS enforcing HNS's rules and answering as a real one
//	            does (upper-case IDs, changed echoes, partial creations, restores)
//	plan/       pure: intents + node facts (+ the last plan) → desired load
//	            balancers and endpoints (no HNS IDs); Resolve, the model of HNS
//	reconcile/  pure: Observe (a listing → State), Adopt (listing, record, plan →
//	            record), Hold (quarantine), Reconcile (plan, state → ordered
//	            operations); and Apply, which runs them and returns the next record
//	check/      kproxy check-hns: objects programmed and read back, and traffic
//	windows     (this package) the driver: the sync protocol (sync.go), node
//	            facts, source VIP and network discovery, quarantine, dry run, explain
//
// One sync, for one family:
//
//	observe ──▶ facts ──▶ plan.Build ──▶ reconcile.Adopt ──▶ Hold ──▶ Reconcile ──▶ Apply ──▶ commit
//	(list, or   (node,     (pure)         (after a listing,    (pure)   (pure)        (HNS      (record = next;
//	 the record) network)                  pure)                                       calls)    warnings, quarantine)
//
// Nothing is recorded before the HNS call that made it true succeeded, and
// the warnings are published after apply. Everything that decides is
// untagged and tested on Linux; the Windows test binaries also run under
// Wine (make test-windows), with upstream's winkernel proxier as an oracle
// (test/winkernel).
//
// # Packet path on a Windows node
//
//	pod on this node ──▶ vSwitch port (VFP) ──▶ HNS load balancer matching
//	node itself ───────▶ host vNIC (VFP) ─────▶ protocol + frontend VIP + port
//	outside ───────────▶ external port ───────▶   (NodePort: any node address)
//	                                               │ DNAT to one endpoint
//	                                               ▼ (SourceIP distribution: per client)
//	                       local endpoint (pod on this node: the CNI's HNS endpoint)
//	                       remote endpoint (pod elsewhere: kproxy's HNS endpoint;
//	                         overlay: VXLAN to its ProviderAddress)
//
// ClusterIP load balancers rewrite only the destination; external ones
// (NodePort, externalIP, LoadBalancer ingress IP: port mapping flag
// VIPExternalIP) also rewrite the source to the node (or, on overlay, to the
// source VIP), except with DSR. A frontend whose endpoint set is empty has no
// load balancer (HNS rejects one): its traffic is dropped.
//
// # Ownership and record
//
// A load balancer found in HNS is adopted only if it is what is wanted:
// same slot (family, protocol, frontend VIPs, external port), internal port
// and sorted endpoint set, and every other field HNS says (flags,
// distribution, source VIP) the same, a field HNS leaves out being unknown,
// never a difference, and a field HNS returns changed being compared with
// its learned echo (reconcile/echo.go). At start, HNS is listed once:
// matching load balancers are kept, differing ones updated or replaced, the
// rest deleted (what may block a creation first). Afterwards the backend
// works from its record: every CheckPeriod it checks cheaply (IDs only)
// that what it recorded still exists, and it lists HNS again every
// ResyncPeriod, after a failed sync and when the check finds something
// gone. What HNS refuses is isolated, after one listing for a conflict, and
// retried with backoff (quarantine.go); every other operation still runs.
// Every call is bounded by a timeout (hns/timeout.go). One Backend handles
// one IP family; a dual-stack node runs two.
package windows
