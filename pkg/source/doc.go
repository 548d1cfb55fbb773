// Package source delivers Service, EndpointSlice and Node objects to a
// Handler, from the API server or from a manifest directory. Both sources run
// the same client-go machinery: one informer per kind, each over a
// cache.ListerWatcher, with the same list options, the same transform and the
// same event handlers. Only the ListerWatcher differs.
//
// # What is delivered
//
// Services and EndpointSlices are listed and watched with the label selector
// [ProxiedSelector], as upstream kube-proxy does: objects carrying the
// service.kubernetes.io/service-proxy-name label belong to another proxy, and
// slices labelled service.kubernetes.io/headless belong to headless Services.
// The Node informer watches only this node (field selector metadata.name).
//
// Headless Services (clusterIP None) and ExternalName Services are delivered
// like any other Service. The cache decides that they produce nothing; a
// source-side filter would have to turn "ClusterIP Service became
// ExternalName" into a synthetic delete, which the cache already gets right by
// seeing the update. Likewise EndpointSlices are delivered even when their
// Service is unknown or ignored: joining slices to Services is the cache's job.
//
// Services and EndpointSlices are not stored here (see lightInformer): the
// old object of an update or a delete is a stub that holds only the
// namespace, the name and, for an EndpointSlice, its Service label. They are
// never resynced; a relist (after a broken watch) delivers every object
// again, as updates, and a handler treats an update that changes nothing as
// a no-op. The Node comes from a shared informer, resynced every
// configSyncPeriod.
//
// # Memory
//
// The objects are parsed by the handler, not kept here. An informer
// transform strips, before they are queued, what the proxy
// never reads: managedFields, ownerReferences, finalizers, every annotation
// except endpoints.kubernetes.io/last-change-trigger-time on slices and the
// Service annotations the cache reads (cache.ServiceAnnotations), a Service's
// selector and status conditions, an endpoint's targetRef, hostname and
// deprecatedTopology, and everything in a Node's status except its addresses.
// Labels are kept (the cache needs kubernetes.io/service-name on slices and
// the topology labels on the Node).
//
// # Sync
//
// Handler.OnSynced is called exactly once, after the initial lists of
// Services and EndpointSlices have both been delivered to the handler. The
// Node is not awaited in API mode (upstream semantics: a missing or
// unreadable Node must not hold back programming). In manifest mode the
// initial Node list is awaited as well: it is read from the same directory
// scan and cannot fail, so a Node present in the directory at start reaches
// the handler before OnSynced (an absent one does not delay it).
//
// # API server
//
// [RunAPIServer] uses a client's list and watch calls. A call that fails
// because the API server is unreachable or restarting is retried with
// jittered exponential backoff (about 1 s doubling to 30 s, each delay drawn
// from [d/2, d)), honouring Retry-After; the source never gives up on its
// own. Watches resume from their resourceVersion after an outage when the
// cluster is still the same one (the UID of Service default/kubernetes);
// another cluster, an unreadable identity, a 410 Gone or a too-large
// resourceVersion makes the informers list again.
//
// # Manifest directory
//
// [RunManifests] serves the objects found in every *.yaml, *.yml and *.json
// file of one directory (not recursive; names starting with "." are ignored,
// which also skips editor swap files and the "..data" links of a mounted
// ConfigMap while following the links to its files).
//
//   - A YAML file holds one or more objects separated by "---" lines; a JSON
//     file holds one or more concatenated objects. Each object is a Service
//     (v1), an EndpointSlice (discovery.k8s.io/v1), a Node (v1), or a List
//     (v1 List, ServiceList, EndpointSliceList, NodeList) of those.
//   - Only regular files are read, or symbolic links to regular files:
//     a named pipe, a device, a socket or a link to one is reported once
//     (naming the file) and never opened for reading, so nothing can block
//     the poll; the file is also opened non-blocking and checked again, in
//     case it was replaced after the check. A file larger than 32 MiB
//     (maxManifestSize) is reported the same way and not read. In both
//     cases the objects the file defined before are kept.
//   - Object names are not checked here: the cache validates them for both
//     sources (see pkg/cache).
//   - A file that does not parse (YAML or JSON syntax, a field of the wrong
//     type, an unknown or duplicated field) is reported once per change with
//     the file name, the line when known and the reason; the objects it
//     defined before are kept until it parses again.
//   - A single bad object (unknown kind, wrong apiVersion, missing name, a
//     list inside a list) is skipped with a message naming the file and line;
//     the other objects of the file are served.
//   - Namespaced objects without a namespace go to "default"; a namespace on
//     a Node is dropped. When two files define the same object, the file
//     that sorts last by name wins and a warning names both files (within one
//     file, the later definition wins).
//   - The directory is read in full at start, then polled every 250ms with
//     one stat per file. A file whose size or timestamp changed is read at the next poll if they held
//     still (so a file caught between truncation and write is not served
//     empty), and re-parsed only if its content changed. A file modified
//     less than 2s before it was read is read again at later polls, so an
//     edit that keeps size and timestamp (coarse clocks) is still seen.
//     Edits and new files reach the handler within 250-750ms, deletions
//     within 250ms.
//   - Every change gets a new resourceVersion from one counter that only
//     increases, so informers see updates; unchanged objects keep theirs.
//     Watches honour label and field selectors (metadata.name,
//     metadata.namespace) like the API server, including the delete/add an
//     object's label change causes, and resume from a resourceVersion while
//     the recent history still holds it (otherwise they answer 410 Gone and
//     the reflector lists again).
//   - If the directory becomes unreadable while running, the error is
//     reported and the last objects are kept.
package source
