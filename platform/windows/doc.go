// Package windows is kproxy's Windows backend ("kernelspace" mode): it
// programs HNS (the Host Networking Service) load balancers and remote
// endpoints so that traffic to Service addresses reaches the endpoints the
// shared cache selected.
//
// # Shape
//
//	proxy.Snapshot ──▶ BuildPlan (pure) ──▶ Plan ──▶ Reconcile (pure) ──▶ []Op ──▶ apply ──▶ HNS
//	  + Facts (network type, remote      desired LBs    + State (record of       ordered     hcn (Windows)
//	    subnets, node IP, source VIP,    and endpoints    what exists in HNS)    calls       or FakeHNS
//	    DSR, HNS capabilities)           (no HNS IDs)
//
// Everything that decides (plan.go, planport.go, reconcile.go, state.go) is
// untagged and tested on Linux. Only hns_windows.go names package hcn; its
// partner hns_other.go makes NewHNS return ErrUnsupportedPlatform elsewhere,
// where a Backend without HNS can still DryRun. FakeHNS enforces HNS's rules
// in memory for tests.
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
// distribution, source VIP) the same; a field HNS leaves out is unknown,
// never a difference (echo.go). At start, HNS is listed once: matching load
// balancers are kept, differing ones updated or replaced, the rest deleted. Afterwards the backend works
// from its record: every CheckPeriod it checks cheaply (IDs only) that what
// it recorded still exists, and it lists HNS again every ResyncPeriod, after
// a failed sync and when the check finds something gone. Fields HNS may not
// return come from its record of what it sent or adopted (echo.go). What HNS refuses
// for good is isolated and retried with backoff (quarantine.go); every call
// is bounded by a timeout (timeout.go). One Backend handles one IP family; a
// dual-stack node runs two.
package windows
